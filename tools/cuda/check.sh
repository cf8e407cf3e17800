#!/usr/bin/env bash
# The CUDA backend's device check, for one call on the GPU machine (about 5 minutes at most): the GPU, the kernel
# contract at small shapes, the exactness checks of every fixture on the device, then the contract at served shapes
# in the time left. Runs the binary built elsewhere with `cargo build --release --features cuda,contract -p tensorfold` and
# copied to carry/bin/tensorfold, or stripped and gzip'd to carry/bin/tensorfold.gz to fit the carry limit
# (TENSORFOLD_BIN overrides). Everything is tee'd into $OUT/cuda-check.log; the last
# lines are a summary. Exits non-zero when a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${TENSORFOLD_BIN:-carry/bin/tensorfold}
OUT=${OUT:-/tmp/tensorfold-cuda-check}
BUDGET=${CHECK_SECONDS:-290}
mkdir -p "$OUT"
LOG="$OUT/cuda-check.log"
: >"$LOG"
start=$(date +%s)
say() { echo "$@" | tee -a "$LOG"; }
left() { echo $((BUDGET - ($(date +%s) - start))); }
status=0
summary=()

# The driver (libcuda.so.1) and NVRTC (libnvrtc + its builtins) are opened at run time: put the folders that hold
# them on the loader path, the toolkit's first. Never a `stubs` folder: its libcuda only returns errors.
for d in /usr/local/nvidia/lib /usr/local/nvidia/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib64; do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
    found=$(find /usr /opt -maxdepth 10 -name 'libnvrtc.so*' -not -path '*stubs*' 2>/dev/null | head -1)
    [ -n "$found" ] && LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
fi
export LD_LIBRARY_PATH
# Compiled kernels are cached here, outside $OUT (whose files come back).
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/tensorfold-cache}
export RUST_LOG=${RUST_LOG:-warn}

say "== cuda check: $(date -u +%FT%TZ), binary $BIN, budget ${BUDGET}s"
say "== nvidia-smi"
nvidia-smi 2>&1 | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | tee -a "$LOG"
say "== libraries: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
find /usr /opt -maxdepth 10 \( -name 'libnvrtc.so*' -o -name 'libcuda.so*' \) 2>/dev/null | head -20 | tee -a "$LOG"
# The stripped binary and the tree must fit the 64 MiB a call carries: a gzip'd binary (BIN.gz) is unpacked here.
if [ ! -x "$BIN" ] && [ -f "$BIN.gz" ]; then
    gzip -dc "$BIN.gz" >/tmp/tensorfold-bin && chmod +x /tmp/tensorfold-bin && BIN=/tmp/tensorfold-bin
fi
if [ ! -x "$BIN" ]; then
    say "FAIL: no binary at $BIN (or $BIN.gz)"
    exit 1
fi

# run NAME TIMEOUT ARGS...: one step, its exit status recorded in the summary.
run() {
    local name=$1 limit=$2
    shift 2
    say "== $name (timeout ${limit}s): $BIN $*"
    local t0=$(date +%s)
    timeout "$limit" "$BIN" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    local verdict="ok"
    [ "$rc" -eq 124 ] && verdict="TIMEOUT"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && verdict="FAIL (exit $rc)"
    [ "$rc" -ne 0 ] && status=1
    summary+=("$verdict: $name in $(($(date +%s) - t0))s")
}

run "contract --backend cuda --quick" 150 contract --backend cuda --quick --seed 20261129
for fx in tests/fixtures/*/ tests/fixtures/mlx/*/; do
    name=$(basename "$fx")
    case "$name" in dspark-*) continue ;; esac
    [ -f "$fx/reference.safetensors" ] || continue
    run "exact --device cuda $name" 60 exact --device cuda --model "$fx" --reference "$fx/reference.safetensors"
done
served=$(left)
if [ "$served" -ge 30 ]; then
    run "contract --backend cuda (served shapes)" "$served" contract --backend cuda --seed 20261129
else
    summary+=("SKIPPED: contract --backend cuda (served shapes): ${served}s left")
fi

say "== summary ($(($(date +%s) - start))s)"
lines=$(grep -E '^SUMMARY' "$LOG")
say "$lines"
for s in "${summary[@]}"; do say "$s"; done
exit $status
