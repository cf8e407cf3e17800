#!/usr/bin/env bash
# Session 27's sitting: the CPU kernels' own vector expf (B) against main before it (A, 04a465a): the default pair
# A B B A B A A B (prefill 512, 2,048, 4,000), then the 8B plan in bf16 A B B A (prefill 2,048 and 8,192).
#   TF_A, TF_B: the two binaries; OUT: where the logs go; MODELS: tools/receipts/cpu_decode_ab.sh's models folder.
set -uo pipefail
cd "$(dirname "$0")/../../.."
A=${TF_A:-/tmp/rbin/tf-main} B=${TF_B:-/tmp/rbin/tf-J} OUT=${OUT:-/tmp/s27-sit} MODELS=${MODELS:-/tmp/s25-ab/models}
mkdir -p "$OUT"
n=1
run() { # model-name side lens model-args...
    local m=$1 side=$2 lens=$3 bin=$A
    shift 3
    [ "$side" = B ] && bin=$B
    local f=$OUT/$m-$side-$n.txt
    { echo "uptime: $(uptime)"; "$bin" bench forward "$@" --prompt-lens "$lens" --decode 64 --threads 2
      echo "uptime: $(uptime)"; } >"$f" 2>&1
    echo "-- $m $side run $n"; grep -E "token_sha256|prefill|decode " "$f" | sed 's/exactness: //' | cut -c1-120
    n=$((n + 1))
}
for side in A B B A B A A B; do run default $side 512,2048,4000; done
for side in A B B A; do run 8b-bf16 $side 2048,8192 --model "$MODELS/8b-bf16"; done
echo SITTING-DONE
