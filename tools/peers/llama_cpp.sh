#!/usr/bin/env bash
# Build llama.cpp's llama-server / llama-bench (CPU) and convert TensorFold's LFM2-MoE test
# checkpoints to GGUF, outside the repo (default /work/peers). See tools/peers/README.md.
#
#   tools/peers/llama_cpp.sh [all|download|build|patch|convert] [args]
#     download                      pip sdist of llama-cpp-python 0.3.36 (vendors llama.cpp), extract
#     build                         cmake + ninja (apt, else pip), targets llama-server llama-bench
#                                   llama-quantize (log: $PEERS/build.log)
#     patch                         two documented edits to the extracted converter (idempotent)
#     convert SRC_DIR f32|bf16 OUT  convert_hf_to_gguf.py SRC_DIR --outtype ... --outfile OUT ($PYTHON)
#     quantize SRC_GGUF OUT TYPE [ARGS]  llama-quantize [ARGS] SRC_GGUF OUT TYPE 2 (e.g. Q4_0 --pure)
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
# The converter's Python: one with torch, transformers, safetensors (e.g. a venv made from
# tools/peers/requirements.txt, plus numpy, sentencepiece, pyyaml, tqdm, requests).
PYTHON=${PYTHON:-python3}

download() {
    mkdir -p "$PEERS/dl"
    [ -f "$PEERS/dl/llama_cpp_python-$VER.tar.gz" ] ||
        nice -n 19 pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VER" -d "$PEERS/dl"
    [ -d "$LCPP" ] || (cd "$PEERS" && nice -n 19 tar xzf "dl/llama_cpp_python-$VER.tar.gz")
}

build() {
    # CMake and Ninja from apt where it works; else from PyPI (`pip install cmake ninja`: both publish
    # manylinux wheels with the binaries, and the package registries are what this machine can reach).
    if ! { command -v cmake >/dev/null && command -v ninja >/dev/null; }; then
        { apt-get update -qq && apt-get install -y -qq ninja-build cmake; } ||
            nice -n 19 pip install cmake ninja
    fi
    cmake --version | head -n 1; echo "ninja $(ninja --version)"
    cd "$LCPP"
    local t0; t0=$(date +%s)
    # LLAMA_CURL is deprecated/ignored in this version (kept for older trees). The web UI is
    # neither built (npm) nor downloaded (no network): LLAMA_USE_PREBUILT_UI=OFF embeds an
    # empty UI table. No HTTPS needed for a loopback benchmark: LLAMA_OPENSSL=OFF.
    nice -n 19 cmake -B build -G Ninja -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF
    nice -n 19 cmake --build build -j 2 --target llama-server llama-bench llama-quantize
    echo "build: $(( $(date +%s) - t0 )) s; binaries in $LCPP/build/bin"
}

patch_converter() {
    # 1. conversion/base.py get_vocab_base_pre(): our test tokenizer (the fixture's
    #    tokenizer.json, 512-token byte-level BPE) and the default pair's (models/lfm2-moe-pycode,
    #    8,192 tokens) are unknown to llama.cpp's pre-tokenizer hash table. Both pre_tokenizers
    #    are {"type": "ByteLevel", "use_regex": true}, i.e. exactly the GPT-2 split regex, so map
    #    their hashes to llama.cpp's "gpt-2" pre-tokenizer.
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
anchor = "        if res is None:\n            logger.warning(\"\\n\")"
for tag, chkhsh, source in [
    ("TensorFold test tokenizer", "6a6d2eee9872eb38f3a8547fc517984323c6b734a5e5e0a264dfe217cd17ff9e",
     "tests/fixtures/lfm2-moe-f32/tokenizer.json, 512-token"),
    ("TensorFold default pair tokenizer", "5777db4b50670bf8b139ce8d4fc1be5c7bbaf3ce5a5036a2973d56d56a26eb25",
     "models/lfm2-moe-pycode/tokenizer.json, 8,192-token"),
]:
    if tag in s:
        continue
    assert s.count(anchor) == 1, "base.py anchor not found"
    # HF ByteLevel pre-tokenizer with use_regex=true is the GPT-2 split regex.
    s = s.replace(anchor,
        f'        if chkhsh == "{chkhsh}":\n'
        f'            # {tag} ({source} byte-level BPE): ByteLevel with use_regex=true,\n'
        '            # the GPT-2 split regex\n'
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
    (cd "$LCPP" && PYTHONPATH="$LCPP/gguf-py" nice -n 19 "$PYTHON" convert_hf_to_gguf.py \
        "$src" --outtype "$outtype" --outfile "$out")
    ls -l "$out"
}

quantize() {
    # llama.cpp's own quantizer: SRC_GGUF (bf16 or f32) to TYPE (Q4_0: blocks of 32 weights, one f16
    # scale, 4.5 bits a weight), 2 threads; further arguments go before SRC (e.g. --pure: every
    # matrix at TYPE, the tied embedding / head included). Its log goes to OUT.log.
    local src=$1 out=$2 type=$3
    shift 3
    mkdir -p "$(dirname "$out")"
    nice -n 19 "$LCPP/build/bin/llama-quantize" "$@" "$src" "$out" "$type" 2 2>&1 | tee "$out.log" | tail -n 5
    ls -l "$out"
}

cmd=${1:-all}; shift || true
case $cmd in
    download) download ;;
    build) build 2>&1 | tee "$PEERS/build.log" ;;
    patch) patch_converter ;;
    convert) convert "$@" ;;
    quantize) quantize "$@" ;;
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
    *) echo "usage: $0 [all|download|build|patch|convert SRC f32|bf16 OUT|quantize SRC OUT TYPE [ARGS]]" >&2; exit 2 ;;
esac
