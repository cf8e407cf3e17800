#!/usr/bin/env bash
# Session 23, call 2: ncu of one decode attn_mma_few call (tensor-core mode), key sections printed.
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
TENSORFOLD_CUDA_GRAPHS=0 TENSORFOLD_CUDA_TENSOR_CORES=1 timeout 240 "$NCU" --clock-control none -k "regex:attn_mma_few" \
  --launch-skip 3 --launch-count 1 --set full --import-source no -o "$OUT/am" "$BIN" bench forward --device cuda \
  --model $M --prompt-lens 16 --decode 8 > "$OUT/am-run.txt" 2>&1
echo "-- ncu rc=$?"
"$NCU" -i "$OUT/am.ncu-rep" --print-details all > "$OUT/am.txt" 2>&1
grep -vE "^ +-+ +-+|^$" "$OUT/am.txt" | grep -vE "^    (OPT|INF|WRN) " | cut -c1-110 | head -170
