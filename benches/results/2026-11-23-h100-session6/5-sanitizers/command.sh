export TEXTNET_CACHE=/tmp/tc; . scripts/nvrtc-path.sh; compute-sanitizer --tool memcheck ./target/release/textnet bench quality --samples 600 --no-cpu --json --dump /tmp/q
