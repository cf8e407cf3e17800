#!/usr/bin/env bash
# The tiled attention (attention_tiled.cu's attn_tiled) on one GPU, in one call: the attention entries of the contract
# (the tiled form bit-equal to one-row calls, its control red), `exact --device cuda` on the bf16 and f32 fixtures, a
# drafted `generate` on the default pair against its plain one, `bench engine` on the default pair with every prompt
# of 2 rows or more tiled (concurrent replies against solo ones), then `bench forward` on LFM2.5-24B-A2B's shape at
# long prompts alternating A (KNOB: by default TENSORFOLD_CUDA_ATTN_TILE_ROWS=0, every call on attn_partial; PREV:
# the previous binary, carry/bin/prev.xz) and B (the default: segments of 16 rows or more tiled) in the order
# A B B A, whose token hashes must be equal; then, with EXTRA=1, one run with the tensor-core linears on (EXTRA=2 and
# KNOB=PREV: also one with the knob off, every call on attn_partial). Runs carry/bin/tensorfold.xz (`--features cuda,contract`); logs
# go to $OUT.
#
#   [KNOB=PREV] [EXTRA=1] tools/cuda/attn_tiles.sh [PROMPT_LENS]        default 2048,8192,32768
set -uo pipefail
cd "$(dirname "$0")/../.."
LENS=${1:-2048,8192,32768}
KNOB=${KNOB:-TENSORFOLD_CUDA_ATTN_TILE_ROWS=0}
. tools/cuda/env.sh /tmp/tensorfold-attn
echo "binary: $(cat carry/bin/COMMIT 2>/dev/null); previous: $(cat carry/bin/PREV 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
for entry in cuda.attention cuda.block_attention; do
    run "contract-$entry" 240 "$BIN" contract --backend cuda --only "$entry" --seed 20261205
    grep -E "^(PASS|FAIL)|^SUMMARY|invariance|control" "$OUT/contract-$entry.log" | cut -c1-160
done
for fx in tests/fixtures/lfm2-*/; do
    [ -f "$fx/reference.safetensors" ] || continue
    RUN_TAIL=2 run "exact-$(basename "$fx")" 120 "$BIN" exact --device cuda --model "$fx" --reference "$fx/reference.safetensors"
done
for d in "" --no-drafts; do
    RUN_TAIL=3 run "generate$d" 120 "$BIN" generate --device cuda --prompt 'def fibonacci(n):' --max-tokens 64 $d
done
TENSORFOLD_CUDA_ATTN_TILE_ROWS=2 RUN_TAIL=8 run engine-tiled 180 "$BIN" bench engine --device cuda --levels 1,8 \
    --tokens 64 --reps 1 --temperatures 0 --check 8
F="bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens $LENS --decode ${DECODE:-32}"
# shellcheck disable=SC2086 # F is a list of arguments
ab_runs f24 "$KNOB" $F
if [ "${EXTRA:-0}" -ge 1 ]; then
    # shellcheck disable=SC2086
    [ "$KNOB" = PREV ] && [ "${EXTRA:-0}" -ge 2 ] && ORDER=A1 ab_runs f24off TENSORFOLD_CUDA_ATTN_TILE_ROWS=0 $F
    # shellcheck disable=SC2086
    ORDER=A1 ab_runs f24tc TENSORFOLD_CUDA_TENSOR_CORES=1 $F
fi
printf '%s\n' "${summary[@]}"
