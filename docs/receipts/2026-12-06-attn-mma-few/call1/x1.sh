#!/usr/bin/env bash
# Session 22, call 1: few-row tensor-core form variants (TFX_DEFINES, experiment binary) and decode profiles.
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
F="bench forward --device cuda --model $M --prompt-lens 512 --decode 64"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
i=0
for v in base "-DTC_FEW_U1=8" "-DTC_FEW_U1=8 -DTC_FEW_U2=4" "-DTC_FEW_U1=6 -DTC_FEW_U2=3" base; do
  i=$((i+1)); d=$v; [ "$v" = base ] && d=
  TFX_DEFINES="$d" TENSORFOLD_CUDA_TENSOR_CORES=1 timeout 150 "$BIN" $F > "$OUT/u$i.log" 2>&1
  echo "-- u$i [$v] rc=$?"; grep -E "prefill|decode|token_sha|equal" "$OUT/u$i.log" | head -8
done
TENSORFOLD_CUDA_TENSOR_CORES=0 timeout 150 "$BIN" $F > "$OUT/cc.log" 2>&1
echo "-- cc rc=$?"; grep -E "prefill|decode|token_sha|equal" "$OUT/cc.log" | head -8
for mode in 1 0; do
  TENSORFOLD_CUDA_TENSOR_CORES=$mode TENSORFOLD_CUDA_PROFILE=events timeout 150 "$BIN" bench forward --device cuda --model $M \
    --prompt-lens 512 --decode 16 > "$OUT/prof-$mode.log" 2>&1
  echo "-- prof tc=$mode rc=$?"; grep -A40 "kernel profile" "$OUT/prof-$mode.log" | head -42
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
TENSORFOLD_CUDA_TENSOR_CORES=1 TENSORFOLD_CUDA_GRAPHS=0 timeout 200 "$NCU" --clock-control none --cache-control none \
  -k "regex:tcf|attn_mma|attn_combine" --launch-skip 240 --launch-count 24 --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  "$BIN" bench forward --device cuda --model $M --prompt-lens 16 --decode 3 > "$OUT/ncu.txt" 2>&1
echo "-- ncu rc=$?"; ncu_lines "$OUT/ncu.txt"
