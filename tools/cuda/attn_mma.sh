#!/usr/bin/env bash
# Attention on the tensor cores (attention_mma.cu's attn_mma, the tensor-core mode) on one GPU, in one call: the
# contract's attention entries at served shapes (the tensor-core form against float64 and against one-row calls, its
# controls red; the CUDA-core entries too), `exact --device cuda` on every bf16/f32 fixture in the mode, the default
# pair drafted against plain in the mode, then `bench forward` on LFM2.5-24B-A2B's shape at long prompts with the
# tensor-core linears on, alternating A (TENSORFOLD_CUDA_ATTN_MMA=0: attention on the CUDA cores) and B (attention
# on the tensor cores) in the order A B B A; with NCU=1, Nsight Compute on two attn_mma launches of an 8,192-token
# prefill; with ENGINE=1, `bench engine` at 1, 64 and 256 streams in the mode, A B B A; then, with PREV=1 and
# carry/bin/prev.xz, the previous binary against this one in the default mode (A B B A). Runs
# carry/bin/tensorfold.xz (`--features cuda,contract`); logs go to $OUT; BUDGET (seconds) skips what would not fit.
#
#   [PREV=1] [NCU=1] [ENGINE=1] [CHECKS=0] [BUDGET=560] tools/cuda/attn_mma.sh [PROMPT_LENS]        default 2048,32768
set -uo pipefail
cd "$(dirname "$0")/../.."
LENS=${1:-2048,32768}
. tools/cuda/env.sh /tmp/tensorfold-attn-mma
echo "binary: $(cat carry/bin/COMMIT 2>/dev/null); previous: $(cat carry/bin/PREV 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
[ "${CHECKS:-1}" = 1 ] || LENS=  # CHECKS=0: no checks and no bench forward (NCU / ENGINE only)
for entry in $([ "${CHECKS:-1}" = 1 ] && echo cuda.attention_tc cuda.block_attention_tc cuda.attention); do
    run "contract-$entry" 200 "$BIN" contract --backend cuda --only "$entry" --seed 20261206
    grep -E "^(PASS|FAIL)|^SUMMARY|reference|invariance|edges|control" "$OUT/contract-$entry.log" | cut -c1-180
done
export TENSORFOLD_CUDA_TENSOR_CORES=1
for fx in $([ "${CHECKS:-1}" = 1 ] && echo tests/fixtures/lfm2-*/); do
    [ -f "$fx/reference.safetensors" ] || continue
    RUN_TAIL=2 run "exact-tc-$(basename "$fx")" 90 "$BIN" exact --device cuda --model "$fx" --reference "$fx/reference.safetensors"
done
if [ "${CHECKS:-1}" = 1 ]; then
    for d in "" --no-drafts; do
        RUN_TAIL=3 run "generate-tc$d" 90 "$BIN" generate --device cuda --prompt 'def fibonacci(n):' --max-tokens 64 $d
    done
fi
F="bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens $LENS --decode ${DECODE:-32}"
# shellcheck disable=SC2086 # F is a list of arguments
[ -n "$LENS" ] && [ "$(left)" -gt 200 ] && ab_runs f24tc TENSORFOLD_CUDA_ATTN_MMA=0 $F
NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ "${NCU:-0}" = 1 ] && [ -n "$NCU_BIN" ] && [ "$(left)" -gt 150 ]; then
    # 8,192 tokens in chunks of 2,048: 40 attn_mma launches; the last chunk's hold the most keys.
    run ncu-mma 140 env TENSORFOLD_CUDA_GRAPHS=0 "$NCU_BIN" --clock-control none -k regex:attn_mma --launch-skip 36 \
        --launch-count 2 --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats \
        "$BIN" bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens 8192 --decode 2
fi
if [ "${ENGINE:-0}" = 1 ] && [ "$(left)" -gt 150 ]; then
    E="bench engine --device cuda --model synthetic:lfm2.5-24b-a2b --levels ${LEVELS:-1,64,256} --tokens 64 --reps 1"
    # shellcheck disable=SC2086
    ab_runs e24tc TENSORFOLD_CUDA_ATTN_MMA=0 $E --temperatures 0 --check 4 --parallel 256
fi
unset TENSORFOLD_CUDA_TENSOR_CORES
if [ "${PREV:-0}" = 1 ] && [ "$(left)" -gt 200 ]; then
    # shellcheck disable=SC2086
    ab_runs f24prev PREV $F
fi
echo "left: $(left)s"
printf '%s\n' "${summary[@]}"
