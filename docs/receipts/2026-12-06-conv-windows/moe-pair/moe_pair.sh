#!/usr/bin/env bash
# The paired few-row MoE tiles (16 slots: an expert's weights read once where two 8-slot tiles read them twice), for
# the GPU machine (run from the repository root; logs under $OUT): the tensor-core contract entry at served shapes
# (bits of every width against one-row calls, planted controls), then the previous binary (carry/bin/prev.xz, its
# commit in carry/bin/PREV) against this one, A B B A, at LEVELS (256) streams in the tensor-core mode with a
# kernel profile of each concurrent run; every run checks its replies against solo runs first.
#   [LEVELS=256] [TOKENS=64] [BUDGET=560] tools/cuda/moe_pair.sh
set -u
OUT=${OUT:-/tmp/moe-pair}
# shellcheck source=tools/cuda/env.sh
source "$(dirname "$0")/env.sh" "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
RUN_TAIL=4 run contract-tc 200 "$BIN" contract --backend cuda --only cuda.tensor_cores --seed 20261206
grep -E "^(PASS|FAIL)|^SUMMARY|missed|control" "$OUT/contract-tc.log" | cut -c1-160 | head -20
export TENSORFOLD_CUDA_TENSOR_CORES=1
E="bench engine --device cuda --model synthetic:lfm2.5-24b-a2b --tokens ${TOKENS:-64} --reps 1 --temperatures 0"
# shellcheck disable=SC2086
ab_runs epair PREV $E --levels "${LEVELS:-256}" --check 4
# Kernel profiles (events; slower than the timed runs): which MoE tiles ran and their time, previous then this.
for run in A1 B1; do
    [ "$(left)" -lt 90 ] && break
    case $run in A*) b=$PREV_BIN ;; *) b=$BIN ;; esac
    # shellcheck disable=SC2086
    TENSORFOLD_CUDA_PROFILE=events "$b" $E --levels "${LEVELS:-256}" --check 1 >"$OUT/eprof-$run.log" 2>&1
    echo "-- profile $run rc=$?"; grep -E "moe_(gateup|down)_tc|equal:" "$OUT/eprof-$run.log" | head -6
done
printf '%s\n' "${summary[@]}"
