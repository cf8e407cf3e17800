#!/usr/bin/env bash
# An A/B of one measuring knob on one GPU, in one call: the CUDA check (contract and fixtures), then `bench forward`
# on LFM2.5-24B-A2B's shape alternating A (the knob set: TENSORFOLD_CUDA_UNFUSED=1 runs fused kernels as their parts,
# TENSORFOLD_CUDA_R1_ROWS=N sets the largest call that runs the one-row linears) and B (the default) runs of the same
# binary in the order A B B A (so a drift or a second-run effect weighs on both sides), each printing its token hash
# (which must not change), then B's per-kernel profile by device events (each kernel's own time, and the stream's idle
# time between launches). Runs carry/bin/tensorfold.gz or .xz (built with `--features cuda,contract`); logs go to $OUT.  With
# ENGINE=SHAPE, the runs are `bench engine` (LEVELS streams, default 1,4,8,16,64; TOKENS, default 256) on that
# synthetic shape instead (their reply hashes must not change either), and no profile. CHECK=0 skips the check,
# PROFILE=0 the profile, ORDER=B1 runs B once (env.sh's ab_runs).
#
# With KNOB=PREV, A is the previous binary (carry/bin/prev.xz, built from the commit in carry/bin/PREV): a commit
# against its parent in one sitting.
#
#   tools/cuda/ab.sh NAME=VALUE [DECODE]      e.g. TENSORFOLD_CUDA_R1_ROWS=0, TENSORFOLD_CUDA_UNFUSED=1, PREV
set -uo pipefail
cd "$(dirname "$0")/../.."
KNOB=${1:?the knob for A, e.g. TENSORFOLD_CUDA_R1_ROWS=0}
[[ $KNOB == *=* || $KNOB == PREV ]] || {
    echo "ab.sh: the knob is NAME=VALUE (e.g. TENSORFOLD_CUDA_UNFUSED=1) or PREV, got $KNOB" >&2
    exit 2
}
[[ $KNOB != PREV || -f carry/bin/prev.xz ]] || { echo "ab.sh: PREV needs carry/bin/prev.xz" >&2; exit 2; }
DECODE=${2:-128}
. tools/cuda/env.sh /tmp/tensorfold-ab
if [ "${CHECK:-1}" != 0 ]; then
    OUT=$OUT/check CHECK_SECONDS=${CHECK_SECONDS:-110} TENSORFOLD_BIN=$BIN bash tools/cuda/check.sh >/dev/null 2>&1
    echo "check rc=$?"
    grep -E "^SUMMARY|^ok|^FAIL|^TIMEOUT|^SKIPPED" "$OUT/check/cuda-check.log"
fi
F="bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens 2048 --decode $DECODE"
[ -n "${ENGINE:-}" ] && F="bench engine --device cuda --model synthetic:$ENGINE --levels ${LEVELS:-1,4,8,16,64}
    --tokens ${TOKENS:-256} --reps 1 --temperatures 0 --check 4"
# shellcheck disable=SC2086 # F is a list of arguments
ab_runs f24 "$KNOB" $F
[ -n "${ENGINE:-}" ] || [ "${PROFILE:-1}" = 0 ] && exit 0
TENSORFOLD_CUDA_PROFILE=events "$BIN" bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens 16 \
    --decode 16 >"$OUT/p24.log" 2>&1
echo "-- profile rc=$?"
grep -A24 "kernel profile" "$OUT/p24.log" | head -26
