#!/usr/bin/env bash
# A/B of the fused residual add + RMSNorm (`add_rmsnorm`) on one GPU, in one call: the CUDA check (contract and
# fixtures), then `bench forward` on LFM2.5-24B-A2B's shape alternating unfused (A: TENSORFOLD_CUDA_UNFUSED=1) and
# fused (B) runs of the same binary, each printing its token hash (which must not change), then a fused per-kernel
# profile. Runs carry/bin/tensorfold.gz (built with `--features cuda`); logs go to $OUT.
#
#   tools/cuda/fused_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-ab
OUT=$OUT/check CHECK_SECONDS=${CHECK_SECONDS:-110} TENSORFOLD_BIN=$BIN bash tools/cuda/check.sh >/dev/null 2>&1
echo "check rc=$?"
grep -E "^SUMMARY|^ok|^FAIL|^TIMEOUT|^SKIPPED" "$OUT/check/cuda-check.log"
F="bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens 2048 --decode 128"
for run in A1 B1 A2 B2; do
    case $run in
        A*) env TENSORFOLD_CUDA_UNFUSED=1 "$BIN" $F >"$OUT/f24-$run.log" 2>&1 ;;
        B*) "$BIN" $F >"$OUT/f24-$run.log" 2>&1 ;;
    esac
    echo "-- $run rc=$?"
    grep -E "exactness|prefill|decode|floor" "$OUT/f24-$run.log"
done
TENSORFOLD_CUDA_PROFILE=1 "$BIN" bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens 16 \
    --decode 16 >"$OUT/p24.log" 2>&1
echo "-- profile rc=$?"
head -24 "$OUT/p24.log" | grep -A22 "kernel profile"
