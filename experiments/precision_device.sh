#!/usr/bin/env bash
# One device call for BENCHMARKS.md's precision table: the tensor-core tests on Dawn, the tensor-core matmul on
# the step's long-K shapes, then each config's step in both matmul precisions and PyTorch's four modes.
#   EXTRA_WHEELS="wgpudawn==0.32.0.4" bash ../shared/device/prepare.sh (+ pytest, hypothesis wheels in .device/whl)
#   optional: a tuned cache in .device/cache/matmul-autotune.json;  carry [".device"]
#   bash experiments/precision_device.sh [configs] [seconds]
set -u
configs=${1:-lesson,mid,big}; budget=${2:-540}
source .device/setup.sh || exit 1
export TINYNN_WEBGPU=dawn TINYNN_CACHE_DIR=$OUT/cache
mkdir -p $OUT/cache && cp .device/cache/*.json $OUT/cache/ 2>/dev/null
left() { echo $(( budget - SECONDS )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 -m pytest -q -x -p no:cacheprovider packages/tinynn-gpu/tests/matmul/test_tensor_cores.py 2>&1 | tail -2
[ -n "${SHAPES:-}" ] && timeout 100 python3 experiments/tensor_matmul.py --shapes $SHAPES 2>&1 | grep TFLOP
bench() {  # $1 config, $2 precision
  TINYNN_MATMUL_PRECISION=$2 timeout $(( $(left) - 10 )) tinynn bench --device gpu --no-cpu --json --sizes "" --steps 30 \
    --config apps/bench/$1.json > $OUT/$1-$2.json 2> $OUT/$1-$2.err
  python3 - "$OUT/$1-$2.json" "$1 $2" <<'PY'
import json, sys
try:
    t = json.load(open(sys.argv[1]))["backends"]["gpu"]["train_step"]
    print(sys.argv[2], f"{t['ms_per_step']:.3f} ms, {t['dispatches_per_step']:.0f} dispatches, fallbacks {t.get('fallbacks')}, "
          f"peak {t.get('peak_memory_bytes', 0) / 2**30:.2f} GiB")
except Exception as e:
    print(sys.argv[2], "failed:", e)
PY
}
timeout $(( $(left) - 5 )) python3 apps/bench/torch_reference.py --configs $configs
for c in ${configs//,/ }; do for p in highest high; do [ $(left) -gt 30 ] && bench $c $p; done; done
[ $(left) -gt 60 ] && bench gpt2 highest
[ $(left) -gt 40 ] && timeout $(( $(left) - 3 )) python3 apps/bench/torch_reference.py --configs gpt2
[ $(left) -gt 60 ] && bench gpt2 high
cd $OUT && tar czf results.tgz *.json *.err cache 2>/dev/null; rm -f *.json *.err
