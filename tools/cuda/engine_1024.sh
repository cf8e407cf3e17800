#!/usr/bin/env bash
# Aggregate decode at 256 and 1,024 streams on the 24B shape with memory admission's device default (every stream in
# a lane at once), for the GPU machine: the tensor-core mode, the default mode, then a kernel profile of the
# tensor-core mode's 1,024-stream run (TENSORFOLD_CUDA_PROFILE=events, graphs off). Logs under $OUT.
#   [TOKENS=128] tools/cuda/engine_1024.sh
set -u
OUT=${OUT:-/tmp/engine-1024}
# shellcheck source=tools/cuda/env.sh
source "$(dirname "$0")/env.sh" "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
E="bench engine --device cuda --model synthetic:lfm2.5-24b-a2b --reps 1 --temperatures 0 --check 2"
show() { grep -E "memory admission|^ +[0-9]+ |^replies|equal:|device 0" "$1"; }
TENSORFOLD_CUDA_TENSOR_CORES=1 "$BIN" $E --levels 256,1024 --tokens "${TOKENS:-128}" >"$OUT/e-tc.log" 2>&1
echo "-- tensor cores rc=$?"; show "$OUT/e-tc.log"
"$BIN" $E --levels 256,1024 --tokens "${TOKENS:-128}" >"$OUT/e-cc.log" 2>&1
echo "-- default mode rc=$?"; show "$OUT/e-cc.log"
TENSORFOLD_CUDA_TENSOR_CORES=1 TENSORFOLD_CUDA_PROFILE=events "$BIN" $E --levels 1024 --tokens 64 >"$OUT/prof-tc.log" 2>&1
echo "-- profile rc=$?"; show "$OUT/prof-tc.log"; grep -A14 "concurrent run's kernels" "$OUT/prof-tc.log"
