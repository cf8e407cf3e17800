#!/usr/bin/env bash
# Build, check and time the tensor-core study (tc.cu) in one device call; logs to $OUT, a short table last.
# Usage (on the GPU machine): bash tools/cuda/tc/run.sh [all|acc|inv|time]. About 1-3 minutes on one H200.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT=${OUT:-/tmp/tc-out}
WHAT=${1:-all}
mkdir -p "$OUT"
BUILD=/tmp/tc-build
mkdir -p "$BUILD"
exec > >(tee "$OUT/run.log") 2>&1
echo "== tc study $(date -u +%FT%TZ) what=$WHAT src=$HERE"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv 2>&1
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$NVCC" --version | tail -2

# cuBLAS (speed mark only): the toolkit's, else the pip wheel's.
CUB_FLAGS=""
if [ -f /usr/local/cuda/include/cublas_v2.h ] && ls /usr/local/cuda/lib64/libcublas.so* >/dev/null 2>&1; then
    CUB_FLAGS="-DHAVE_CUBLAS -lcublas"
else
    CB=$(find / -path /proc -prune -o -name cublas_v2.h -print 2>/dev/null | head -1)
    CL=$(find / -path /proc -prune -o -name 'libcublas.so*' -print 2>/dev/null | grep -v stubs | head -1)
    if [ -n "$CB" ] && [ -n "$CL" ]; then
        CUB_FLAGS="-DHAVE_CUBLAS -I$(dirname "$CB") -L$(dirname "$CL") -l:$(basename "$CL") -Xlinker -rpath=$(dirname "$CL")"
    fi
fi
echo "cublas flags: ${CUB_FLAGS:-none}"

ARCH="-gencode=arch=compute_90a,code=sm_90a"
t0=$(date +%s)
if ! "$NVCC" -O3 -std=c++17 $ARCH -Xptxas -v -lineinfo -o "$BUILD/tc" "$HERE/tc.cu" $CUB_FLAGS >"$OUT/build.log" 2>&1; then
    echo "build with cuBLAS failed; retrying without (tail of log):"
    tail -20 "$OUT/build.log"
    "$NVCC" -O3 -std=c++17 $ARCH -Xptxas -v -lineinfo -o "$BUILD/tc" "$HERE/tc.cu" >"$OUT/build.log" 2>&1 || {
        echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
fi
echo "build: $(( $(date +%s) - t0 ))s"
# Registers / spills per kernel, and which matrix instructions the SASS holds.
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | sed 's/ptxas info    ://' | paste - - - 2>/dev/null \
    | sed -E 's/_Z[0-9]+//' | cut -c1-220 >"$OUT/resources.txt"
cuobjdump --dump-sass "$BUILD/tc" >/tmp/tc.sass 2>/dev/null
{
    echo "HMMA count: $(grep -c HMMA /tmp/tc.sass)"
    echo "HGMMA count: $(grep -c HGMMA /tmp/tc.sass)"
    echo "LDL/STL (local memory) count: $(grep -cE 'LDL|STL' /tmp/tc.sass)"
    grep -m3 HMMA /tmp/tc.sass
} >>"$OUT/resources.txt"
cat "$OUT/resources.txt"

timeout 150 "$BUILD/tc" "$WHAT" "$OUT/tc_raw.log" >"$OUT/tc_stdout.log" 2>&1
rc=$?
echo "tc exit: $rc"
if [ "$WHAT" = all ]; then
    # The timing again in the same sitting, for its spread; then a memory check of every variant on one small shape.
    timeout 60 "$BUILD/tc" time "$OUT/tc_raw2.log" >"$OUT/tc_stdout2.log" 2>&1
    echo "tc time (repeat) exit: $?"
    if command -v compute-sanitizer >/dev/null; then
        timeout 45 compute-sanitizer --tool memcheck "$BUILD/tc" san /tmp/tc_san_raw.log >"$OUT/san.log" 2>&1
        echo "compute-sanitizer memcheck exit: $? ($(grep -E 'ERROR SUMMARY' "$OUT/san.log" | tail -1))"
    fi
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>&1

# Short table last: accuracy, invariance, then the best tensor-core variant per (N, M, P) against cuBLAS.
echo
echo "== accuracy (rel_l2, max_abs, max|e|/sum|xw| in units of 2^-24)"
grep -E "^(q/out|conv|k/v|expert|head|shape)" "$OUT/tc_stdout.log" | grep -E "shape|f32-fma|-L " | cut -c1-100
echo "== invariance"
grep -E "^K=|invariance failures" "$OUT/tc_stdout.log"
echo "== timing: best variant per N,M,P,form (us; TFLOP/s of useful work 2MNK/t) vs cuBLAS bf16"
printf "%6s %5s %2s %-4s %-4s %9s %7s %8s %8s %9s\n" N M P form var us +split TFLOP/s "W GB/s" cublas_us
AWK_BEST='/^time /{for(i=2;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}
     if(v["var"]=="split"){sp[v["N"]" "v["M"]" "v["P"]]=v["us"];next}
     if(v["var"]=="cublas"){cb[v["N"]" "v["M"]]=v["us"];next}
     key=v["N"]" "v["M"]" "v["P"]" "v["form"];
     if(!(key in best)||v["us"]<best[key]){best[key]=v["us"];bv[key]=v["var"];uf[key]=v["useful_tflops"];gb[key]=v["w_gbs"]}}'
awk "$AWK_BEST"'
     END{for(k in best){split(k,f," ");
     printf "%6s %5s %2s %-4s %-4s %9.2f %7.2f %8.1f %8.0f %9.2f\n",f[1],f[2],f[3],f[4],bv[k],best[k],sp[f[1]" "f[2]" "f[3]],uf[k],gb[k],cb[f[1]" "f[2]]}}' \
    "$OUT/tc_raw.log" | sort -k1,1n -k2,2n -k3,3n -k4,4
if [ -s "$OUT/tc_raw2.log" ]; then
    echo "== repeat spread (every timed line, second run / first): median and extremes of the ratio"
    paste -d' ' <(grep '^time ' "$OUT/tc_raw.log" | grep -o 'us=[0-9.]*' | cut -d= -f2) \
                <(grep '^time ' "$OUT/tc_raw2.log" | grep -o 'us=[0-9.]*' | cut -d= -f2) \
        | awk 'NF==2&&$1>0{print $2/$1}' | sort -n | awk '{r[NR]=$1}END{if(NR)printf "n=%d min=%.3f median=%.3f max=%.3f\n",NR,r[1],r[int((NR+1)/2)],r[NR]}'
fi
exit $rc
