#!/usr/bin/env bash
# Prepares, on this machine, what tools/cuda/llama_cuda.sh carries to the GPU machine (issue 7's llama.cpp
# comparison). llama.cpp's CUDA build takes longer than a device call allows there, so it is built here: CUDA 13.0's
# compiler from its pip wheels (the version the GPU machine's driver and toolkit have), the runtime and cuBLAS
# headers and libraries from the nvidia-cuda-runtime / nvidia-cublas wheels, a link-time stub of libcuda (the real
# one is the driver there), sm_90 only, llama-server linked statically against ggml (25 min on 2 cores). The source
# is llama.cpp as the llama-cpp-python 0.3.36 sdist vendors it (tools/peers/llama_cpp.sh download + patch).
# Writes, under carry/ (git-ignored; the 64 MiB carry limit is why the server is split in two):
#   carry/lp1/llama-server.xz.a         first half of the stripped, xz'd llama-server (call 1 stages it)
#   carry/lp2/llama-server.xz.b         second half
#   carry/lp2/convert.tar.xz            the GGUF converter (convert_hf_to_gguf.py, conversion/, gguf-py/)
#   carry/bin/tensorfold.xz             tensorfold built with `--no-default-features --features cuda,contract` (no embedded
#                                       model: 3 MB instead of 26)
#
#   tools/cuda/llama_prep.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS=${PEERS:-/work/peers}
CUDA=${CUDA_HOME_PREP:-/tmp/cuda-13.0}
BUILD=${LLAMA_BUILD:-/tmp/llama-cuda-build}
L="$PEERS/llama_cpp_python-0.3.36/vendor/llama.cpp"
bash tools/peers/llama_cpp.sh download
bash tools/peers/llama_cpp.sh patch

# 1. A CUDA 13.0 toolkit from wheels: nvcc, nvvm, crt, cccl, runtime, cuBLAS.
if [ ! -x "$CUDA/bin/nvcc" ]; then
    whl=$(mktemp -d)
    pip download -q --no-deps --only-binary=:all: -d "$whl" nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.1.0.3
    mkdir -p "$CUDA"
    for w in "$whl"/*.whl; do (cd "$whl" && unzip -q -o "$w" 'nvidia/cu13/*'); done
    cp -a "$whl"/nvidia/cu13/. "$CUDA"/
    rm -rf "$whl"
    for l in cudart cublas cublasLt; do ln -sf "lib$l.so.13" "$CUDA/lib/lib$l.so"; done
    ln -sfn lib "$CUDA/lib64"
    # libcuda for the link only: every driver entry point cuda.h declares, as an empty function.
    mkdir -p "$CUDA/lib/stubs"
    gcc -E -P -I"$CUDA/include" "$CUDA/include/cuda.h" | grep -oP '\bcu[A-Z][A-Za-z0-9_]*(?=\s*\()' | sort -u |
        awk '{print "void " $1 "(void){}"}' >"$CUDA/lib/stubs/stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUDA/lib/stubs/libcuda.so" "$CUDA/lib/stubs/stub.c"
fi

# 2. llama-server with CUDA for sm_90 (flash attention and CUDA graphs at llama.cpp's defaults). A server already
#    built in $BUILD is reused as it is: remove $BUILD after changing the source.
if [ ! -x "$BUILD/bin/llama-server" ]; then
    PATH="$CUDA/bin:$PATH" cmake -S "$L" -B "$BUILD" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_CUDA_COMPILER="$CUDA/bin/nvcc" -DCUDAToolkit_ROOT="$CUDA" -DGGML_CUDA_FA_ALL_QUANTS=OFF \
        -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_OPENSSL=OFF >"$BUILD.configure.log"
    PATH="$CUDA/bin:$PATH" nice -n 10 cmake --build "$BUILD" -j "$(nproc)" --target llama-server >"$BUILD.log"
fi
mkdir -p carry/lp1 carry/lp2 carry/bin
strip -o /tmp/llama-server.strip "$BUILD/bin/llama-server"
xz -T0 -6 -c /tmp/llama-server.strip >/tmp/llama-server.xz
half=$(( ($(stat -c %s /tmp/llama-server.xz) + 1) / 2 ))
head -c "$half" /tmp/llama-server.xz >carry/lp1/llama-server.xz.a
tail -c +"$((half + 1))" /tmp/llama-server.xz >carry/lp2/llama-server.xz.b
sha256sum /tmp/llama-server.xz | cut -d' ' -f1 >carry/lp2/llama-server.xz.sha256
rm -f /tmp/llama-server.strip /tmp/llama-server.xz

# 3. The converter, patched as tools/peers/llama_cpp.sh says.
tar -C "$L" -cJf carry/lp2/convert.tar.xz --exclude='__pycache__' convert_hf_to_gguf.py conversion gguf-py

# 4. Our binary, slim.
cargo build --release --no-default-features --features cuda,contract -p tensorfold
rm -f carry/bin/tensorfold carry/bin/tensorfold.gz carry/bin/tensorfold.xz
strip -o carry/bin/tensorfold.strip "${CARGO_TARGET_DIR:-target}/release/tensorfold"
xz -T0 -6 -c carry/bin/tensorfold.strip >carry/bin/tensorfold.xz && rm carry/bin/tensorfold.strip
ls -la carry/lp1 carry/lp2 carry/bin
echo "call 1 carry [\"carry/lp1\"]; call 2 carry [\"carry/bin\", \"carry/lp2\"]; the tree itself:" \
    "$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {printf "%.1f MiB", s / 1048576}')"
