#!/usr/bin/env bash
# Session 23, call 1: ncu of the decode kernels of the tensor-core mode (attn_mma_few, linear_tcf1) and of the default
# mode's attn_partial; the spill-free attn_mma_few (36dcf42) through the contract; A B B A against d841678.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-540}
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_one() {  # NAME REGEX SKIP COUNT [env...]
  local name=$1 rx=$2 skip=$3 count=$4; shift 4
  env TENSORFOLD_CUDA_GRAPHS=0 "$@" timeout 110 "$NCU" --clock-control none -k "regex:$rx" --launch-skip $skip \
    --launch-count $count --set full --import-source no -o "$OUT/$name" "$BIN" bench forward --device cuda --model $M \
    --prompt-lens 16 --decode 8 > "$OUT/$name-run.txt" 2>&1
  echo "-- ncu $name rc=$?"
  "$NCU" -i "$OUT/$name.ncu-rep" --print-details all > "$OUT/$name.txt" 2>&1
  ncu_lines "$OUT/$name.txt"
  "$NCU" -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name-sass.csv" 2>&1; xz -9 "$OUT/$name-sass.csv"
  grep -iE "^  [a-z_0-9]+ \(|Duration|Registers Per|Achieved Occupancy|Cycles Per Issued|No Eligible|Issued Warp|Bank Conflicts|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Executed Ipc A" "$OUT/$name.txt" | head -70
}
ncu_one tc "attn_mma_few|linear_tcf1_bf16" 20 3 TENSORFOLD_CUDA_TENSOR_CORES=1
ncu_one cc "attn_partial" 20 1
RUST_LOG=info run flag 40 "$BIN" generate --device cuda --tensor-cores --prompt-ids 1,2 --max-tokens 4
run c-attn 150 "$BIN" contract --backend cuda --seed 20261206 --only cuda.attention_tc
export TENSORFOLD_CUDA_TENSOR_CORES=1
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 200 ] && ORDER="A1 B1"
[ "$(left)" -gt 90 ] && ORDER=$ORDER ab_runs f512 PREV bench forward --device cuda --model $M --prompt-lens 512,8192 --decode 64
printf '%s\n' "${summary[@]}"
