#!/usr/bin/env bash
# Session 28: the draw's whole-vocabulary passes (B) against bf77979 (A) on the default pair, A B B A, one stream
# and 16, greedy and temperature 1, top-p off and 0.95.
set -euo pipefail
cd "$(dirname "$0")"
for run in A1 B1 B2 A2; do
  bin=/tmp/rbin/${run:0:1}
  "$bin" bench engine --levels 1,16 --tokens 256 --reps 3 --temperatures 0,1 --check 2 --json e-$run.json > e-$run.log 2>&1
  "$bin" bench engine --levels 1,16 --tokens 256 --reps 3 --temperatures 1 --top-p 0.95 --check 2 --json p-$run.json > p-$run.log 2>&1
  echo "== $run"; grep -E "^ +(1|16) |^replies" e-$run.log p-$run.log | sed 's/^[a-z0-9-]*\.log://'
done
