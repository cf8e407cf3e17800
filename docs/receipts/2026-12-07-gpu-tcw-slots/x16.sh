#!/usr/bin/env bash
# Session 26, call 2: the wide tensor-core forms' stage stores as 16-byte slots (B, ae2122e + dense_tcw.cu change)
# against 192662d's kernels (A; main's CUDA sources are unchanged since): the contract's tensor-core kernel, the MoE
# fixture's exactness, then prefill A B B A on the 24B shape (hashes first).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-560}
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
run exact-moe 60 "$BIN" exact --device cuda --model tests/fixtures/lfm2-moe-bf16-fused \
  --reference tests/fixtures/lfm2-moe-bf16-fused/reference.safetensors
RUN_TAIL=40 run c-tc 150 "$BIN" contract --backend cuda --quick --seed 20261209 --only cuda.tensor_cores
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 240 ] && ORDER="A1 B1"
ORDER=$ORDER ab_runs f PREV bench forward --device cuda --model $M --prompt-lens 512,2048,8192 --decode 16
printf '%s\n' "${summary[@]}"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
