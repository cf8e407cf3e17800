#!/usr/bin/env bash
# Issue 7's peer comparison on the GPU machine, in one call: llama.cpp's llama-server built there with CUDA (sm_90),
# against `tensorfold serve --device cuda`, on the same LFM2-8B-A1B-shaped weights (`tensorfold synth`, bf16;
# converted to a bf16 GGUF by llama.cpp's converter), through `tensorfold bench serve` at 1, 4, 8, 16 and 64 streams,
# alternated (ours, theirs, ours, theirs). Our replies are checked against their `draft: false` runs and alone first
# (bench serve's --alone). Carry what tools/cuda/llama_prep.sh writes: carry ["carry/bin", "carry/llama"].
# Logs go to $OUT; the build runs beside the weights' synthesis and conversion.
#
#   tools/cuda/llama_cuda.sh [TOKENS]
set -uo pipefail
cd "$(dirname "$0")/../.."
TOKENS=${1:-128}
. tools/cuda/env.sh /tmp/tensorfold-llama
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/steps.log"; }
stamp "host: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); nvcc $(nvcc --version | tail -1)"
# 1. The build, in the background.
mkdir -p /tmp/llama && tar -C /tmp/llama -xJf carry/llama/llama.cpp.tar.xz
L=/tmp/llama/llama.cpp
(cd $L && cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF \
    -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF &&
    cmake --build build -j "$(nproc)" --target llama-server llama-batched-bench) >"$OUT/llama-build.log" 2>&1 &
build=$!
# 2. The same weights for both: synthesize, pad the fixture tokenizer to the vocabulary, convert.
"$BIN" synth lfm2-8b-a1b --out /tmp/m8 >"$OUT/synth.log" 2>&1 || stamp "synth failed"
cp tests/fixtures/lfm2-moe-f32/tokenizer.json tests/fixtures/lfm2-moe-f32/tokenizer_config.json /tmp/m8/
python3 tools/peers/pad_tokenizer.py /tmp/m8 /tmp/m8p >>"$OUT/synth.log" 2>&1
stamp "weights ready"
(cd $L && PYTHONPATH=$L/gguf-py python3 convert_hf_to_gguf.py /tmp/m8p --outtype bf16 --outfile /tmp/m8.gguf) \
    >"$OUT/convert.log" 2>&1 || stamp "convert failed: $(tail -3 "$OUT/convert.log")"
stamp "converted: $(ls -la /tmp/m8.gguf 2>&1)"
wait $build && stamp "llama.cpp built" || { stamp "build failed"; tail -30 "$OUT/llama-build.log"; exit 1; }
# 3. Both servers through bench serve, alternated.
wait_health() { for _ in $(seq 1 900); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
for r in 1 2; do
    "$BIN" serve /tmp/m8p --device cuda --port 18100 --parallel 64 --prompt-cache-gib 0 --memory-gib 40 \
        >"$OUT/tf-$r.log" 2>&1 &
    pid=$!
    wait_health http://127.0.0.1:18100 && stamp "tensorfold round $r"
    "$BIN" bench serve --url http://127.0.0.1:18100 --levels 1,4,8,16,64 --tokens "$TOKENS" --reps 1 --alone \
        --json "$OUT/tf-$r.json" >"$OUT/tf-$r.txt" 2>&1
    kill -TERM $pid; wait $pid
    $L/build/bin/llama-server -m /tmp/m8.gguf -ngl 99 --host 127.0.0.1 --port 18101 -np 64 -c $((64 * (TOKENS + 128))) \
        --cont-batching --no-cache-prompt --cache-ram 0 >"$OUT/llama-$r.log" 2>&1 &
    lpid=$!
    wait_health http://127.0.0.1:18101 && stamp "llama.cpp round $r"
    "$BIN" bench serve --url http://127.0.0.1:18101 --levels 1,4,8,16,64 --tokens "$TOKENS" --reps 1 \
        --json "$OUT/llama-$r.json" >"$OUT/llama-$r.txt" 2>&1
    kill -TERM $lpid; wait $lpid
done
stamp "done"
for f in tf-1 llama-1 tf-2 llama-2; do echo "-- $f"; tail -12 "$OUT/$f.txt"; done
