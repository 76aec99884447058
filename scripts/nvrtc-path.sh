# Sourced by the device scripts: libnvrtc may sit outside the loader's path (a toolkit's lib64 or
# PyTorch's wheel); add its folder to LD_LIBRARY_PATH.
if ! ldconfig -p | grep -q 'libnvrtc\.so'; then
  lib=$(find / -name 'libnvrtc.so*' -not -path '/proc/*' 2>/dev/null | grep -v builtins | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
