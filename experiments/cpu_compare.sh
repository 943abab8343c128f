#!/usr/bin/env bash
# tinynn's NumPy backend against PyTorch on the CPU, back to back (experiments/cpu_compare.py says what and how):
# the lesson step on all cores, 2 and 1, generation at batch 1 and 16 on all cores and 2; one table at the end,
# in about 4 minutes. Run from the repository root; on the device machine it installs the wheels first:
#
#     bash experiments/cpu_compare.sh [--budget SECONDS] [--reps N]
set -u
if [ -f .device/setup.sh ]; then
    source .device/setup.sh || echo "setup.sh failed: running with the Python as it is"
fi
PY=$(command -v python3 || command -v python)
timeout -k 10 250 "$PY" experiments/cpu_compare.py --budget 225 "$@"
