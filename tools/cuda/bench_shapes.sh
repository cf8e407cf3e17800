#!/usr/bin/env bash
# Issue 7's benchmarks in one call on the GPU machine: synthetic checkpoints of LFM2.5-24B-A2B's and LFM2-8B-A1B's
# shapes (seeded random bf16 weights made in memory, `--model synthetic:SHAPE`): `bench forward` (exactness first,
# then prefill, one-stream decode, peak device memory, the bandwidth floor), `bench engine` (shared-round decode at
# 1..64 streams, replies checked against solo runs), a per-kernel profile of decode steps (device events), and transformers on the
# same 8B weights (`tensorfold synth` writes them). Runs the binary built with `--features cuda,contract`, stripped and gzip'd
# to carry/bin/tensorfold.gz. Logs go to $OUT; the last lines are a summary.
#
#   tools/cuda/bench_shapes.sh [STEPS]   STEPS: any of check f24 e24 p24 f8 e8 hf8 (default: all; check = tools/cuda/check.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-bench
STEPS=${1:-check f24 e24 p24 f8 e8 hf8}
RUN_TAIL=30
has() { [[ " $STEPS " == *" $1 "* ]]; }
echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader)" | tee "$OUT/host.log"
free -g | tee -a "$OUT/host.log"

has check && { OUT=$OUT/check CHECK_SECONDS=${CHECK_SECONDS:-100} TENSORFOLD_BIN=$BIN bash tools/cuda/check.sh >/dev/null 2>&1; summary+=("check rc=$?"); grep -E "^SUMMARY|^ok|^FAIL|^TIMEOUT|^SKIPPED" "$OUT/check/cuda-check.log"; }
M24=synthetic:lfm2.5-24b-a2b
M8=synthetic:lfm2-8b-a1b
LENS=${LENS:-2048,32768}
has f24 && run f24 240 "$BIN" bench forward --device cuda --model $M24 --prompt-lens $LENS --decode 128
has e24 && run e24 240 "$BIN" bench engine --device cuda --model $M24 --levels 1,4,8,16,64 --tokens 256 --reps 1 --temperatures 0 --check 4
has p24 && TENSORFOLD_CUDA_PROFILE=events run p24 120 "$BIN" bench forward --device cuda --model $M24 --prompt-lens 16 --decode 16
has f8 && run f8 150 "$BIN" bench forward --device cuda --model $M8 --prompt-lens ${LENS8:-2048} --decode 128
has e8 && run e8 120 "$BIN" bench engine --device cuda --model $M8 --levels 1,4,8,16,64 --tokens 256 --reps 1 --temperatures 0 --check 4
if has hf8; then
    run synth8 120 "$BIN" synth lfm2-8b-a1b --out /tmp/lfm2-8b-a1b-synthetic
    run hf8 170 python3 tools/peers/hf_bench.py --model /tmp/lfm2-8b-a1b-synthetic --device cuda --prompt-lens 2048 \
        --decode 256 --decode-prompt-len 48 --batches 1,4,8,16,64 --no-teacher-check
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
for f in f24 f8; do [ -f "$OUT/$f.log" ] && grep -E "exactness|prefill|decode|peak|floor|cuda graphs" "$OUT/$f.log"; done
for f in e24 e8; do [ -f "$OUT/$f.log" ] && grep -E "^ +[0-9]+ |equal:|cuda graphs" "$OUT/$f.log"; done
[ -f "$OUT/hf8.log" ] && grep -E "^(prefill|decode)" "$OUT/hf8.log"
