#!/usr/bin/env bash
# Issue 8's evidence in one call on a machine of two GPUs: the MoE kernels' contract entry (with the expert-shard
# gate and its planted control) and the MoE fixtures through `exact --device cuda`, then `bench engine` on
# LFM2.5-24B-A2B's shape (synthetic bf16 weights) at 16 and 64 streams on one GPU, on two GPUs (`--gpus 2`, experts
# split through NCCL) and through the expert-parallel path at a world of one (`--gpus 1`), A/B alternated; every
# run prints each level's `replies:` token hash, which must be equal across runs. Runs the binary built with
# `--features cuda,contract` at carry/bin/tensorfold.gz. Logs go to $OUT; the last lines are a summary.
#
#   tools/cuda/expert_parallel.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/cuda/env.sh /tmp/tensorfold-ep
BUDGET=${EP_SECONDS:-560}
{
    echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tr '\n' ';')"
    echo "nccl: ${nccl:-not found}"
    nvidia-smi topo -m 2>&1 | head -8
} | tee "$OUT/host.log"
run check 150 bash -c "set -o pipefail; '$BIN' contract --backend cuda --only cuda.moe && for f in lfm2-moe-f32 lfm2-moe-bf16-fused lfm2-moe-24b-plan; do for g in '' '--gpus 1' '--gpus 2'; do echo \"exact \$f \$g\"; '$BIN' exact --device cuda --model tests/fixtures/\$f --reference tests/fixtures/\$f/reference.safetensors \$g | tail -1 || exit 1; done; done"
M24=synthetic:lfm2.5-24b-a2b
E="bench engine --device cuda --model $M24 --levels 16,64 --tokens 256 --reps 1 --temperatures 0 --check 2"
run e24-gpu1 130 "$BIN" $E
run e24-gpus2 150 "$BIN" $E --gpus 2
run e24-gpus1 130 "$BIN" $E --gpus 1
run e24-gpus2-b 150 "$BIN" $E --gpus 2
run e24-gpu1-b 130 "$BIN" $E
echo "== summary"
printf '%s\n' "${summary[@]}"
grep -h -E "^SUMMARY|^PASS cuda|^FAIL|^exact|passed,|control" "$OUT/check.log" | tail -24
for f in e24-gpu1 e24-gpus2 e24-gpus1 e24-gpus2-b e24-gpu1-b; do
    [ -f "$OUT/$f.log" ] && { echo "-- $f"; grep -E "^ +[0-9]+ |^replies:|^device|equal:|backend:" "$OUT/$f.log"; }
done
