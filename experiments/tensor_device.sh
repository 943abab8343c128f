#!/usr/bin/env bash
# One device call for the tensor-core matmul (precision "high") on Dawn: its tests, its speed per shape against
# the float32 kernels, then the bench configs' steps in both precisions and PyTorch's reference.
#   EXTRA_WHEELS="wgpudawn==0.32.0.4 pytest hypothesis ..." bash ../shared/device/prepare.sh; carry [".device"]
#   bash experiments/tensor_device.sh [configs] [seconds]
set -u
configs=${1:-lesson,big}; budget=${2:-500}
source .device/setup.sh || exit 1
export TINYNN_WEBGPU=dawn TINYNN_CACHE_DIR=$OUT/cache
left() { echo $(( budget - SECONDS )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tinynn info --device gpu 2>&1 | grep -i "precision\|active\|webgpu"
timeout 240 python3 -m pytest -q -x -p no:cacheprovider packages/tinynn-gpu/tests/matmul/test_tensor_cores.py 2>&1 | tail -25
timeout 120 python3 experiments/high_precision_training.py --steps 500 2>&1 | grep -v "^tinynn-gpu: tuning"
timeout $(( $(left) / 2 )) python3 experiments/tensor_matmul.py ${SHAPES:+--shapes $SHAPES} 2>&1 | grep -v "^tinynn-gpu: tuning"
for c in ${configs//,/ }; do
  for p in highest high; do
    [ $(left) -gt 40 ] || break
    TINYNN_MATMUL_PRECISION=$p timeout $(( $(left) - 20 )) tinynn bench --device gpu --no-cpu --sizes "" --steps 30 \
      --config apps/bench/$c.json 2>&1 | grep -i "step\|ms\|precision" | head -4 | sed "s/^/$c $p: /"
  done
done
[ $(left) -gt 60 ] && timeout $(( $(left) - 5 )) python3 apps/bench/torch_reference.py --configs $configs
