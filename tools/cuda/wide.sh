#!/usr/bin/env bash
# The wide tiles on one GPU, in one call: the contract of every kernel at quick and served shapes, `exact` on every
# fixture, then `bench forward` on LFM2.5-24B-A2B's shape with A =
# TENSORFOLD_CUDA_WIDE_ROWS=0 (the warp kernels at every width) and B = the default, in the order A B B A (token hashes
# must agree: the two forms give the same bits), then per-kernel prefill profiles by device events at chunks of
# CHUNKS rows for A and B. Runs carry/bin/tensorfold.xz; logs go to $OUT. STEP=2 runs the second part instead: the
# quick contract, `bench forward` A B B A with 128 decoded tokens (the token hash of the earlier receipts), prefill
# of 32,768 tokens A and B, and profiles at chunks of 256 rows with A and with every call of 256 rows wide. STEP=3:
# the quick contract, the A B B A forward, 32,768 tokens B, and B's profiles at chunks of 256 and 512 (all wide).
#
#   tools/cuda/wide.sh            (STEP=1, the default)     STEP=2 tools/cuda/wide.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-wide
M=synthetic:lfm2.5-24b-a2b
A=TENSORFOLD_CUDA_WIDE_ROWS=0
if [ "${STEP:-1}" = 1 ]; then
    "$BIN" contract --backend cuda --quick --seed 20261201 >"$OUT/contract-quick.log" 2>&1
    echo "contract quick rc=$?"; grep -E "^SUMMARY|^FAIL|missed" "$OUT/contract-quick.log"
    timeout 200 "$BIN" contract --backend cuda --seed 20261201 >"$OUT/contract-served.log" 2>&1
    echo "contract served rc=$?"; grep -E "^SUMMARY|^FAIL|^  *FAIL|missed" "$OUT/contract-served.log"
    for fx in tests/fixtures/*/; do
        case "$(basename "$fx")" in dspark-*) continue ;; esac
        [ -f "$fx/reference.safetensors" ] || continue
        "$BIN" exact --device cuda --model "$fx" --reference "$fx/reference.safetensors" >>"$OUT/exact.log" 2>&1
        echo "exact $(basename "$fx") rc=$?"
    done
    ab_runs f24 "$A" bench forward --device cuda --model $M --prompt-lens 2048 --decode 32
    for c in ${CHUNKS:-128 512}; do
        for side in A B; do
            if [ $side = A ]; then k=$A; else k=TENSORFOLD_CUDA_PROFILE=events; fi
            env TENSORFOLD_CUDA_PROFILE=events $k "$BIN" bench forward --device cuda --model $M --prompt-lens 16 \
                --decode 2 --chunk "$c" >"$OUT/prof-$c-$side.log" 2>&1
            echo "-- profile chunk $c $side rc=$?"
            grep -A14 "^prefill of the" "$OUT/prof-$c-$side.log" | head -15
        done
    done
elif [ "$STEP" = 3 ]; then
    "$BIN" contract --backend cuda --quick --seed 20261203 >"$OUT/contract-quick.log" 2>&1
    echo "contract quick rc=$?"; grep -E "^SUMMARY|^FAIL|missed" "$OUT/contract-quick.log"
    ab_runs f24 "$A" bench forward --device cuda --model $M --prompt-lens 2048 --decode 128
    "$BIN" bench forward --device cuda --model $M --prompt-lens 32768 --decode 2 >"$OUT/p32k-B.log" 2>&1
    echo "-- 32k B rc=$?"; grep -E "exactness|prefill|peak" "$OUT/p32k-B.log"
    for c in 256 512; do
        env TENSORFOLD_CUDA_PROFILE=events TENSORFOLD_CUDA_WIDE_ROWS=$c "$BIN" bench forward --device cuda --model $M \
            --prompt-lens 16 --decode 2 --chunk $c >"$OUT/prof-$c-B.log" 2>&1
        echo "-- profile chunk $c B rc=$?"
        grep -A6 "^prefill of the" "$OUT/prof-$c-B.log" | head -7
    done
else
    "$BIN" contract --backend cuda --quick --seed 20261202 >"$OUT/contract-quick.log" 2>&1
    echo "contract quick rc=$?"; grep -E "^SUMMARY|^FAIL|missed" "$OUT/contract-quick.log"
    ab_runs f24 "$A" bench forward --device cuda --model $M --prompt-lens 2048 --decode 128
    for side in A B; do
        if [ $side = A ]; then k=$A; else k=TENSORFOLD_CUDA_GRAPHS=1; fi
        env $k "$BIN" bench forward --device cuda --model $M --prompt-lens 32768 --decode 2 >"$OUT/p32k-$side.log" 2>&1
        echo "-- 32k $side rc=$?"; grep -E "exactness|prefill|peak" "$OUT/p32k-$side.log"
    done
    for side in A B; do
        if [ $side = A ]; then k=$A; else k=TENSORFOLD_CUDA_WIDE_ROWS=256; fi
        env TENSORFOLD_CUDA_PROFILE=events $k "$BIN" bench forward --device cuda --model $M --prompt-lens 16 \
            --decode 2 --chunk 256 >"$OUT/prof-256-$side.log" 2>&1
        echo "-- profile chunk 256 $side rc=$?"
        grep -A8 "^prefill of the" "$OUT/prof-256-$side.log" | head -9
    done
fi
