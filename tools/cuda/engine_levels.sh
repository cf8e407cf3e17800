#!/usr/bin/env bash
# Aggregate decode through the engine (`bench engine`) on the 24B shape, for the GPU machine (run from the
# repository root; logs under $OUT). Every run checks its concurrent replies against solo runs before any figure.
#   1. PREV=1: the previous binary (carry/bin/prev.xz, its commit in carry/bin/PREV) against this one, A B B A, in the
#      default mode at PREV_LEVELS (default 64,256): what the submission fix changes.
#   2. This binary at LEVELS (default 1,16,64,256,1024) in the default mode, then with TENSORFOLD_CUDA_TENSOR_CORES=1.
#
#   [PREV=1] [LEVELS=..] [PREV_LEVELS=..] [TOKENS=64] [BUDGET=560] tools/cuda/engine_levels.sh
set -u
OUT=${OUT:-/tmp/engine-levels}
# shellcheck source=tools/cuda/env.sh
source "$(dirname "$0")/env.sh" "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
E="bench engine --device cuda --model synthetic:lfm2.5-24b-a2b --tokens ${TOKENS:-64} --reps 1 --temperatures 0"
if [ "${PREV:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    ab_runs eprev PREV $E --levels "${PREV_LEVELS:-64,256}" --check 4
fi
# shellcheck disable=SC2086
ORDER=B1 ab_runs ecc none $E --levels "${LEVELS:-1,16,64,256,1024}" --check 4
export TENSORFOLD_CUDA_TENSOR_CORES=1
# shellcheck disable=SC2086
ORDER=B1 ab_runs etc none $E --levels "${LEVELS:-1,16,64,256,1024}" --check 4
echo "left: $(left)s"
printf '%s\n' "${summary[@]}"
