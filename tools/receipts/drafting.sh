#!/usr/bin/env bash
# The drafting receipt on the CPU: bench engine on the embedded default pair (lfm2-moe-pycode and its DSpark
# drafter) with the held-out prompts, plain and drafted requests A/B alternated in each repetition, every
# reply's token hash checked against its solo run first (a mismatch fails the run).
#   1. the drafter alone at a fixed block of 8 and of 4 (copies and guards off): acceptance and what it buys;
#   2. the defaults a user gets (depth rule, context copies, guards on).
# Usage: tools/receipts/drafting.sh [TOKENS] [REPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=${1:-128}
reps=${2:-3}
cargo build --release -p tensorfold >/dev/null
bin=./target/release/tensorfold
prompts=tools/receipts/heldout_prompts.jsonl
echo "commit $(git rev-parse --short HEAD)  machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
common=(--levels 1,4,8,16 --tokens "$tokens" --reps "$reps" --temperatures 0,1 --prompts "$prompts")
for block in 8 4; do
  echo "== drafter alone, block $block (--verify fixed --no-round-guard --copy-min 0)"
  "$bin" bench engine "${common[@]}" --max-draft "$block" --verify fixed --no-round-guard --copy-min 0
done
echo "== defaults (--verify depth, guards on, context copies from 8 tokens)"
"$bin" bench engine "${common[@]}" --max-draft 8
