#!/usr/bin/env bash
# Session 28, call 2: the few-row tensor-core forms with each warp's weights copied by cp.async into a ring of
# stages (54 KiB a block, four blocks an SM), activations a stage ahead in registers (B, working tree on bf77979)
# against bf77979 (A): the MoE fixture's
# exactness and the contract's tensor-core kernel, then one-stream decode A B B A (hashes first), the default mode
# once for reference, the engine at 16 and 256 streams A B, and an events profile of B's decode steps.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-560}
. tools/cuda/env.sh "$OUT"
M=synthetic:lfm2.5-24b-a2b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
run exact-moe 60 "$BIN" exact --device cuda --model tests/fixtures/lfm2-moe-bf16-fused \
  --reference tests/fixtures/lfm2-moe-bf16-fused/reference.safetensors
RUN_TAIL=8 run c-tc 150 "$BIN" contract --backend cuda --quick --seed 20261211 --only cuda.tensor_cores
ORDER="A1 B1 B2 A2"; [ "$(left)" -lt 300 ] && ORDER="A1 B1"
ORDER=$ORDER ab_runs f PREV bench forward --device cuda --model $M --prompt-lens 512 --decode 64
if [ "$(left)" -gt 150 ]; then
  env -u TENSORFOLD_CUDA_TENSOR_CORES "$BIN" bench forward --device cuda --model $M --prompt-lens 512 --decode 64 \
    > "$OUT/fcc-B1.log" 2>&1; echo "-- fcc B1 rc=$?"; grep -E "exactness|prefill|decode" "$OUT/fcc-B1.log"
fi
E="bench engine --device cuda --model $M --levels 16,256 --tokens 64 --reps 1 --temperatures 0 --check 2 --parallel 256"
[ "$(left)" -gt 110 ] && ORDER="A1 B1" ab_runs e PREV $E
if [ "$(left)" -gt 50 ]; then
  TENSORFOLD_CUDA_GRAPHS=0 TENSORFOLD_CUDA_PDL=0 TENSORFOLD_CUDA_PROFILE=events timeout 45 "$BIN" bench forward \
    --device cuda --model $M --prompt-lens 16 --decode 32 > "$OUT/prof-B.log" 2>&1; echo "-- prof rc=$?"
  grep -E "tcf|attn_mma|route|decode" "$OUT/prof-B.log" | head -20
fi
printf '%s\n' "${summary[@]}"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
