#!/usr/bin/env bash
# The serving receipt: `bench serve` against `tensorfold serve` and llama.cpp's llama-server on the same weights,
# alternated in one sitting; our replies' hashes checked alone and against draft:false first.
# Usage: tools/receipts/serve.sh MODEL_DIR GGUF LLAMA_SERVER_BIN [TOKENS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=$1; gguf=$2; llama=$3; tokens=${4:-64}; rounds=${5:-2}
out=${OUT:-/tmp/serve-receipt}; mkdir -p "$out"
cargo build --release -p tensorfold >/dev/null
# The server must detokenize every id the model can emit: pad the tokenizer to the model's vocabulary.
python3 tools/peers/pad_tokenizer.py "$model" "$out/model"
model=$out/model
bin=./target/release/tensorfold
echo "commit $(git rev-parse --short HEAD)  machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
wait_health() { for _ in $(seq 1 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
for r in $(seq 1 "$rounds"); do
  $bin serve "$model" --port 18100 --parallel 16 --prompt-cache-gib 0 >"$out/tf-$r.log" 2>&1 & pid=$!
  wait_health http://127.0.0.1:18100
  echo "== tensorfold round $r"
  $bin bench serve --url http://127.0.0.1:18100 --levels 1,4,8,16 --tokens "$tokens" --reps 1 --alone --serial \
    --json "$out/tf-$r.json" | tee "$out/tf-$r.txt"
  kill -TERM $pid; wait $pid || true
  (cd "$(dirname "$llama")" && ./"$(basename "$llama")" -m "$gguf" --host 127.0.0.1 --port 18101 -np 16 -c $((16 * 2048)) \
     --cont-batching -t "$(nproc)" --no-cache-prompt --cache-ram 0 >"$out/llama-$r.log" 2>&1) & lpid=$!
  wait_health http://127.0.0.1:18101
  echo "== llama.cpp round $r"
  $bin bench serve --url http://127.0.0.1:18101 --levels 1,4,8,16 --tokens "$tokens" --reps 1 \
    --json "$out/llama-$r.json" | tee "$out/llama-$r.txt" || true
  pkill -TERM -f "llama-server -m $gguf" || true; wait $lpid 2>/dev/null || true
done
