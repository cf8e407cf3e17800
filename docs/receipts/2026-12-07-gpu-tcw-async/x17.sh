#!/usr/bin/env bash
# Session 27, call 1: the wide tensor-core forms with weights by cp.async into two buffers, segment totals in shared
# memory and 2 blocks an SM for all four wide forms, the chunk loop rolled (B, working tree on 3ee2296) against 3ee2296 (A): the contract's
# tensor-core kernel, the MoE fixture's exactness, prefill A B B A on the 24B shape (hashes first), then ncu's
# occupancy and duration of the wide forms in both.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-560}
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
run exact-moe 60 "$BIN" exact --device cuda --model tests/fixtures/lfm2-moe-bf16-fused \
  --reference tests/fixtures/lfm2-moe-bf16-fused/reference.safetensors
RUN_TAIL=8 run c-tc 150 "$BIN" contract --backend cuda --quick --seed 20261210 --only cuda.tensor_cores
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 260 ] && ORDER="A1 B1"
ORDER=$ORDER ab_runs f PREV bench forward --device cuda --model $M --prompt-lens 512,2048,8192 --decode 16
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for side in B; do
  bin=$BIN; [ $side = A ] && bin=$PREV_BIN
  [ "$(left)" -gt 80 ] || break
  TENSORFOLD_CUDA_GRAPHS=0 timeout 70 "$NCU" --clock-control none -k "regex:linear_tcw|gateup_tcw|moe_down_tcw" \
    --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats -o "$OUT/wide-$side" \
    "$bin" bench forward --device cuda --model $M --prompt-lens 2048 --decode 1 > "$OUT/ncu-run-$side.txt" 2>&1
  "$NCU" -i "$OUT/wide-$side.ncu-rep" --print-details all > "$OUT/wide-$side.txt" 2>&1
  echo "-- ncu $side"
  grep -E "^  [a-z_0-9]+ \(|^    (Duration|Registers Per|Achieved Occ|Theoretical Occ|Dynamic Shared|Compute \(SM\)|Memory Through|Block Limit)" "$OUT/wide-$side.txt" | head -80
done
printf '%s\n' "${summary[@]}"
cd "$OUT" && rm -f ./*.ncu-rep && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
