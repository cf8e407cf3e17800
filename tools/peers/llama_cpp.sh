#!/usr/bin/env bash
# Build llama.cpp's llama-server / llama-bench (CPU) and convert TensorFold's LFM2-MoE test
# checkpoints to GGUF, outside the repo (default /work/peers). See tools/peers/README.md.
#
#   tools/peers/llama_cpp.sh [all|download|build|patch|convert] [args]
#     download                      pip sdist of llama-cpp-python 0.3.36 (vendors llama.cpp), extract
#     build                         cmake + ninja, targets llama-server llama-bench (log: $PEERS/build.log)
#     patch                         two documented edits to the extracted converter (idempotent)
#     convert SRC_DIR f32|bf16 OUT  convert_hf_to_gguf.py SRC_DIR --outtype ... --outfile OUT
#     all                           download, build, patch, convert the fixture (f32) and, if it
#                                   exists, /tmp/lfm2-8b-plan-512 (bf16, and f32 for exactness checks)
#
# Every heavy step runs under `nice -n 19` (shared 2-core machine). Nothing is written in the repo.
set -euo pipefail

PEERS=${PEERS:-/work/peers}
VER=0.3.36
SRC="$PEERS/llama_cpp_python-$VER"
LCPP="$SRC/vendor/llama.cpp"
REPO=$(cd "$(dirname "$0")/../.." && pwd)

download() {
    mkdir -p "$PEERS/dl"
    [ -f "$PEERS/dl/llama_cpp_python-$VER.tar.gz" ] ||
        nice -n 19 pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VER" -d "$PEERS/dl"
    [ -d "$LCPP" ] || (cd "$PEERS" && nice -n 19 tar xzf "dl/llama_cpp_python-$VER.tar.gz")
}

build() {
    command -v cmake >/dev/null && command -v ninja >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq ninja-build cmake; }
    cd "$LCPP"
    local t0; t0=$(date +%s)
    # LLAMA_CURL is deprecated/ignored in this version (kept for older trees). The web UI is
    # neither built (npm) nor downloaded (no network): LLAMA_USE_PREBUILT_UI=OFF embeds an
    # empty UI table. No HTTPS needed for a loopback benchmark: LLAMA_OPENSSL=OFF.
    nice -n 19 cmake -B build -G Ninja -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF
    nice -n 19 cmake --build build -j 2 --target llama-server llama-bench
    echo "build: $(( $(date +%s) - t0 )) s; binaries in $LCPP/build/bin"
}

patch_converter() {
    # 1. conversion/base.py get_vocab_base_pre(): our test tokenizer (the fixture's
    #    tokenizer.json, 512-token byte-level BPE) is unknown to llama.cpp's pre-tokenizer hash
    #    table. Its pre_tokenizer is {"type": "ByteLevel", "use_regex": true}, i.e. exactly the
    #    GPT-2 split regex, so map its hash to llama.cpp's "gpt-2" pre-tokenizer.
    # 2. conversion/lfm2.py LFM2MoeModel: llama.cpp's lfm2moe graph always normalizes the top-k
    #    weights and never reads an expert-weight scale (routed_scaling_factor is treated as 1.0).
    #    The fixture uses 1.5. Routed-expert outputs are linear in their down projection (w2),
    #    so multiply every expert's w2 by routed_scaling_factor when it is not 1.0 (an exact
    #    rewrite up to one f32 rounding per weight), and refuse norm_topk_prob=false.
    PYTHONDONTWRITEBYTECODE=1 python3 - "$LCPP" <<'EOF'
import sys, pathlib
root = pathlib.Path(sys.argv[1]) / "conversion"
base = root / "base.py"
s = base.read_text()
tag = "TensorFold test tokenizer"
if tag not in s:
    anchor = "        if res is None:\n            logger.warning(\"\\n\")"
    assert s.count(anchor) == 1, "base.py anchor not found"
    s = s.replace(anchor,
        '        if chkhsh == "6a6d2eee9872eb38f3a8547fc517984323c6b734a5e5e0a264dfe217cd17ff9e":\n'
        f'            # {tag} (tests/fixtures/lfm2-moe-f32/tokenizer.json): HF ByteLevel\n'
        '            # pre-tokenizer with use_regex=true = the GPT-2 split regex\n'
        '            res = "gpt-2"\n' + anchor)
    base.write_text(s)
lf = root / "lfm2.py"
s = lf.read_text()
tag = "TensorFold: fold routed_scaling_factor"
if tag not in s:
    anchor = "                data_torch = torch.stack(datas, dim=0)\n"
    assert s.count(anchor) == 1, "lfm2.py stack anchor not found"
    s = s.replace(anchor, anchor +
        f'                # {tag} into the expert down projections\n'
        '                # (llama.cpp lfm2moe applies no expert-weight scale)\n'
        '                rsf = float(self.hparams.get("routed_scaling_factor", 1.0))\n'
        '                if w_name == "w2" and rsf != 1.0:\n'
        '                    data_torch = data_torch * rsf\n')
    anchor = "        self.gguf_writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)\n"
    assert s.count(anchor) == 1, "lfm2.py gating anchor not found"
    s = s.replace(anchor, anchor +
        '        # TensorFold: llama.cpp lfm2moe always normalizes the top-k weights\n'
        '        assert self.hparams.get("norm_topk_prob", True), "llama.cpp lfm2moe needs norm_topk_prob=true"\n')
    lf.write_text(s)
print("converter patched")
EOF
}

convert() {
    local src=$1 outtype=$2 out=$3
    mkdir -p "$(dirname "$out")"
    # gguf-py from the same tree via PYTHONPATH (no pip install); needs numpy, torch,
    # transformers, safetensors, pyyaml, tqdm, requests (all already in the environment).
    (cd "$LCPP" && PYTHONPATH="$LCPP/gguf-py" nice -n 19 python3 convert_hf_to_gguf.py \
        "$src" --outtype "$outtype" --outfile "$out")
    ls -l "$out"
}

cmd=${1:-all}; shift || true
case $cmd in
    download) download ;;
    build) build 2>&1 | tee "$PEERS/build.log" ;;
    patch) patch_converter ;;
    convert) convert "$@" ;;
    all)
        download
        build 2>&1 | tee "$PEERS/build.log"
        patch_converter
        convert "$REPO/tests/fixtures/lfm2-moe-f32" f32 "$PEERS/gguf/lfm2-moe-f32.gguf"
        if [ -d /tmp/lfm2-8b-plan-512 ]; then
            convert /tmp/lfm2-8b-plan-512 bf16 "$PEERS/gguf/lfm2-8b-plan-512-bf16.gguf"
            # exact f32 upcast: the token-identity reference (llama.cpp's bf16 matmuls round
            # activations to bf16, so the bf16 GGUF's greedy stream drifts from TensorFold's)
            convert /tmp/lfm2-8b-plan-512 f32 "$PEERS/gguf/lfm2-8b-plan-512-f32.gguf"
        fi ;;
    *) echo "usage: $0 [all|download|build|patch|convert SRC f32|bf16 OUT]" >&2; exit 2 ;;
esac
