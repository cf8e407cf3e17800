#!/usr/bin/env bash
# Session 30, call 1: the wide form's ring (B, wide2) against 8f6720a (A): the contract's tensor-core case on B,
# the MoE fixtures exact in the mode with the wide stage from 16 rows, then where a 2,048-token prefill goes (events
# profile, A and B), then prefill 2,048 A B B A (bf16) and A B (4-bit), each run's hash printed.
set -uo pipefail
BUDGET=${BUDGET:-560}
. tools/cuda/env.sh "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
M=synthetic:lfm2.5-24b-a2b
M4=synthetic:lfm2.5-24b-a2b-mlx4
RUN_TAIL=12 run c-tc 200 "$BIN" contract --backend cuda --quick --seed 20261210 --only cuda.tensor_cores
for fx in lfm2-moe-bf16-fused mlx/lfm2-moe-bf16-q4g64; do
  d=tests/fixtures/$fx; [ -d "$d" ] || continue
  RUN_TAIL=3 TENSORFOLD_CUDA_WIDE_ROWS=16 run "exact-${fx//\//-}" 120 "$BIN" exact --device cuda --model $d --reference $d/reference.safetensors
done
RUN_TAIL=40 TENSORFOLD_CUDA_PROFILE=events run profA 120 "$PREV_BIN" bench forward --device cuda --model $M --prompt-lens 2048 --decode 4
RUN_TAIL=40 TENSORFOLD_CUDA_PROFILE=events run profB 120 "$BIN" bench forward --device cuda --model $M --prompt-lens 2048 --decode 4
ab_runs f PREV bench forward --device cuda --model $M --prompt-lens 2048 --decode 16
[ "$(left)" -gt 100 ] && ORDER="A1 B1" ab_runs f4 PREV bench forward --device cuda --model $M4 --prompt-lens 2048 --decode 16
printf '%s\n' "${summary[@]}"
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
