#!/usr/bin/env bash
# Session 24, call 1: main at e1e9ca8+ (4dc112f / 50dc12a, attention helpers, never run on a GPU): the attention
# contract and exactness in the tensor-core mode, A B B A against 52d7741 (one-stream decode, TC mode), then Nsight
# Compute warp-state stats of the few-row tensor-core linears (linear_tcf1, moe_gateup_tcf1, moe_down_tcf1).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-540}
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
run c-attn 120 "$BIN" contract --backend cuda --seed 20261207 --only cuda.attention_tc
run c-battn 60 "$BIN" contract --backend cuda --seed 20261207 --only cuda.block_attention_tc
for fx in lfm2-moe-bf16-fused lfm2-dense-bf16; do
  TENSORFOLD_CUDA_TENSOR_CORES=1 run "exact-$fx" 60 "$BIN" exact --device cuda --model tests/fixtures/$fx \
    --reference tests/fixtures/$fx/reference.safetensors
done
export TENSORFOLD_CUDA_TENSOR_CORES=1
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 300 ] && ORDER="A1 B1"
ORDER=$ORDER ab_runs f512 PREV bench forward --device cuda --model $M --prompt-lens 512 --decode 64
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ "$(left)" -gt 90 ]; then
  TENSORFOLD_CUDA_GRAPHS=0 timeout $(( $(left) - 20 )) "$NCU" --clock-control none \
    -k "regex:linear_tcf1|moe_gateup_tcf1|moe_down_tcf1" --launch-skip 200 --launch-count 6 --set full \
    --import-source no -o "$OUT/lin" "$BIN" bench forward --device cuda --model $M --prompt-lens 16 --decode 4 \
    > "$OUT/lin-run.txt" 2>&1
  echo "-- ncu rc=$?"
  "$NCU" -i "$OUT/lin.ncu-rep" --print-details all > "$OUT/lin.txt" 2>&1
  grep -E "^  [a-z_0-9]+ \(|^    (Duration|Registers Per|Instructions Executed|Warp Cycles Per Issued|Stall No Inst|Stall Wait|Stall Long|Stall Barrier|Stall Short|Stall Math|Stall Not Sel|Stall MIO|Stall LG|Stall Branch|Stall Dispatch|Stall Selected|Achieved Occ|Block Size|Grid Size|DRAM Through)" "$OUT/lin.txt" | head -160
fi
printf '%s\n' "${summary[@]}"
