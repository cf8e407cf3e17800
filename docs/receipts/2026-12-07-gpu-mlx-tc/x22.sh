#!/usr/bin/env bash
# Session 29, call 2 (the same machine, its kernel cache warm): the contract's tensor-core case on the GPU (bf16, Q8
# and Q4 forms: references, invariance at every width, the planted controls), then bf16 one-stream decode A B B A and 4-bit prefill at 8,192 A B.
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-570}
. tools/cuda/env.sh "$OUT"
RUN_TAIL=3 run c-tc 330 "$BIN" contract --backend cuda --quick --seed 20261207 --only cuda.tensor_cores
grep -oE "\[[0-9]+,[0-9]+\] Q[48] group [0-9]+: rel err [0-9.e-]+|three [A-Za-z0-9]+ linears[^;]*|[A-Za-z0-9]+ narrow forms[^;]*" "$OUT/c-tc.log"
export TENSORFOLD_CUDA_TENSOR_CORES=1
# bf16's one-stream decode (its bits must not move: the few-row forms now read through a column cursor), A B B A.
[ "$(left)" -gt 150 ] && ab_runs fbd PREV bench forward --device cuda --model synthetic:lfm2.5-24b-a2b --prompt-lens 512 \
  --decode 128
[ "$(left)" -gt 100 ] && ORDER="A1 B1" ab_runs f8 PREV bench forward --device cuda --model synthetic:lfm2.5-24b-a2b-mlx4 \
  --prompt-lens 8192 --decode 16
printf '%s\n' "${summary[@]}"
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
