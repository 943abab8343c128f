#!/usr/bin/env bash
# One device call's measurements for the fused kernels (run from the repository root, $OUT set):
# bandwidth of the norm, AdamW and reductions on the big config, the three bench configs' steps with every
# kernel's GPU time, and the 4096^2 matmul variants.
set -u
X=experiments
export TINYNN_CACHE_DIR=$OUT/cache
python3 $X/bandwidth.py --config apps/bench/big.json 2>&1 | tee $OUT/bandwidth.txt | cut -c1-160
python3 $X/step_profile.py apps/bench/lesson.json apps/bench/mid.json apps/bench/big.json --steps 20 > $OUT/steps.txt 2>&1
grep -A14 "^==" $OUT/steps.txt | cut -c1-110
python3 $X/matmul_variants.py --sizes 4096 2>&1 | tee $OUT/variants.txt | cut -c1-100
