#!/usr/bin/env bash
# Session 22, call 6 (the device time left): attn_mma_few on its own entry: quick contract, then A B against main.
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name --format=csv > "$OUT/gpu.txt" 2>&1
run c-attn-quick 45 "$BIN" contract --backend cuda --quick --seed 20261206 --only cuda.attention_tc
export TENSORFOLD_CUDA_TENSOR_CORES=1
ORDER="A1 B1" ab_runs f512 PREV bench forward --device cuda --model $M --prompt-lens 512,8192 --decode 64
[ "$(left)" -gt 45 ] && ORDER="B2" ab_runs f512 PREV bench forward --device cuda --model $M --prompt-lens 512,8192 --decode 64
printf '%s\n' "${summary[@]}"
