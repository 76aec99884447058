# Sourced by the device scripts: libnvrtc and libcublas (for `bench matmul`) may sit outside the loader's
# path (a toolkit's lib64 or PyTorch's wheels); add their folders to LD_LIBRARY_PATH.
for name in libnvrtc libcublas; do
  if ! ldconfig -p | grep -q "$name\.so"; then
    lib=$(find / -name "$name.so*" -not -path '/proc/*' 2>/dev/null | grep -v builtins | head -1)
    [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
