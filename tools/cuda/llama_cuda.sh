#!/usr/bin/env bash
# Issue 7's peer comparison on the GPU machine: llama.cpp's llama-server (built with CUDA for sm_90 by
# tools/cuda/llama_prep.sh) against `tensorfold serve --device cuda`, on the same LFM2-8B-A1B-shaped weights
# (`tensorfold synth`, bf16; converted there to a bf16 GGUF by llama.cpp's converter), through `tensorfold bench
# serve` at 1, 4, 8, 16 and 64 streams, greedy, alternated (ours, theirs, ours, theirs). Our replies are checked
# against solo runs in the first round (bench serve's --alone). The server does not fit one call's carry, so two
# calls back to back on the same warm machine:
#
#   tools/cuda/llama_cuda.sh stage          carry ["carry/lp1"]: keeps the server's first half in /tmp
#   tools/cuda/llama_cuda.sh run [TOKENS]   carry ["carry/bin", "carry/lp2"]: the rest, then the comparison
#
# With CHECK=1, the CUDA check (tools/cuda/check.sh) runs first, beside the weights' synthesis and conversion. With
# AB=NAME=VALUE, `bench engine` on the 8B weights then runs A (the knob set) and B (the default), A B B A, at 1, 4, 8
# and 16 streams before the servers. Logs go to /tmp/tensorfold-llama, then as one logs.tgz (and the summary) to $OUT
# (a call brings back at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:?stage or run}
TOKENS=${2:-128}
STAGE=/tmp/tensorfold-llama-stage
if [ "$MODE" = stage ]; then
    mkdir -p $STAGE && cp carry/lp1/llama-server.xz.a $STAGE/ && ls -la $STAGE
    exit
fi
DEST=${OUT:-/tmp/tensorfold-llama-out}
mkdir -p "$DEST"
OUT=/tmp/tensorfold-llama
rm -rf $OUT /tmp/m8 /tmp/m8p /tmp/m8.gguf
. tools/cuda/env.sh $OUT
# Whatever ends the run, its logs reach $DEST.
trap '(cd "$OUT" && tar czf "$DEST/logs.tgz" --exclude="*.gguf" ./*.txt ./*.json ./*.log check 2>/dev/null)' EXIT
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$OUT/steps.log"; }
[ -f $STAGE/llama-server.xz.a ] || { stamp "no staged first half: the machine was not the warm one of the stage call"; exit 2; }
cat $STAGE/llama-server.xz.a carry/lp2/llama-server.xz.b >/tmp/llama-server.xz
[ "$(sha256sum </tmp/llama-server.xz | cut -d' ' -f1)" = "$(cat carry/lp2/llama-server.xz.sha256)" ] ||
    { stamp "llama-server halves do not match their hash"; exit 2; }
xz -dc /tmp/llama-server.xz >/tmp/llama-server && chmod +x /tmp/llama-server || { stamp "unpacking failed"; exit 2; }
stamp "host: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $(/tmp/llama-server --version 2>&1 | head -2 | tr '\n' ' ')"
mkdir -p /tmp/conv && tar -C /tmp/conv -xJf carry/lp2/convert.tar.xz
# The same weights for both: synthesize, pad the fixture tokenizer to the vocabulary, convert (in the background).
weights() {
    "$BIN" synth lfm2-8b-a1b --out /tmp/m8 >"$OUT/synth.log" 2>&1 || { stamp "synth failed"; return 1; }
    cp tests/fixtures/lfm2-moe-f32/tokenizer.json tests/fixtures/lfm2-moe-f32/tokenizer_config.json /tmp/m8/
    python3 tools/peers/pad_tokenizer.py /tmp/m8 /tmp/m8p >>"$OUT/synth.log" 2>&1 || { stamp "padding failed"; return 1; }
    stamp "weights ready"
    (cd /tmp/conv && PYTHONPATH=/tmp/conv/gguf-py python3 convert_hf_to_gguf.py /tmp/m8p --outtype bf16 \
        --outfile /tmp/m8.gguf) >"$OUT/convert.log" 2>&1 || stamp "convert failed: $(tail -3 "$OUT/convert.log")"
    stamp "converted: $(ls -la /tmp/m8.gguf 2>&1)"
}
weights &
wpid=$!
if [ "${CHECK:-0}" = 1 ]; then
    OUT=$OUT/check CHECK_SECONDS=${CHECK_SECONDS:-100} TENSORFOLD_BIN=$BIN bash tools/cuda/check.sh >/dev/null 2>&1
    stamp "check rc=$?"
    grep -E "^SUMMARY|^ok|^FAIL|^TIMEOUT|^SKIPPED" "$OUT/check/cuda-check.log" | sort | uniq -c
fi
wait $wpid
[ -f /tmp/m8.gguf ] || exit 1
if [ -n "${AB:-}" ]; then
    E="bench engine --device cuda --model /tmp/m8p --levels 1,4,8,16 --tokens 256 --reps 1 --temperatures 0 --check 4"
    # shellcheck disable=SC2086 # E is a list of arguments
    ab_runs e8 "$AB" $E | tee -a "$OUT/steps.log"
fi
wait_health() { for _ in $(seq 1 900); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
B="--levels 1,4,8,16,64 --tokens $TOKENS --reps 1 --temperatures 0"
for r in 1 2; do
    alone=$([ "$r" = 1 ] && echo --alone)
    "$BIN" serve /tmp/m8p --device cuda --port 18100 --parallel 64 --prompt-cache-gib 0 --memory-gib 40 \
        >"$OUT/tf-$r.log" 2>&1 &
    pid=$!
    wait_health http://127.0.0.1:18100 && stamp "tensorfold round $r"
    "$BIN" bench serve --url http://127.0.0.1:18100 $B $alone --json "$OUT/tf-$r.json" >"$OUT/tf-$r.txt" 2>&1
    kill -TERM $pid
    wait $pid
    /tmp/llama-server -m /tmp/m8.gguf -ngl 99 --host 127.0.0.1 --port 18101 -np 64 -c $((64 * (TOKENS + 128))) \
        --cont-batching --no-cache-prompt --cache-ram 0 --no-webui >"$OUT/llama-$r.log" 2>&1 &
    lpid=$!
    wait_health http://127.0.0.1:18101 && stamp "llama.cpp round $r"
    "$BIN" bench serve --url http://127.0.0.1:18101 $B --json "$OUT/llama-$r.json" >"$OUT/llama-$r.txt" 2>&1
    kill -TERM $lpid
    wait $lpid
done
stamp "done"
for f in tf-1 llama-1 tf-2 llama-2; do echo "-- $f"; tail -8 "$OUT/$f.txt"; done | tee "$DEST/summary.txt"
