#!/usr/bin/env bash
# Two builds of tinynn on one GPU machine, alternated: the base's wheels in .device/base (built from the commit to
# compare against) and the new ones in .device/whl (built by ../shared/device/prepare.sh, which setup.sh installs
# into /tmp/site). Round 0 tunes each build's matmuls (their autotune cache keys may differ: from the Dawn work on,
# the device name ends in " on wgpu-native"), then the builds alternate. Then an empty-cache first step
# (experiments/first_step.py) and PyTorch's reference.
#
#   git worktree add /tmp/base 01860d8 && pip wheel -q --no-deps -w .device/base /tmp/base/packages/tinynn-*
#   EXTRA_WHEELS="wgpudawn==0.32.0.4" bash ../shared/device/prepare.sh
#   device run, carry [".device"]:  bash experiments/device_ab.sh [configs] [seconds]   (default lesson,mid,big 520)
#
# Prints a line per bench run (step ms, host us per dispatch, dispatches, fallbacks, peak memory); $OUT/results.tgz
# keeps the JSON reports.
set -u
configs=${1:-lesson,mid,big}; budget=${2:-520}
source .device/setup.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/base .device/base/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
bench() {  # $1 = base|new, $2 = config, $3 = round
  local pp=/tmp/site; [ "$1" = base ] && pp=/tmp/base:/tmp/site
  PYTHONPATH=$pp timeout 200 python3 -c "import sys; from tinynn.cli import main; sys.exit(main())" \
    bench --device gpu --no-cpu --json --sizes "" --steps 30 --config apps/bench/$2.json > $OUT/$1-$2-$3.json 2> $OUT/$1-$2-$3.err
  python3 - "$OUT/$1-$2-$3.json" "$1 $2 round $3" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], "failed:", e); sys.exit()
def walk(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items(): yield from walk(v, f"{path}.{k}" if path else k)
    elif isinstance(x, list):
        for i, v in enumerate(x): yield from walk(v, f"{path}[{i}]")
    else: yield path, x
keep = [(k, v) for k, v in walk(report) if any(s in k for s in ("ms", "us_per", "dispatch", "fallback", "peak"))]
print(sys.argv[2], " ".join(f"{k}={v}" for k, v in keep))
PY
}
for c in ${configs//,/ }; do bench base $c 0; bench new $c 0; done
for r in 1 2; do for c in ${configs//,/ }; do bench new $c $r; bench base $c $r; done; done
left() { echo $(( budget - SECONDS )); }
[ $(left) -gt 60 ] && timeout $(( $(left) - 5 )) python3 experiments/first_step.py apps/bench/lesson.json --limit 60 \
  2>>$OUT/first_step.err | tee -a $OUT/first_step.jsonl
[ $(left) -gt 100 ] && timeout $(( $(left) - 5 )) python3 experiments/first_step.py apps/bench/lesson.json --tune-first \
  --limit 60 2>>$OUT/first_step.err | tee -a $OUT/first_step.jsonl
[ $(left) -gt 60 ] && timeout $(( $(left) - 5 )) python3 apps/bench/torch_reference.py --configs $configs --json $OUT/torch.json
cd $OUT && tar czf results.tgz *.json *.err *.jsonl 2>/dev/null; rm -f base-* new-*
