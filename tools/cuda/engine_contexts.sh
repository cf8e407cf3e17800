#!/usr/bin/env bash
# The engine at 1,024 streams with the conv windows sized by the verify depth, on the 24B shape in the tensor-core
# mode, for the GPU machine (run from the repository root; logs under $OUT). Every run checks concurrent replies
# against solo runs before any figure.
#   PART=ab:   the previous binary (carry/bin/prev.xz, commit in carry/bin/PREV) then this one, A B B A, at LEVELS
#              (1,024) streams of 32-64-token prompts and TOKENS (64) tokens: admission line, peak memory, hashes.
#   PART=long: this binary at LEVELS (1,024) streams of PROMPT (1,920) prompt tokens and TOKENS (128) generated:
#              2,048-token contexts (1,024 of them need an H200: their f32 KV rows take 80 GiB; an H100 holds 330).
#   PART=ab|long [LEVELS=1024] [PROMPT=1920] [TOKENS=..] [ORDER="A1 B1 B2 A2"] tools/cuda/engine_contexts.sh
set -u
OUT=${OUT:-/tmp/engine-contexts}
# shellcheck source=tools/cuda/env.sh
source "$(dirname "$0")/env.sh" "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
E="bench engine --device cuda --model synthetic:lfm2.5-24b-a2b --reps 1 --temperatures 0 --check 2 --levels ${LEVELS:-1024}"
show() { grep -E "memory admission|^ +[0-9]+ |^replies|equal:|device 0" "$1"; }
case ${PART:-ab} in
    ab)
        for run in ${ORDER:-A1 B1 B2 A2}; do
            case $run in A*) b=$PREV_BIN ;; *) b=$BIN ;; esac
            # shellcheck disable=SC2086
            "$b" $E --tokens "${TOKENS:-64}" >"$OUT/eab-$run.log" 2>&1
            echo "-- $run rc=$?"
            show "$OUT/eab-$run.log"
        done
        ;;
    long)
        # shellcheck disable=SC2086
        "$BIN" $E --prompt-tokens "${PROMPT:-1920}" --tokens "${TOKENS:-128}" >"$OUT/elong.log" 2>&1
        echo "-- long rc=$?"
        show "$OUT/elong.log"
        ;;
esac
