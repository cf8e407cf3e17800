#!/usr/bin/env bash
# The `bench forward` receipt: tensorfold against transformers on the CPU, same checkpoint, A/B alternated in one
# sitting, token hashes compared before any speed. Usage: tools/receipts/forward.sh [MODEL_DIR] [ROUNDS]
# MODEL_DIR defaults to a random LFM2-8B-A1B-plan checkpoint made by tools/peers/make_random_checkpoint.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-/tmp/lfm2-8b-plan-512}
rounds=${2:-2}
out=${OUT:-/tmp/forward-receipt}
mkdir -p "$out"
[ -f "$model/config.json" ] || python3 tools/peers/make_random_checkpoint.py --out "$model"
cargo build --release -p tensorfold >/dev/null
bin=./target/release/tensorfold
echo "commit $(git rev-parse --short HEAD)  machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
python3 tools/peers/hf_bench.py --model "$model" --threads "$(nproc)" --prompt-lens 16 --decode 2 \
  --prompt-ids-out "$out/prompt.txt" --dtype float32 >/dev/null 2>&1
for r in $(seq 1 "$rounds"); do
  for who in tensorfold hf-bf16 hf-f32; do
    case $who in
      tensorfold) $bin bench forward --model "$model" --prompt-ids "$out/prompt.txt" --decode 64 \
                    --json "$out/$who-$r.json" | tee "$out/$who-$r.txt" ;;
      hf-bf16) python3 tools/peers/hf_bench.py --model "$model" --threads "$(nproc)" --decode 64 --dtype bfloat16 \
                 --prompt-ids-in "$out/prompt.txt" 2>/dev/null | tee "$out/$who-$r.txt" | grep -v '^{' ;;
      hf-f32) python3 tools/peers/hf_bench.py --model "$model" --threads "$(nproc)" --decode 64 --dtype float32 \
                --prompt-ids-in "$out/prompt.txt" 2>/dev/null | tee "$out/$who-$r.txt" | grep -v '^{' ;;
    esac
  done
done
echo "raw outputs in $out"
