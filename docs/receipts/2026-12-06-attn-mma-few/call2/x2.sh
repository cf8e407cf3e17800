#!/usr/bin/env bash
# Session 22, call 2: the split decode tile of attn_mma: contract on the device, exactness, A/B against the previous binary.
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name --format=csv > "$OUT/gpu.txt" 2>&1
run c-attn 200 "$BIN" contract --backend cuda --seed 20261206 --only cuda.attention_tc
run c-battn 120 "$BIN" contract --backend cuda --seed 20261206 --only cuda.block_attention_tc
for fx in lfm2-moe-bf16-fused lfm2-dense-bf16; do
  TENSORFOLD_CUDA_TENSOR_CORES=1 run "exact-$fx" 90 "$BIN" exact --device cuda --model tests/fixtures/$fx \
    --reference tests/fixtures/$fx/reference.safetensors
done
export TENSORFOLD_CUDA_TENSOR_CORES=1
ab_runs f512 PREV bench forward --device cuda --model $M --prompt-lens 512,8192 --decode 64
TENSORFOLD_CUDA_PROFILE=events timeout 150 "$BIN" bench forward --device cuda --model $M --prompt-lens 512 --decode 16 > "$OUT/prof-new.log" 2>&1
echo "-- prof rc=$?"; grep -A22 "5730 launches\|kernel profile (device time by events, 5" "$OUT/prof-new.log" | tail -22
run engine 150 "$BIN" bench engine --device cuda --model $M --levels 1,8 --tokens 32 --reps 1 --temperatures 0 --check 4
printf '%s\n' "${summary[@]}"
