export TEXTNET_CACHE=/tmp/tc PYTHONUNBUFFERED=1; . scripts/nvrtc-path.sh
b=./target/release/textnet
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
$b selftest > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"; grep -E "fail|W2 written|same bits|checks" $OUT/selftest.txt | tail -12
for round in 1 2; do for e in 1 2 4 8 16; do
  TEXTNET_W2_EVERY=$e $b bench text --single --json > $OUT/single_r${round}_e$e.json 2>&1
done; done
python3 - <<'PY'
import json,glob,os
out=os.environ['OUT']
for f in sorted(glob.glob(out+'/single_r*_e*.json')):
    try: j=json.load(open(f))
    except Exception as e: print(f, 'bad', open(f).read()[:300]); continue
    r=j['rows'][0]; k={x['kernel']:round(x['us_median'],3) for x in j['single_sample_kernels'] if 'kernel' in x}
    print(os.path.basename(f), j.get('w2_writeback_every'), round(r['us_per_step'],3), round(r['steps_per_s']), k)
PY
for i in 1 2; do $b bench quality --seed 1 --no-cpu --json --dump data/q1 > $OUT/quality_seed1_run$i.json 2>&1; grep -A3 '"gpu"' $OUT/quality_seed1_run$i.json | grep val_loss; done
$b bench --json > $OUT/bench.json 2>&1; python3 -c "
import json; j=json.load(open('$OUT/bench.json'))
for r in j['rows']: print(r['mode'], round(r['us_per_step'],3), round(r['samples_per_s']))"
