#!/usr/bin/env bash
# The shared-rounds receipt: bench engine with one forward over all streams' rows against one forward per
# stream, alternated in one sitting, every concurrent reply's hash checked against its solo run first.
# Usage: tools/receipts/engine.sh [MODEL_DIR] [TOKENS] [REPS]    (JSON summaries in $OUT, default /tmp/engine-receipt)
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-/tmp/lfm2-8b-plan-512}
tokens=${2:-64}
reps=${3:-2}
out=${OUT:-/tmp/engine-receipt}
mkdir -p "$out"
cargo build --release -p tensorfold >/dev/null
echo "commit $(git rev-parse --short HEAD)  machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
run=0
for shared in true false true false; do
  run=$((run + 1))
  ./target/release/tensorfold bench engine --model "$model" --levels 1,4,8,16 --tokens "$tokens" --reps "$reps" \
    --temperatures 0,1 --shared-rounds "$shared" --json "$out/engine-$run-shared-$shared.json"
done
