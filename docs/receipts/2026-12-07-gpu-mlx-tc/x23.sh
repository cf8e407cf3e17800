#!/usr/bin/env bash
# Session 29, call 3: the wide tensor-core stage for MLX Q8 / Q4 matrices (B, this working tree) against 684fe32 (A:
# quantized prefill on the narrow form). Exactness first: every MLX fixture in the mode, two of them with the wide
# form from 16 rows (so whole, chunked and decode compare wide with few-row bits), and the contract's tensor-core
# case; then bf16 prefill A B (the wide form's code moved: its bits and speed must not).
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-570}
. tools/cuda/env.sh "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
for fx in tests/fixtures/mlx/*/; do
  [ -f "$fx/reference.safetensors" ] && [ -f "$fx/model.safetensors" ] || continue
  n=$(basename "$fx")
  RUN_TAIL=0 run exact-$n 60 "$BIN" exact --device cuda --model "$fx" --reference "$fx/reference.safetensors"
  echo "$n: $(grep -c '^PASS' "$OUT/exact-$n.log") passed; $(grep -h 'whole prefill vs reference' "$OUT/exact-$n.log")"
done
for n in lfm2-moe-bf16-q4g64 lfm2-dense-bf16-q8g64; do
  fx=tests/fixtures/mlx/$n
  TENSORFOLD_CUDA_WIDE_ROWS=16 RUN_TAIL=0 run exact-wide-$n 60 "$BIN" exact --device cuda --model "$fx" \
    --reference "$fx/reference.safetensors"
  echo "wide from 16 rows, $n: $(grep -c '^PASS' "$OUT/exact-wide-$n.log") passed; $(grep -h 'whole prefill vs reference' "$OUT/exact-wide-$n.log")"
done
RUN_TAIL=3 run c-tc 330 "$BIN" contract --backend cuda --quick --seed 20261208 --only cuda.tensor_cores
grep -oE "\[[0-9]+,[0-9]+\] Q[48] group [0-9]+: rel err [0-9.e-]+|hidden [0-9]+, [0-9]+ experts, q[48][^;]*" "$OUT/c-tc.log"
[ "$(left)" -gt 90 ] && ORDER="A1 B1" ab_runs fb PREV bench forward --device cuda --model synthetic:lfm2.5-24b-a2b \
  --prompt-lens 2048 --decode 16
printf '%s\n' "${summary[@]}"
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
