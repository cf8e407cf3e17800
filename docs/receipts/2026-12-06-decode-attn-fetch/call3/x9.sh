#!/usr/bin/env bash
# Session 23, call 3: attn_mma_few with warp-owned loops and the one-round 16-byte stage: contract, exactness,
# A B B A against 7e4d380 (36dcf42's kernels), ncu of one decode attn_mma_few call, events profile, engine check.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-480}
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
run c-attn 120 "$BIN" contract --backend cuda --seed 20261206 --only cuda.attention_tc
run c-battn 60 "$BIN" contract --backend cuda --seed 20261206 --only cuda.block_attention_tc
for fx in lfm2-moe-bf16-fused lfm2-dense-bf16; do
  TENSORFOLD_CUDA_TENSOR_CORES=1 run "exact-$fx" 60 "$BIN" exact --device cuda --model tests/fixtures/$fx \
    --reference tests/fixtures/$fx/reference.safetensors
done
export TENSORFOLD_CUDA_TENSOR_CORES=1
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 260 ] && ORDER="A1 B1"
ORDER=$ORDER ab_runs f512 PREV bench forward --device cuda --model $M --prompt-lens 512,8192 --decode 64
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ "$(left)" -gt 80 ]; then
  TENSORFOLD_CUDA_GRAPHS=0 timeout $(( $(left) - 15 )) "$NCU" --clock-control none -k "regex:attn_mma_few" \
    --launch-skip 3 --launch-count 1 --set full --import-source no -o "$OUT/am" "$BIN" bench forward --device cuda \
    --model $M --prompt-lens 16 --decode 8 > "$OUT/am-run.txt" 2>&1
  echo "-- ncu rc=$?"
  "$NCU" -i "$OUT/am.ncu-rep" --print-details all > "$OUT/am.txt" 2>&1
  grep -E "^    (Duration|Elapsed Cycles|Registers Per|Instructions Executed|Warp Cycles Per Issued|Stall No Inst|Stall Wait|Stall Long|Stall Barrier|Stall Short)" "$OUT/am.txt"
fi
[ "$(left)" -gt 60 ] && run engine 60 "$BIN" bench engine --device cuda --model $M --levels 1,8 --tokens 32 --reps 1 --temperatures 0 --check 4
printf '%s\n' "${summary[@]}"
