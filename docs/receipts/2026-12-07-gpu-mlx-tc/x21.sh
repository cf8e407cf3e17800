#!/usr/bin/env bash
# Session 29, call 1: MLX Q8 / Q4 matrices on the tensor cores (B = 684fe32) against 63f3a3c (A, where the
# tensor-core mode ran them on the CUDA-core forms). Exactness first (every MLX fixture in the mode), then the 24B
# shape at 4 bits A B B A (bench forward), the engine A B, and bf16 A B (its bits must not move).
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
M4=synthetic:lfm2.5-24b-a2b-mlx4
ab_runs f4 PREV bench forward --device cuda --model $M4 --prompt-lens 2048 --decode 64
ORDER="A1 B1" ab_runs e4 PREV bench engine --device cuda --model $M4 --levels 1,16,64,256 --tokens 64 --reps 1 \
  --temperatures 0 --check 4 --parallel 256
[ "$(left)" -gt 90 ] && ORDER="A1 B1" ab_runs fb PREV bench forward --device cuda --model synthetic:lfm2.5-24b-a2b \
  --prompt-lens 2048 --decode 64
printf '%s\n' "${summary[@]}"
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
