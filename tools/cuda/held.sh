#!/usr/bin/env bash
# Held drafts on one GPU, in one call: the quick contract of the kernels they use (`cuda.embed` with its `held ids`
# gate and control, `cuda.rows` with `concat`, `cuda.draw`), `exact` on every fixture, then `bench engine` on the
# default pair with every round drafted, A = TENSORFOLD_NO_HELD_DRAFTS=true (each block read before its verify) and
# B = held drafts, in the order A B B A: every concurrent reply must equal its solo run and the token hashes must
# agree across A and B. STEP=2 runs the whole contract (quick, then served shapes) instead. Runs carry/bin/tensorfold.xz;
# logs go to $OUT.
#
#   tools/cuda/held.sh            STEP=2 tools/cuda/held.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-held
if [ "${STEP:-1}" = 1 ]; then
    for k in cuda.embed cuda.rows cuda.draw; do
        "$BIN" contract --backend cuda --quick --seed 20261204 --only $k >"$OUT/contract-$k.log" 2>&1
        echo "contract $k rc=$?"; grep -E "^SUMMARY|^FAIL|held|concat|missed" "$OUT/contract-$k.log" | cut -c1-200
    done
    for fx in tests/fixtures/*/; do
        case "$(basename "$fx")" in dspark-*) continue ;; esac
        [ -f "$fx/reference.safetensors" ] || continue
        "$BIN" exact --device cuda --model "$fx" --reference "$fx/reference.safetensors" >>"$OUT/exact.log" 2>&1
        echo "exact $(basename "$fx") rc=$?"
    done
    ab_runs e8 TENSORFOLD_NO_HELD_DRAFTS=true bench engine --device cuda --max-draft 8 --no-round-guard \
        --levels 1,8 --tokens 128 --reps 2 --temperatures 0,1 --top-k 40 --top-p 0.95
    grep -h "held drafts" "$OUT"/e8-*.log
else
    "$BIN" contract --backend cuda --quick --seed 20261205 >"$OUT/contract-quick.log" 2>&1
    echo "contract quick rc=$?"; grep -E "^SUMMARY|^FAIL|missed" "$OUT/contract-quick.log"
    timeout 280 "$BIN" contract --backend cuda --seed 20261205 >"$OUT/contract-served.log" 2>&1
    echo "contract served rc=$?"; grep -E "^SUMMARY|^FAIL|^  *FAIL|missed" "$OUT/contract-served.log"
fi
