# Sourced by the GPU-machine scripts of tools/cuda/ (run from the repository root): unpacks the carried binary
# (carry/bin/tensorfold.gz or .xz) into BIN, puts the driver, NVRTC and NCCL on the loader path (NCCL comes as
# PyTorch's libnccl.so.2, a name cudarc does not try: linked as libnccl.so), keeps NVLink multicast off, and sets
# the kernel cache and log level. OUT defaults to $1.
OUT=${OUT:-$1}
mkdir -p "$OUT" carry/bin
if [ ! -x carry/bin/tensorfold ]; then
    if [ -f carry/bin/tensorfold.gz ]; then gunzip -kf carry/bin/tensorfold.gz; fi
    if [ -f carry/bin/tensorfold.xz ]; then xz -dkc carry/bin/tensorfold.xz >carry/bin/tensorfold; fi
    [ -f carry/bin/tensorfold ] && chmod +x carry/bin/tensorfold
fi
BIN=${TENSORFOLD_BIN:-$PWD/carry/bin/tensorfold}
PREV_BIN=$PWD/carry/bin/prev
if [ -f carry/bin/prev.xz ] && [ ! -x "$PREV_BIN" ]; then xz -dkc carry/bin/prev.xz >"$PREV_BIN" && chmod +x "$PREV_BIN"; fi
for d in /usr/local/nvidia/lib /usr/local/nvidia/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib64; do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
[ -n "$nccl" ] || nccl=$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -1)
if [ -n "$nccl" ]; then
    mkdir -p /tmp/nccl-lib && ln -sf "$nccl" /tmp/nccl-lib/libnccl.so && LD_LIBRARY_PATH="/tmp/nccl-lib:$LD_LIBRARY_PATH"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH PATH="/usr/local/cuda/bin:$PATH" XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/tensorfold-cache} \
    RUST_LOG=${RUST_LOG:-warn}
# run NAME LIMIT CMD...: CMD under `timeout LIMIT`, output appended to $OUT/NAME.log, its tail (RUN_TAIL lines) shown
# and "NAME rc=.. Ns" added to `summary`; skipped when less than LIMIT of BUDGET seconds (from sourcing) is left.
summary=()
start_s=$(date +%s)
left() { echo $((${BUDGET:-1000000} - ($(date +%s) - start_s))); }
run() {
    local name=$1 limit=$2
    shift 2
    [ "$(left)" -lt "$limit" ] && { summary+=("$name skipped: $(left)s left"); return; }
    local t0=$(date +%s)
    echo "== $name: $*" | tee -a "$OUT/$name.log"
    timeout "$limit" "$@" >>"$OUT/$name.log" 2>&1
    local rc=$?
    summary+=("$name rc=$rc $(($(date +%s) - t0))s")
    tail -"${RUN_TAIL:-12}" "$OUT/$name.log"
}
# ab_runs NAME KNOB ARGS...: "$BIN" ARGS... four times, A B B A, A with the environment assignment KNOB
# (NAME=VALUE) and B without, each into $OUT/NAME-RUN.log; prints each run's rc and its figure and hash lines.
# KNOB=PREV runs A with the previous binary instead (carry/bin/prev.xz, its commit in carry/bin/PREV).
# ORDER overrides the runs (e.g. ORDER=B1 for one run of the default).
ab_runs() {
    local name=$1 knob=$2 run rc
    shift 2
    for run in ${ORDER:-A1 B1 B2 A2}; do
        case $run in
            A*) if [ "$knob" = PREV ]; then "$PREV_BIN" "$@"; else env "$knob" "$BIN" "$@"; fi >"$OUT/$name-$run.log" 2>&1 ;;
            B*) "$BIN" "$@" >"$OUT/$name-$run.log" 2>&1 ;;
        esac
        rc=$?
        echo "-- $name $run rc=$rc"
        grep -E "exactness|prefill|decode|floor|^ +[0-9]+ |^replies|equal:|cuda graphs" "$OUT/$name-$run.log"
    done
}

# ncu_lines FILE: an ncu report's kernels a line each: name, grid, duration (us), DRAM throughput (% of peak). In the
# SpeedOfLight section a kernel's DRAM line comes before its Duration line.
ncu_lines() {
    awk '/^  [a-z_0-9]+ \(/ { name = $1; grid = $2 $3 $4 } /DRAM Throughput/ { dram = $NF }
        /^ +Duration/ { sub(/x.*/, "", grid); printf "%-28s %-10s %8s us %6s %% DRAM\n", name, grid, $NF, dram }' "$1"
}
