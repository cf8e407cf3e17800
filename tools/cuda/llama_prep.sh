#!/usr/bin/env bash
# Prepares, on this machine, what tools/cuda/llama_cuda.sh carries to the GPU machine (issue 7's llama.cpp
# comparison): llama.cpp's source as the llama-cpp-python 0.3.36 sdist vendors it (downloaded, converter patched:
# tools/peers/llama_cpp.sh), trimmed to what a CUDA build of llama-server and llama-batched-bench and the GGUF
# converter need (about 5 MB as tar.xz), and the TensorFold binary built with `--features cuda`, stripped and xz'd
# (the 64 MiB carry limit: the tree is about 35 MiB). Writes carry/llama/llama.cpp.tar.xz and carry/bin/tensorfold.xz.
#
#   tools/cuda/llama_prep.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS=${PEERS:-/work/peers}
bash tools/peers/llama_cpp.sh download
bash tools/peers/llama_cpp.sh patch
mkdir -p carry/llama carry/bin
tar -C "$PEERS/llama_cpp_python-0.3.36/vendor" \
    --exclude='llama.cpp/build' --exclude='llama.cpp/models' --exclude='llama.cpp/docs' --exclude='llama.cpp/media' \
    --exclude='llama.cpp/tests' --exclude='llama.cpp/examples' --exclude='llama.cpp/pocs' \
    --exclude='llama.cpp/tools/ui/src' --exclude='llama.cpp/tools/ui/tests' --exclude='llama.cpp/tools/server/public*' \
    --exclude='llama.cpp/ggml/src/ggml-vulkan' --exclude='llama.cpp/ggml/src/ggml-sycl' \
    --exclude='llama.cpp/ggml/src/ggml-metal' --exclude='llama.cpp/ggml/src/ggml-opencl' \
    --exclude='llama.cpp/ggml/src/ggml-cann' --exclude='llama.cpp/ggml/src/ggml-musa' \
    --exclude='llama.cpp/ggml/src/ggml-webgpu' --exclude='llama.cpp/ggml/src/ggml-hexagon' \
    --exclude='llama.cpp/ggml/src/ggml-zdnn' \
    -cJf carry/llama/llama.cpp.tar.xz llama.cpp
cargo build --release --features cuda -p tensorfold
rm -f carry/bin/tensorfold carry/bin/tensorfold.gz carry/bin/tensorfold.xz
strip -o carry/bin/tensorfold.strip target/release/tensorfold
xz -T0 -6 -c carry/bin/tensorfold.strip >carry/bin/tensorfold.xz && rm carry/bin/tensorfold.strip
ls -la carry/llama carry/bin
echo "carry: [\"carry/bin\", \"carry/llama\"]; the tree itself: $(git ls-files -z | du -ch --files0-from=- | tail -1)"
