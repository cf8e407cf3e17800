#!/usr/bin/env bash
# Session 26's sitting: the AVX-512 kernels compiled with VL and activation blocks on cache lines (B) against main
# before them (A, 1496052), A B B A, then B beside llama.cpp on the 8B plan in bf16 (prefill 512, 2,048, 8,192).
#   TF_A, TF_B: the two binaries; OUT: where the logs go; MODELS: tools/receipts/cpu_decode_ab.sh's models folder.
set -uo pipefail
cd "$(dirname "$0")/../../.."
A=${TF_A:-/tmp/rbin/tf-main} B=${TF_B:-/tmp/rbin/tf-F-ae2122e} OUT=${OUT:-/tmp/s26-sit} MODELS=${MODELS:-/tmp/s25-ab/models}
LB=/work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin
mkdir -p "$OUT"
n=1
for m in 8b-bf16 default 8b-mlx4; do
    case $m in
        default) model=(); lens=512,2048,4000 ;;
        8b-bf16) model=(--model "$MODELS/$m"); lens=512,2048,8192 ;;
        *) model=(--model "$MODELS/$m"); lens=512,2048 ;;
    esac
    for side in A B B A; do
        bin=$A; [ $side = B ] && bin=$B
        f=$OUT/$m-$side-$n.txt
        { echo "uptime: $(uptime)"; "$bin" bench forward "${model[@]}" --prompt-lens $lens --decode 64 --threads 2
          echo "uptime: $(uptime)"; } >"$f" 2>&1
        echo "-- $m $side run $n"; grep -E "token_sha256|prefill|decode " "$f" | sed 's/exactness: //' | cut -c1-120
        n=$((n + 1))
    done
done
PHASES=forward RUN0=$n tools/receipts/cpu_llama_cpp.sh "$B" $LB "$OUT/llama" 8b-bf16 /work/peers/8b-bf16-padded \
    /work/peers/8b-bf16.gguf 512,2048,8192 64 2>&1 | tee "$OUT/llama.log"
echo SITTING-DONE
