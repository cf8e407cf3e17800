#!/usr/bin/env bash
# Session 22, call 5 (trimmed x4): attn_mma_few on its own entry: contract, A/B against main, ncu of a decode call.
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name --format=csv > "$OUT/gpu.txt" 2>&1
run c-attn 130 "$BIN" contract --backend cuda --seed 20261206 --only cuda.attention_tc
export TENSORFOLD_CUDA_TENSOR_CORES=1
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 250 ] && ORDER="A1 B1"
[ "$(left)" -gt 90 ] && ORDER=$ORDER ab_runs f512 PREV bench forward --device cuda --model $M --prompt-lens 512,8192 --decode 64
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ "$(left)" -gt 60 ]; then
  TENSORFOLD_CUDA_GRAPHS=0 timeout $(( $(left) - 5 )) "$NCU" --clock-control none -k "regex:attn_mma" --launch-skip 60 \
    --launch-count 1 --set full --import-source no "$BIN" bench forward --device cuda --model $M --prompt-lens 16 \
    --decode 8 > "$OUT/ncu-am.txt" 2>&1
  echo "-- ncu rc=$?"; ncu_lines "$OUT/ncu-am.txt"
fi
printf '%s\n' "${summary[@]}"
