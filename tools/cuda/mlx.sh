#!/usr/bin/env bash
# MLX affine checkpoints on the GPU, for the device tool (tools/cuda/env.sh unpacks carry/bin/tensorfold.xz; logs
# under $OUT). STEP=1 (about 4 minutes): the quick CUDA contract (its Q4 linear, SwiGLU and embedding cases among
# the rest), `exact --device cuda` on every tests/fixtures/mlx fixture against mlx-lm's logits, and a drafted reply
# on the 4-bit default target equal to its plain one. STEP=2 (about 8 minutes): one sitting of A/B, A the 24B shape
# at 4 bits (synthetic:lfm2.5-24b-a2b-mlx4), B the same shape in bf16, order A B B A: bench forward (prefill 2,048
# tokens, 128 one-stream decode steps), then bench engine (aggregate decode at LEVELS, default 1,16,64,256) once a
# side, and the 8-bit shape once. Unset STEP runs both.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-mlx
A=synthetic:lfm2.5-24b-a2b-mlx4
B=synthetic:lfm2.5-24b-a2b
if [ "${STEP:-1}" = 1 ]; then
    "$BIN" contract --backend cuda --quick --seed 20261203 >"$OUT/contract-quick.log" 2>&1
    echo "contract quick rc=$?"
    grep -E "^SUMMARY|^FAIL|missed" "$OUT/contract-quick.log" | cut -c1-300
    for fx in tests/fixtures/mlx/*/; do
        "$BIN" exact --device cuda --model "$fx" --reference "$fx/reference.safetensors" >>"$OUT/exact-mlx.log" 2>&1
        echo "exact $(basename "$fx") rc=$?"
    done
    grep -E "max rel|tolerance|equal" "$OUT/exact-mlx.log" | sort | uniq -c | head -20
    gen() { "$BIN" generate --device cuda --model tests/fixtures/mlx/pycode-q4g64 --prompt 'def fibonacci(n):' \
        --max-tokens 64 "$@"; }
    gen >"$OUT/gen-q4-drafted.log" 2>&1
    gen --no-drafts >"$OUT/gen-q4-plain.log" 2>&1
    grep -H -E "token_sha256|^drafted" "$OUT"/gen-q4-*.log
fi
[ "${STEP:-2}" = 2 ] || exit 0
for run in ${ORDER:-A1 B1 B2 A2}; do
    case $run in A*) m=$A ;; B*) m=$B ;; esac
    "$BIN" bench forward --device cuda --model "$m" --prompt-lens 2048 --decode 128 >"$OUT/f24-$run.log" 2>&1
    echo "-- f24 $run ($m) rc=$?"
    grep -E "loaded|exactness|prefill|decode|floor|peak" "$OUT/f24-$run.log" | cut -c1-220
done
for side in A B; do
    case $side in A) m=$A ;; B) m=$B ;; esac
    "$BIN" bench engine --device cuda --model "$m" --levels "${LEVELS:-1,16,64,256}" --tokens 64 --reps 1 \
        --temperatures 0 --check 4 --parallel 256 >"$OUT/e24-$side.log" 2>&1
    echo "-- e24 $side ($m) rc=$?"
    grep -E "^ +[0-9]+ |^replies|equal:|device 0" "$OUT/e24-$side.log" | cut -c1-200
done
"$BIN" bench forward --device cuda --model synthetic:lfm2.5-24b-a2b-mlx8 --prompt-lens 2048 --decode 128 \
    >"$OUT/f24-mlx8.log" 2>&1
echo "-- f24 mlx8 rc=$?"
grep -E "exactness|prefill|decode|floor" "$OUT/f24-mlx8.log" | cut -c1-220
