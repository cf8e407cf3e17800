#!/usr/bin/env bash
# The tensor-core forms (dense_tc.cu, TENSORFOLD_CUDA_TENSOR_CORES=1) on the GPU, for one call of the device tool
# (about 9 minutes): the contract entry cuda.tensor_cores (quick, then served shapes), `exact --device cuda` on every
# fixture with tensor cores on, a drafted reply equal to its plain one with them on, then A/B in one sitting
# (A: tensor cores on, B: off, order A B B A): bench forward (prefill 2,048 tokens, 128 decode steps) and bench
# engine (aggregate decode at 1, 64 and 256 streams) on the 24B shape, and a profile of a 512-row prefill. Logs under
# $OUT. Reads carry/bin/tensorfold(.gz) (tools/cuda/env.sh). STEP=1 runs the checks, STEP=2 the timings (one call
# each); unset, both. SERVED=0 skips the served-shape contract; ORDER="A1 B1" shortens the A/B runs (ab_runs);
# LEVELS sets the engine's levels; PROFILE_SIDES="A" profiles one side.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-tc
M=synthetic:lfm2.5-24b-a2b
TC=TENSORFOLD_CUDA_TENSOR_CORES=1
if [ "${STEP:-1}" = 1 ]; then
"$BIN" contract --backend cuda --quick --seed 20261202 --only cuda.tensor_cores >"$OUT/contract-tc-quick.log" 2>&1
echo "contract tc quick rc=$?"; grep -E "^SUMMARY|^FAIL|reference:|control|limits" "$OUT/contract-tc-quick.log" | cut -c1-400
[ "${SERVED:-1}" = 0 ] || timeout 150 "$BIN" contract --backend cuda --seed 20261202 --only cuda.tensor_cores >"$OUT/contract-tc-served.log" 2>&1
echo "contract tc served rc=$?"; grep -E "^SUMMARY|^FAIL|reference:|invariance:|control" "$OUT/contract-tc-served.log" | cut -c1-600
for fx in tests/fixtures/*/; do
    case "$(basename "$fx")" in dspark-*) continue ;; esac
    [ -f "$fx/reference.safetensors" ] || continue
    env $TC "$BIN" exact --device cuda --model "$fx" --reference "$fx/reference.safetensors" >>"$OUT/exact-tc.log" 2>&1
    echo "exact tc $(basename "$fx") rc=$?"
done
gen() { env $TC "$BIN" generate --device cuda --prompt 'def fibonacci(n):' --max-tokens 64 "$@"; }
gen --no-round-guard >"$OUT/gen-tc-drafted.log" 2>&1
gen --no-drafts >"$OUT/gen-tc-plain.log" 2>&1
grep -H -E "token_sha256|^drafted" "$OUT"/gen-tc-*.log
fi
[ "${STEP:-2}" = 2 ] || exit 0
ab_runs f24 "$TC" bench forward --device cuda --model $M --prompt-lens 2048 --decode 128
ab_runs e24 "$TC" bench engine --device cuda --model $M --levels "${LEVELS:-1,64,256}" --tokens 64 --reps 1 --temperatures 0 \
    --check 4 --parallel 256
for side in ${PROFILE_SIDES:-A B}; do
    if [ $side = A ]; then k=$TC; else k=TENSORFOLD_CUDA_TENSOR_CORES=0; fi
    env TENSORFOLD_CUDA_PROFILE=events $k "$BIN" bench forward --device cuda --model $M --prompt-lens 16 \
        --decode 2 --chunk 512 >"$OUT/prof-512-$side.log" 2>&1
    echo "-- profile chunk 512 $side rc=$?"
    grep -A40 "^prefill of the" "$OUT/prof-512-$side.log" | head -42
done
