#!/usr/bin/env bash
# Session 29, call 4 (the same machine): speed of the wide quantized stage, A = 684fe32 (narrow form), B = this
# working tree: 4-bit prefill 2,048 A B B A, 8,192 A B, bf16 prefill B A (with call 3's A B, an A B B A), then 1,024
# streams at 4 bits A B (the experts' tiles go wide there).
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-570}
. tools/cuda/env.sh "$OUT"
export TENSORFOLD_CUDA_TENSOR_CORES=1
M4=synthetic:lfm2.5-24b-a2b-mlx4
ab_runs f4 PREV bench forward --device cuda --model $M4 --prompt-lens 2048 --decode 16
ORDER="A1 B1" ab_runs f8 PREV bench forward --device cuda --model $M4 --prompt-lens 8192 --decode 16
ORDER="B2 A2" ab_runs fb PREV bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens 2048 --decode 16
[ "$(left)" -gt 200 ] && ORDER="A1 B1" ab_runs e1024 PREV bench engine --device cuda --model $M4 --levels 1024 \
  --tokens 64 --reps 1 --temperatures 0 --check 2 --parallel 1024
printf '%s\n' "${summary[@]}"
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
