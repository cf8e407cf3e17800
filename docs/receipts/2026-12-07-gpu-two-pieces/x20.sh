#!/usr/bin/env bash
# Session 28, call 3: what two activation pieces (hi, lo) instead of three would give the tensor-core linears
# (TENSORFOLD_CUDA_TC_PIECES, a measuring knob of this working tree on da14d80; attention keeps three): the
# fixtures' errors against their references with 2 and 3 pieces, the contract's tensor-core case at 2, then prefill
# A B B A (A = 3 pieces, B = 2; each run's decoded tokens checked against its own whole prefill).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-380}
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
for p in 3 2; do
  for fx in lfm2-moe-bf16-fused lfm2-dense-bf16; do
    TENSORFOLD_CUDA_TC_PIECES=$p RUN_TAIL=3 run exact-$fx-p$p 45 "$BIN" exact --device cuda --model tests/fixtures/$fx \
      --reference tests/fixtures/$fx/reference.safetensors
    grep -h "max rel err" "$OUT/exact-$fx-p$p.log" | head -3
  done
done
TENSORFOLD_CUDA_TC_PIECES=2 RUN_TAIL=6 run c-tc-p2 100 "$BIN" contract --backend cuda --quick --seed 20261212 --only cuda.tensor_cores
grep -iE "worst|ratio|bound|err" "$OUT/c-tc-p2.log" | head -12
export TENSORFOLD_CUDA_TC_PIECES=2
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 150 ] && ORDER="A1 B1"
ORDER=$ORDER ab_runs f TENSORFOLD_CUDA_TC_PIECES=3 bench forward --device cuda --model $M --prompt-lens 2048,8192 --decode 16
printf '%s\n' "${summary[@]}"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
