# Device call 4: selftest of the final tree, beside the GPU quality runs of seeds 88-260; then their
# PyTorch twins (4 processes, seeds interleaved) until the time runs out.
export TEXTNET_CACHE=/tmp/tc PYTHONUNBUFFERED=1; . scripts/nvrtc-path.sh
new=./target/release/textnet; R=/tmp/r; mkdir -p $R/seeds
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u >> $R/gpu.txt
$new selftest > $R/selftest.txt 2>&1 & st=$!
seq 88 260 | timeout 170 xargs -P 6 -I{} sh -c "$new bench quality --seed {} --no-cpu --json --dump data/quality-seed{} > $R/seeds/{}.json 2>&1"
echo "gpu seeds done: $(grep -l val_loss $R/seeds/*.json | wc -l) at ${SECONDS}s"
wait $st; echo "selftest rc=$? at ${SECONDS}s"; grep -E "failed|same bits|distinct" $R/selftest.txt
left=$((555 - SECONDS))
for k in 0 1 2 3; do
  dirs=$(for s in $(seq $((88 + k)) 4 260); do [ -f data/quality-seed$s/init.safetensors ] && echo data/quality-seed$s; done)
  timeout $left python3 benches/torch_baseline.py --quality $dirs > $R/seeds/torch-$k.jsonl 2> $R/seeds/torch-$k.log &
done; wait
echo "torch seeds done: $(cat $R/seeds/torch-*.jsonl | grep -c val_loss) at ${SECONDS}s"
python3 scripts/quality-seeds-summary.py --brief $R/seeds/[0-9]*.json $R/seeds/torch-*.jsonl
tar czf $OUT/r.tar.gz -C /tmp r
