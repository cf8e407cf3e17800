#!/usr/bin/env bash
# The drafting receipt on the H200 (one device call): the embedded default pair on the CUDA backend through
# bench engine, plain and drafted requests A/B alternated, every reply's token hash checked against its solo run
# on the same GPU first; then generate on the GPU and the CPU for the same prompt. Runs the binary built elsewhere
# with `cargo build --release --features cuda -p tensorfold`, stripped and gzip'd to carry/bin/tensorfold.gz.
# Usage: tools/receipts/drafting-cuda.sh [TOKENS] [REPS]    (output tee'd into $OUT/drafting-cuda.log)
set -uo pipefail
cd "$(dirname "$0")/../.."
tokens=${1:-128}
reps=${2:-2}
OUT=${OUT:-/tmp/tensorfold-drafting}
mkdir -p "$OUT"
log="$OUT/drafting-cuda.log"
for d in /usr/local/nvidia/lib /usr/local/nvidia/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH XDG_CACHE_HOME=/tmp/tensorfold-cache RUST_LOG=warn
bin=/tmp/tensorfold-bin
gzip -dc carry/bin/tensorfold.gz >"$bin" && chmod +x "$bin"
{
  echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(nproc) cores"
  prompts=tools/receipts/heldout_prompts.jsonl
  common=(--device cuda --levels 1,4,8,16 --tokens "$tokens" --reps "$reps" --temperatures 0,1 --prompts "$prompts")
  echo "== drafter alone, block 8 (--verify fixed --no-round-guard --copy-min 0)"
  timeout 200 "$bin" bench engine "${common[@]}" --max-draft 8 --verify fixed --no-round-guard --copy-min 0
  echo "== defaults (--verify depth, guards on, context copies from 8 tokens)"
  timeout 150 "$bin" bench engine "${common[@]}" --max-draft 8
  for dev in cuda cpu; do
    for flags in "--no-drafts" "--no-round-guard --copy-min 0 --verify fixed"; do
      echo "== generate --device $dev $flags"
      timeout 60 "$bin" generate --device "$dev" --prompt 'def fibonacci(n):' --max-tokens 256 --ignore-eos --seed 1 $flags 2>&1 >/dev/null | tail -4
    done
  done
} 2>&1 | tee "$log"
