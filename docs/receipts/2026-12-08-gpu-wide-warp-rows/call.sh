#!/usr/bin/env bash
# Session 32's landing call: the wide form of four warps, each 16 rows by 128 columns, compiled for two blocks an SM
# (B = 2f3f77c + wide-warp-rows.patch with TCW_BLOCKS 2) against 2f3f77c (A): the contract entry cuda.tensor_cores
# on B, exact on the MoE fixtures with the wide stage from 16 rows, drafted == plain with tensor cores, then prefill
# A B B A at 512, 2,048 and 8,192 tokens (hash each run) and, if time is left, 256 streams A B. Not run in session
# 32 (no device after the timing call). To run it later: carry/bin/tensorfold.xz = the commit to check (main),
# carry/bin/prev.xz = df26ac6 (the last commit before the wide form landed in cacd2d3), each built with
# `cargo build --release --no-default-features --features tensorfold/cuda,tensorfold/contract -p tensorfold`,
# stripped and `xz -T2 -6`; BUDGET=470 fits one 600 s call.
set -uo pipefail
BUDGET=${BUDGET:-470}
. tools/cuda/env.sh "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
M=synthetic:lfm2.5-24b-a2b
run contract-tc 200 "$BIN" contract --backend cuda --quick --seed 20261202 --only cuda.tensor_cores
grep -E "^SUMMARY|^FAIL|control|limits" "$OUT/contract-tc.log" | cut -c1-300
for fx in lfm2-moe-bf16-fused mlx/lfm2-moe-bf16-q4g64 mlx/lfm2-moe-bf16-q8g64 mlx/lfm2-dense-bf16-q8g64; do
  d=tests/fixtures/$fx; [ -d "$d" ] || continue
  RUN_TAIL=1 TENSORFOLD_CUDA_WIDE_ROWS=16 run "exact-${fx//\//-}" 60 "$BIN" exact --device cuda --model $d --reference $d/reference.safetensors
done
RUN_TAIL=3 run gen-drafted 40 "$BIN" generate --device cuda --prompt 'def fibonacci(n):' --max-tokens 64 --no-round-guard
RUN_TAIL=3 run gen-plain 40 "$BIN" generate --device cuda --prompt 'def fibonacci(n):' --max-tokens 64 --no-drafts
grep -h -E "token_sha256" "$OUT"/gen-*.log
for r in A1 B1 B2 A2; do
  case $r in A*) bin=$PREV_BIN ;; B*) bin=$BIN ;; esac
  [ "$(left)" -gt 60 ] || break
  timeout 100 "$bin" bench forward --device cuda --model $M --prompt-lens 512,2048,8192 --decode 16 > "$OUT/f-$r.log" 2>&1
  echo "-- f $r rc=$?"; grep -E "exactness|prefill|decode  " "$OUT/f-$r.log"
done
for r in A1 B1; do
  case $r in A*) bin=$PREV_BIN ;; B*) bin=$BIN ;; esac
  [ "$(left)" -gt 90 ] || break
  timeout 80 "$bin" bench engine --device cuda --model $M --levels 256 --tokens 32 --reps 1 --temperatures 0 --check 4 \
    --parallel 256 > "$OUT/e-$r.log" 2>&1
  echo "-- e $r rc=$?"; grep -E "^ +[0-9]+ |equal:|token_sha|replies" "$OUT/e-$r.log" | head -8
done
printf '%s\n' "${summary[@]}"
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
