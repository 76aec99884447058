# Device call 3: A/B single-sample (8fdad8e vs this tree), selftest, bench + PyTorch, train, quality seeds.
export TEXTNET_CACHE=/tmp/tc PYTHONUNBUFFERED=1; . scripts/nvrtc-path.sh
new=./target/release/textnet; old=data/diag/textnet-8fdad8e
R=/tmp/r; mkdir -p $R/ab $R/seeds
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv > $R/gpu.txt; date -u >> $R/gpu.txt
for r in 1 2 3; do for b in old new; do bin=$old; [ $b = new ] && bin=$new
  $bin bench text --single --json > $R/ab/$b-$r.json 2>&1; done; done
python3 - <<'PY'
import json,glob
for f in sorted(glob.glob('/tmp/r/ab/*.json')):
    j=json.load(open(f)); r=j['rows'][0]
    k={x['kernel']:round(x['us_median'],3) for x in j['single_sample_kernels'] if 'kernel' in x}
    print(f.split('/')[-1], round(r['us_per_step'],3), round(r['steps_per_s']), k)
PY
$new selftest > $R/selftest.txt 2>&1; echo "selftest rc=$?"; grep -E "failed|same bits" $R/selftest.txt
$new bench --json > $R/bench.json 2>&1; echo "bench rc=$?"
python3 benches/torch_baseline.py > $R/torch.json 2>&1; echo "torch rc=$?"
python3 -c "
import json; j=json.load(open('$R/bench.json')); t=json.load(open('$R/torch.json'))
for r in j['rows']: print('textnet', r['mode'], round(r['us_per_step'],3), round(r['samples_per_s']))
for r in t['rows']: print('torch', r['mode'], round(r['samples_per_s']))"
{ time $new train corpus/shakespeare.txt --out /tmp/textnet.safetensors 2>&1
  for c in "to be or" "my lord" "i pray you"; do $new predict --model /tmp/textnet.safetensors --context "$c"; done
} > $R/train.txt 2>&1; tail -24 $R/train.txt
seq ${SEED_FROM:-1} ${SEED_TO:-120} | timeout 120 xargs -P 6 -I{} sh -c "$new bench quality --seed {} --no-cpu --json --dump data/quality-seed{} > $R/seeds/{}.json 2>&1"
echo "gpu seeds done: $(grep -l val_loss $R/seeds/*.json | wc -l)"
for s in $(seq ${SEED_FROM:-1} ${SEED_TO:-120}); do [ -f data/quality-seed$s/init.safetensors ] && echo data/quality-seed$s; done > /tmp/dirs
split -n l/3 /tmp/dirs /tmp/dirs.
for f in /tmp/dirs.a?; do timeout 200 python3 benches/torch_baseline.py --quality $(cat $f) > $R/seeds/torch-${f##*.}.jsonl 2> $R/seeds/torch-${f##*.}.log & done; wait
echo "torch seeds done: $(cat $R/seeds/torch-*.jsonl | grep -c val_loss)"; tail -3 $R/seeds/torch-*.log
python3 scripts/quality-seeds-summary.py --brief $R/seeds/[0-9]*.json $R/seeds/torch-*.jsonl
tar czf $OUT/r.tar.gz -C /tmp r
