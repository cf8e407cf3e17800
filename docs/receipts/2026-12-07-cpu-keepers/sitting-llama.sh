#!/usr/bin/env bash
# Session 25's sitting against llama.cpp: ours at 6044f5a (keepers) on the 8B plan in bf16, as
# docs/receipts/2026-12-06-cpu-llama-cpp-bf16/sitting.sh ran it (the 4-bit pair left out: its Q4_0 GGUF segfaults).
set -uo pipefail
cd /work/main
TF=${TF:-/tmp/rbin/tf-B-keep}
LB=/work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin
OUT=${OUT:-/tmp/s25-llama}
mkdir -p $OUT
short() { # NAME MODEL GGUF RUN0
  local n=$4
  for side in tf llama llama tf; do
    f=$OUT/$1-short-$side-$n.txt
    { echo "uptime: $(uptime)"
      if [ $side = tf ]; then $TF generate --model $2 --prompt-ids 1,2,3 --max-tokens 256 --ignore-eos --temperature 0 --threads 2 --no-drafts 2>&1 | grep -v "^[0-9 ]*$"
      else $LB/llama-bench -m $3 -t 2 -p 0 -n 256 -d 0 -r 2 -o md 2>&1; fi
      echo "uptime: $(uptime)"; } > $f
    echo "-- short $1 $side $n"; grep -E "token_sha256|decode:|tg256" $f
    n=$((n+1))
  done
}
name=8b-bf16 model=/work/peers/8b-bf16-padded gguf=/work/peers/8b-bf16.gguf
PHASES="forward serve" tools/receipts/cpu_llama_cpp.sh $TF $LB $OUT $name $model $gguf 512,2048 64 2>&1 | tee $OUT/$name.log
PHASES=serve LEVELS=1 REPS=3 RUN0=9 tools/receipts/cpu_llama_cpp.sh $TF $LB $OUT $name-one $model $gguf 512 256 2>&1 | tee $OUT/$name-one.log
short $name $model $gguf 13 2>&1 | tee $OUT/$name-short.log
echo SITTING-DONE
