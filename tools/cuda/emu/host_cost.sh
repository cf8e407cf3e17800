#!/usr/bin/env bash
# The host's own cost of a CUDA forward, without a GPU: runs `bench forward --device cuda` against the fake driver
# as a null device (TFEMU_NULL=1: every call succeeds and does no device work; reads to the host give zeros). The
# tokens are meaningless. The decode line's ms a step is the host's recording and flushing alone. The exit line
# counts kernel launches, graph launches and copies. Needs g++.
#
#   tools/cuda/emu/host_cost.sh SHAPE_JSON [DECODE]
#   e.g. the 24B layout with 8 experts (host memory for its weights):
#   python3 -c "import json;c=json.load(open('crates/tensorfold-model/src/shapes/lfm2.5-24b-a2b.json'));c['num_experts']=8;json.dump(c,open('/tmp/cfg24.json','w'))"
#   cargo build --release --no-default-features --features cuda -p tensorfold && tools/cuda/emu/host_cost.sh /tmp/cfg24.json
set -euo pipefail
cd "$(dirname "$0")/../../.."
SHAPE=${1:?a config.json of the shape}
LIB=${TFEMU_WORK:-/tmp/tensorfold-emu}/null
mkdir -p "$LIB"
g++ -std=c++17 -O2 -fPIC -shared tools/cuda/emu/fake.cpp -o "$LIB/libcuda.so" -ldl
ln -sf libcuda.so "$LIB/libcuda.so.1"
ln -sf libcuda.so "$LIB/libnvrtc.so"
LD_LIBRARY_PATH="$LIB" XDG_CACHE_HOME="$LIB/cache" TFEMU_NULL=1 ./target/release/tensorfold bench forward \
    --device cuda --model "synthetic:$SHAPE" --prompt-lens 16 --decode "${2:-64}" 2>&1 |
    grep -aE "^decode|host:|cuda graphs|^tfemu null device: [1-9]"
