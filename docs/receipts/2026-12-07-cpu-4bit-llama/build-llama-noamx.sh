#!/usr/bin/env bash
# llama.cpp 0c1e570 (vendored by llama_cpp_python 0.3.36) built for this VM without AMX: the native build's AMX
# path (which ggml takes for Q4_0 when the CPU reports amx_int8) dies here with SIGILL ("trap invalid opcode" in
# libggml-cpu.so) though /proc/cpuinfo lists amx_tile; every other native feature (AVX-512 VNNI, BF16) stays on.
set -euo pipefail
cd "${1:-/work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp}"
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S . -B build-noamx -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags"
cmake --build build-noamx -j2 --target llama-bench llama-server
