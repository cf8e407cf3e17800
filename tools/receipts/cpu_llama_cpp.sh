#!/usr/bin/env bash
# The CPU receipt against llama.cpp on the same weights (docs/receipts/2026-12-06-cpu-llama-cpp.md), one model a
# call, 2 threads on both sides, alternated ours / llama.cpp / llama.cpp / ours:
#   1. prefill and one-stream decode: `tensorfold bench forward` (prints token_sha256 and its exactness line first)
#      against `llama-bench` (prefill -p LENS -n 0; decode -p 0 -n 64 -d 512, i.e. 64 tokens after 512 in context,
#      as bench forward decodes after a 512-token prompt);
#   2. 1 and 16 streams, greedy and sampled: `tensorfold bench serve` against `tensorfold serve` (--alone: every
#      concurrent reply re-sent alone, hashes compared) and against llama.cpp's `llama-server` (16 slots).
# `uptime` goes in the first and last line of every log: the machine is shared.
# Usage: tools/receipts/cpu_llama_cpp.sh TF_BIN LLAMA_BIN_DIR OUT NAME MODEL_DIR GGUF LENS [TOKENS]
#   MODEL_DIR: the checkpoint with a tokenizer that covers every id the model emits (tools/peers/pad_tokenizer.py)
#   LENS: prefill lengths, comma-separated (e.g. 512,2048,8192)
#   environment: PHASES (default "forward serve"), LEVELS (bench serve levels, default 1,16), REPS (default 1),
#   RUN0 (the first run number, default 1; runs are numbered in the order they ran)
set -uo pipefail
tf=$1; lb=$2; out=$3; name=$4; model=$5; gguf=$6; lens=$7; tokens=${8:-64}
phases=${PHASES:-forward serve}; levels=${LEVELS:-1,16}; reps=${REPS:-1}; run=${RUN0:-1}
mkdir -p "$out"
load() { echo "uptime: $(uptime)"; }
wait_health() { for _ in $(seq 1 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }

forward_tf() {
    local f=$out/$name-forward-tf-$1
    { load; "$tf" bench forward --model "$model" --prompt-lens "$lens" --decode 64 --threads 2 --json "$f.json"
      load; } >"$f.txt" 2>&1
    grep -E "exactness|prefill|decode " "$f.txt"
}
forward_llama() {
    local f=$out/$name-bench-llama-$1
    { load; "$lb/llama-bench" -m "$gguf" -t 2 -p "$lens" -n 0 -r 1 -o md
      load; "$lb/llama-bench" -m "$gguf" -t 2 -p 0 -n 64 -d 512 -r 2 -o md
      load; } >"$f.txt" 2>&1
    grep -E "^\| .*(pp|tg)[0-9]" "$f.txt"
}
serve_tf() {
    local f=$out/$name-serve-tf-$1 pid
    "$tf" serve "$model" --port 18100 --parallel 16 --prompt-cache-gib 0 --threads 2 >"$f.server.log" 2>&1 &
    pid=$!
    wait_health http://127.0.0.1:18100
    { load; "$tf" bench serve --url http://127.0.0.1:18100 --levels "$levels" --tokens "$tokens" --reps "$reps" --alone \
        --json "$f.json"; load; } >"$f.txt" 2>&1
    kill -TERM "$pid"; wait "$pid" || true
    tail -n 12 "$f.txt"
}
serve_llama() {
    local f=$out/$name-serve-llama-$1 pid
    (cd "$lb" && exec ./llama-server -m "$gguf" --host 127.0.0.1 --port 18101 -np 16 -c $((16 * 2048)) \
        --cont-batching -t 2 --no-cache-prompt --cache-ram 0) >"$f.server.log" 2>&1 &
    pid=$!
    wait_health http://127.0.0.1:18101
    { load; "$tf" bench serve --url http://127.0.0.1:18101 --levels "$levels" --tokens "$tokens" --reps "$reps" \
        --json "$f.json"; load; } >"$f.txt" 2>&1
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    tail -n 12 "$f.txt"
}

echo "== $name  $(date -u +%FT%TZ)  tensorfold $("$tf" --version 2>/dev/null)  $(nproc) cores"
for phase in $phases; do
    for side in tf llama llama tf; do
        echo "-- $phase $side (run $run)"; "${phase}_$side" "$run"; run=$((run + 1))
    done
done
echo "== done $(date -u +%FT%TZ)"
