#!/usr/bin/env bash
# Nsight Compute over a decode step's kernels on the GPU machine: each kernel's duration on the device (launch gaps
# excluded) and its DRAM throughput, a line each, from `bench forward` on LFM2.5-24B-A2B's shape with graphs off
# (ncu times kernels one by one; leave the clocks alone: --clock-control none). Runs carry/bin/tensorfold.xz like
# the other scripts here (env.sh); the full report goes to $OUT/ncu.txt. REGEX picks kernels by name (default:
# all); SKIP kernels of that match are passed over first, then COUNT are profiled. Check the grid column: since
# `bench forward` also runs a 512-token prompt, the default 420 lands in that prefill (grids of 64 row tiles) at
# 77893fc, not in a decode step; raise SKIP past it. SECTIONS adds ncu options (e.g. "--section WarpStateStats",
# or "--cache-control none": ncu flushes caches before each kernel by default, so a one-block kernel fetches its
# code cold and reads longer than it runs in a graph).
#
#   tools/cuda/ncu_step.sh [REGEX] [SKIP] [COUNT]      e.g. tools/cuda/ncu_step.sh 'moe_|attn' 160 16
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu_step.sh: no ncu on this machine" >&2; exit 2; }
# shellcheck disable=SC2086 # SECTIONS is a list of arguments
TENSORFOLD_CUDA_GRAPHS=0 timeout "${LIMIT:-200}" "$NCU" --clock-control none -k "regex:${1:-.}" \
    --launch-skip "${2:-420}" --launch-count "${3:-24}" --section SpeedOfLight ${SECTIONS:-} \
    "$BIN" bench forward --device cuda --model "${MODEL:-synthetic:lfm2.5-24b-a2b}" --prompt-lens 16 --decode 3 \
    >"$OUT/ncu.txt" 2>&1
rc=$?
echo "-- ncu rc=$rc"
ncu_lines "$OUT/ncu.txt"
exit $rc
