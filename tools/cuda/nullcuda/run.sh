#!/usr/bin/env bash
# The host's own cost of a CUDA forward, without a GPU: builds null.cpp (a libcuda and libnvrtc whose calls all
# succeed and do no device work; reads to the host give zeros) and runs the cuda-feature binary against it. Tokens
# are meaningless (every logit is 0); the decode line's ms a step is the host's recording and flushing alone, and
# the exit line counts kernel launches, graph launches and copies. Needs g++.
#
#   tools/cuda/nullcuda/run.sh [SHAPE_JSON] [DECODE]
#   e.g. a 24B layout with 8 experts (host memory for its weights):
#   python3 -c "import json;c=json.load(open('crates/tensorfold-model/src/shapes/lfm2.5-24b-a2b.json'));c['num_experts']=8;json.dump(c,open('/tmp/cfg24.json','w'))"
#   cargo build --release --no-default-features --features cuda -p tensorfold && tools/cuda/nullcuda/run.sh /tmp/cfg24.json
set -euo pipefail
cd "$(dirname "$0")/../../.."
LIB=${NULLCUDA_LIB:-/tmp/nullcuda-lib}
mkdir -p "$LIB"
g++ -O2 -fPIC -shared -fvisibility=hidden tools/cuda/nullcuda/null.cpp -o "$LIB/libcuda.so"
cp "$LIB/libcuda.so" "$LIB/libcuda.so.1" && cp "$LIB/libcuda.so" "$LIB/libnvrtc.so"
SHAPE=${1:?a config.json of the shape}
LD_LIBRARY_PATH="$LIB" XDG_CACHE_HOME="$LIB/cache" NULLCUDA_REPORT=1 ./target/release/tensorfold bench forward \
    --device cuda --model "synthetic:$SHAPE" --prompt-lens 16 --decode "${2:-64}" 2>&1 |
    grep -aE "^decode|host:|cuda graphs|^nullcuda: [1-9]"
