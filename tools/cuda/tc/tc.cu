// Tensor-core dense linear design study (issue 22): bf16 piece count vs f64, row invariance, speed vs cuBLAS.
//
// y[m][n] = sum_k x[m][k] * w[n][k], x f32 (split into P bf16 pieces), w bf16 [N][K], y f32.
// Every kernel here computes each output by ONE chain of mma.sync.m16n8k16 steps whose order depends on K alone:
// for each 32-wide K chunk c (ascending), for each piece p (hi, lo, lo2), for each 16-wide half j of the chunk:
// acc = mma(piece_p[k-slots of (c, j)], w[same slots], acc). The k-slot permutation (below) is fixed, so tile shapes
// (R, D16, D32, S, L) may differ by width while each output's bits stay the same. No split-K, no atomics.
// FOLD = true is a second chain form: each chunk's pieces go into a zeroed f32 partial on the tensor cores, which is
// then added to the running sum with an ordinary f32 add (round to nearest), in ascending chunk order.
//
// k-slot permutation of one 32-chunk: lane (g = lane/4, q = lane%4) holds 16 bytes = 8 consecutive k
// [q*8, q*8+8) of its row (A) or column (B). For half j the mma's logical k = 2q+e maps to physical q*8+4j+e and
// logical k = 8+2q+e to physical q*8+4j+2+e, for A and B alike, so the product covers each physical k once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmath>
#include <algorithm>
#include <vector>
#include <string>
#ifdef HAVE_CUBLAS
#include <cublas_v2.h>
#endif

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
            exit(2);                                                                                \
        }                                                                                           \
    } while (0)
#define CKL() CK(cudaGetLastError())

typedef __nv_bfloat16 bf16;

// ---------------------------------------------------------------- device helpers
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t w32(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}
// One 32-chunk of one piece into one (m16 x n8) accumulator: the two k16 halves, j = 0 then 1.
// lo_row: 16 bytes of row g, hi_row: of row g+8, b: 16 bytes of column g.
__device__ __forceinline__ void chunk_piece(float (&acc)[4], const uint4& ar0, const uint4& ar8, const uint4& b) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
        mma_bf16(acc, w32(ar0, 2 * j), w32(ar8, 2 * j), w32(ar0, 2 * j + 1), w32(ar8, 2 * j + 1), w32(b, 2 * j),
                 w32(b, 2 * j + 1));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------- split: x f32 -> P bf16 planes [P][M][K]
template <int P>
__global__ void split_kernel(const float* __restrict__ x, bf16* __restrict__ planes, size_t count) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float r = x[i];
#pragma unroll
    for (int p = 0; p < P; ++p) {
        bf16 h = __float2bfloat16_rn(r);
        planes[(size_t)p * count + i] = h;
        r = r - __bfloat162float(h);  // exact in f32 (Sterbenz-type residual of a round-to-nearest)
    }
}

// ---------------------------------------------------------------- R: register-fed, one warp = 16 rows x 8 cols
// Weights stream through a per-warp cp.async ring of S chunks (each lane copies and later reads its own 16 bytes,
// so no barrier is needed); activations are read from global (L1/L2) one chunk ahead. CTRL = planted control:
// a K split chosen by the call's width (ksplit >= 0 folds two half-K chains, the shape-only rule is broken).
template <int P, int S, bool CTRL, bool FOLD>
__global__ void __launch_bounds__(32) r_kernel(const bf16* __restrict__ planes, const bf16* __restrict__ w,
                                               float* __restrict__ y, int M, int N, int K, int ksplit) {
    extern __shared__ uint4 ring[];  // [S][32] uint4
    const int lane = threadIdx.x, g = lane >> 2, q = lane & 3;
    const int n0 = blockIdx.x * 8, m0 = blockIdx.y * 16;
    const int nch = K / 32;
    const bf16* wrow = w + (size_t)(n0 + g) * K + q * 8;
    const int r0 = m0 + g, r8 = m0 + g + 8;
    auto issue = [&](int c) {
        if (c < nch) cp_async16(&ring[(c % S) * 32 + lane], wrow + (size_t)c * 32, 16);
        cp_commit();
    };
#pragma unroll
    for (int c = 0; c < S - 1; ++c) issue(c);
    // Warm L1 with this tile's activation rows (a few KB at decode): each lane prefetches distinct 128-byte lines.
    {
        const int rows = min(16, M - m0), lpr = K / 64, total = P * rows * lpr;
        for (int i = lane; i < total; i += 32) {
            const int p = i / (rows * lpr), rem = i % (rows * lpr);
            const bf16* a = planes + (size_t)p * M * K + (size_t)(m0 + rem / lpr) * K + (rem % lpr) * 64;
            asm volatile("prefetch.global.L1 [%0];\n" ::"l"(a));
        }
    }
    const uint4 z = make_uint4(0, 0, 0, 0);
    uint4 an0[P], an8[P], bn0[P], bn8[P];  // activations for chunks c+1 and c+2
    auto loada = [&](int c, uint4 (&a0)[P], uint4 (&a8)[P]) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const bf16* base = planes + (size_t)p * M * K + (size_t)c * 32 + q * 8;
            a0[p] = r0 < M ? __ldg((const uint4*)(base + (size_t)r0 * K)) : z;
            a8[p] = r8 < M ? __ldg((const uint4*)(base + (size_t)r8 * K)) : z;
        }
    };
    loada(0, an0, an8);
    if (nch > 1) loada(1, bn0, bn8);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    float sav[4] = {0.f, 0.f, 0.f, 0.f};
    for (int c = 0; c < nch; ++c) {
        uint4 a0[P], a8[P];
#pragma unroll
        for (int p = 0; p < P; ++p) { a0[p] = an0[p]; a8[p] = an8[p]; an0[p] = bn0[p]; an8[p] = bn8[p]; }
        if (c + 2 < nch) loada(c + 2, bn0, bn8);
        issue(c + S - 1);
        cp_wait<S - 1>();
        const uint4 b = ring[(c % S) * 32 + lane];
        if (CTRL && c == ksplit) {
#pragma unroll
            for (int i = 0; i < 4; ++i) { sav[i] = acc[i]; acc[i] = 0.f; }
        }
        if (FOLD) {
            float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int p = 0; p < P; ++p) chunk_piece(part, a0[p], a8[p], b);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[i] = __fadd_rn(acc[i], part[i]);
        } else {
#pragma unroll
            for (int p = 0; p < P; ++p) chunk_piece(acc, a0[p], a8[p], b);
        }
    }
    if (CTRL && ksplit >= 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = sav[i] + acc[i];
    }
    const int col = n0 + 2 * q;
    if (r0 < M) *(float2*)(y + (size_t)r0 * N + col) = make_float2(acc[0], acc[1]);
    if (r8 < M) *(float2*)(y + (size_t)r8 * N + col) = make_float2(acc[2], acc[3]);
}

// ---------------------------------------------------------------- S / L: shared-memory tiled, multi-stage cp.async
// Block = WMW x WNW warps, warp tile (MT*16) x (NT*8), BK = 32, ST stages. Smem rows are 64 bytes; a warp's
// fragment read (8 rows x 4 lanes x 16 B) is 512 contiguous bytes, so conflict-free without padding.
template <int P, int WMW, int WNW, int MT, int NT, int ST, bool FOLD>
__global__ void __launch_bounds__(WMW* WNW * 32) t_kernel(const bf16* __restrict__ planes,
                                                          const bf16* __restrict__ w, float* __restrict__ y, int M,
                                                          int N, int K) {
    constexpr int BM = WMW * MT * 16, BN = WNW * NT * 8, T = WMW * WNW * 32;
    constexpr int A_U4 = P * BM * 4, B_U4 = BN * 4, STAGE_U4 = A_U4 + B_U4;  // uint4 per stage
    extern __shared__ uint4 sm[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int wm = warp / WNW, wn = warp % WNW;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int nch = K / 32;
    auto load_stage = [&](int c) {
        if (c < nch) {
            uint4* st = sm + (size_t)(c % ST) * STAGE_U4;
            const int k0 = c * 32;
#pragma unroll
            for (int idx = tid; idx < A_U4; idx += T) {
                const int p = idx / (BM * 4), r = (idx >> 2) % BM, cq = idx & 3;
                const int row = m0 + r;
                const bool ok = row < M;
                const bf16* src = planes + (size_t)p * M * K + (size_t)(ok ? row : 0) * K + k0 + cq * 8;
                cp_async16(st + idx, src, ok ? 16 : 0);
            }
#pragma unroll
            for (int idx = tid; idx < B_U4; idx += T) {
                const int r = idx >> 2, cq = idx & 3;
                cp_async16(st + A_U4 + idx, w + (size_t)(n0 + r) * K + k0 + cq * 8, 16);
            }
        }
        cp_commit();
    };
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) load_stage(s);
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.f;
    for (int c = 0; c < nch; ++c) {
        cp_wait<ST - 2>();
        __syncthreads();
        load_stage(c + ST - 1);  // into the stage everyone finished reading before the barrier above
        const uint4* st = sm + (size_t)(c % ST) * STAGE_U4;
        uint4 b[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) b[t] = st[A_U4 + ((wn * NT + t) * 8 + g) * 4 + q];
        float part[MT][NT][4];
        if (FOLD) {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int t = 0; t < NT; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) part[i][t][e] = 0.f;
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            uint4 a0[MT], a8[MT];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int r = (wm * MT + i) * 16 + g;
                a0[i] = st[(p * BM + r) * 4 + q];
                a8[i] = st[(p * BM + r + 8) * 4 + q];
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if constexpr (FOLD) chunk_piece(part[i][t], a0[i], a8[i], b[t]);
                    else chunk_piece(acc[i][t], a0[i], a8[i], b[t]);
                }
        }
        if (FOLD) {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int t = 0; t < NT; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][t][e] = __fadd_rn(acc[i][t][e], part[i][t][e]);
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int r0 = m0 + (wm * MT + i) * 16 + g, r8 = r0 + 8;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int col = n0 + (wn * NT + t) * 8 + 2 * q;
            if (r0 < M) *(float2*)(y + (size_t)r0 * N + col) = make_float2(acc[i][t][0], acc[i][t][1]);
            if (r8 < M) *(float2*)(y + (size_t)r8 * N + col) = make_float2(acc[i][t][2], acc[i][t][3]);
        }
    }
}

// ---------------------------------------------------------------- references
// f64: one thread per output, also sum |x||w| (the scale a contract bound is stated against).
__global__ void ref_f64(const float* __restrict__ x, const bf16* __restrict__ w, double* __restrict__ y,
                        double* __restrict__ absy, int M, int N, int K) {
    const int n = blockIdx.x, m = threadIdx.x;  // a block per column: w broadcast, x rows stay in L1
    if (m >= M) return;
    double s = 0.0, a = 0.0;
    for (int k = 0; k < K; ++k) {
        const double p = (double)x[(size_t)m * K + k] * (double)__bfloat162float(w[(size_t)n * K + k]);
        s += p;
        a += fabs(p);
    }
    y[(size_t)m * N + n] = s;
    absy[(size_t)m * N + n] = a;
}
// f32 CUDA-core stand-in for the current canonical dot: fmaf in ascending k.
__global__ void ref_f32(const float* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ y, int M, int N,
                        int K) {
    const int n = blockIdx.x, m = threadIdx.x;
    if (m >= M) return;
    float s = 0.f;
    for (int k = 0; k < K; ++k) s = fmaf(x[(size_t)m * K + k], __bfloat162float(w[(size_t)n * K + k]), s);
    y[(size_t)m * N + n] = s;
}

// ---------------------------------------------------------------- random data on the device (counter hash)
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ float gauss(uint64_t seed, size_t i) {
    const uint64_t h = mix64(seed * 0x100000001B3ull ^ mix64(i));
    const double u1 = ((h >> 11) + 1) * (1.0 / 9007199254740993.0);
    const double u2 = (mix64(h) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
// activations: N(0,1); 0.1% of entries x30; 4 outlier channels (k) x20; rows of a few different scales.
__global__ void gen_x(float* x, size_t rows, int K, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * K) return;
    const int k = (int)(i % K);
    const size_t m = i / K;
    float v = gauss(seed, i);
    const uint64_t h = mix64(seed ^ (i * 0x2545F4914F6CDD1Dull));
    if ((h & 1023) == 0) v *= 30.f;
    if (k == 7 || k == 311 || k == 1029 || k == K - 5) v *= 20.f;
    const float rs[4] = {1.f, 0.25f, 3.f, 1.f};
    x[i] = v * rs[m % 4];
}
__global__ void gen_w(bf16* w, size_t count, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    w[i] = __float2bfloat16_rn(0.02f * gauss(seed, i));
}

// ---------------------------------------------------------------- host side
static int g_smem_optin = 0;
static bool g_small = false;  // "san" mode: one small shape, every variant (for compute-sanitizer)
static size_t cdiv(size_t a, size_t b) { return (a + b - 1) / b; }

enum Var { VR = 0, VD16, VD32, VS, VL, VCTRL };
static const char* var_name[] = {"R", "D16", "D32", "S", "L", "CTRL"};
constexpr int R_ST = 32;
// D16: 1x2 warps of 16x8 -> block 16x16, 16 stages; D32: 1x4 warps -> 16x32, 12 stages (decode, deep pipelines);
// S: 2x2 warps, warp 16x32 -> block 32x64, 4 stages; L: 2x4 warps, warp 64x32 -> block 128x128, 4 stages.
#define D16_CFG 1, 2, 1, 1, 16
#define D32_CFG 1, 4, 1, 1, 12
#define S_CFG 2, 2, 1, 4, 4
#define L_CFG 2, 4, 4, 4, 4

template <int P, int WMW, int WNW, int MT, int NT, int ST, bool FOLD>
static void launch_t(const bf16* planes, const bf16* w, float* y, int M, int N, int K, cudaStream_t s) {
    constexpr int BM = WMW * MT * 16, BN = WNW * NT * 8;
    const size_t smem = (size_t)ST * (P * BM * 4 + BN * 4) * 16;
    static bool set = false;
    if (!set) {
        CK(cudaFuncSetAttribute(t_kernel<P, WMW, WNW, MT, NT, ST, FOLD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem));
        set = true;
    }
    if (N % BN || K % 32) { fprintf(stderr, "shape %dx%d not served by tile %dx%d\n", N, K, BM, BN); exit(3); }
    dim3 grid(N / BN, (unsigned)cdiv(M, BM));
    t_kernel<P, WMW, WNW, MT, NT, ST, FOLD><<<grid, WMW * WNW * 32, smem, s>>>(planes, w, y, M, N, K);
    CKL();
}
template <int P, bool CTRL, bool FOLD>
static void launch_r(const bf16* planes, const bf16* w, float* y, int M, int N, int K, int ksplit, cudaStream_t s) {
    if (N % 8 || K % 32) { fprintf(stderr, "shape not served by R\n"); exit(3); }
    dim3 grid(N / 8, (unsigned)cdiv(M, 16));
    r_kernel<P, R_ST, CTRL, FOLD><<<grid, 32, R_ST * 32 * 16, s>>>(planes, w, y, M, N, K, ksplit);
    CKL();
}
template <int P, bool F>
static void gemm_p(Var v, const bf16* planes, const bf16* w, float* y, int M, int N, int K, cudaStream_t s) {
    switch (v) {
        case VR: launch_r<P, false, F>(planes, w, y, M, N, K, -1, s); break;
        case VD16: launch_t<P, D16_CFG, F>(planes, w, y, M, N, K, s); break;
        case VD32: launch_t<P, D32_CFG, F>(planes, w, y, M, N, K, s); break;
        case VS: launch_t<P, S_CFG, F>(planes, w, y, M, N, K, s); break;
        case VL: launch_t<P, L_CFG, F>(planes, w, y, M, N, K, s); break;
        case VCTRL: launch_r<P, true, F>(planes, w, y, M, N, K, M > 16 ? (K / 32) / 2 : -1, s); break;
    }
}
static bool g_fold = false;  // which chain form the calls below use
static void gemm(int P, Var v, const bf16* planes, const bf16* w, float* y, int M, int N, int K,
                 cudaStream_t s = 0) {
    if (g_fold) {
        if (P == 1) gemm_p<1, true>(v, planes, w, y, M, N, K, s);
        else if (P == 2) gemm_p<2, true>(v, planes, w, y, M, N, K, s);
        else gemm_p<3, true>(v, planes, w, y, M, N, K, s);
    } else {
        if (P == 1) gemm_p<1, false>(v, planes, w, y, M, N, K, s);
        else if (P == 2) gemm_p<2, false>(v, planes, w, y, M, N, K, s);
        else gemm_p<3, false>(v, planes, w, y, M, N, K, s);
    }
}
static const char* fold_tag() { return g_fold ? "fold" : "acc"; }
static void split(int P, const float* x, bf16* planes, size_t count, cudaStream_t s = 0) {
    const unsigned b = (unsigned)cdiv(count, 256);
    if (P == 1) split_kernel<1><<<b, 256, 0, s>>>(x, planes, count);
    else if (P == 2) split_kernel<2><<<b, 256, 0, s>>>(x, planes, count);
    else split_kernel<3><<<b, 256, 0, s>>>(x, planes, count);
    CKL();
}
// The width dispatch the study proposes: R at decode, S for small batches, L for prefill.
static Var dispatch(int M) { return M <= 16 ? VR : (M <= 128 ? VS : VL); }

static void fill_x(float* x, size_t rows, int K, uint64_t seed) {
    gen_x<<<(unsigned)cdiv(rows * K, 256), 256>>>(x, rows, K, seed);
    CKL();
}
static void fill_w(bf16* w, size_t count, uint64_t seed) {
    gen_w<<<(unsigned)cdiv(count, 256), 256>>>(w, count, seed);
    CKL();
}

// ---------------------------------------------------------------- 1. accuracy per piece count
struct Shape { const char* name; int K, N; };
static void accuracy(FILE* log) {
    const Shape shapes[] = {{"q/out proj", 2048, 2048}, {"conv in_proj", 2048, 6144}, {"k/v proj", 2048, 512},
                            {"expert down", 1536, 2048}, {"expert gate-up", 2048, 3072},
                            {"head (8192 of 65536 cols)", 2048, 8192}};
    const int M = 64;
    printf("\n== accuracy: M=%d rows, x ~ N(0,1) with outliers, w bf16 ~ N(0,0.02); vs f64\n", M);
    fprintf(log, "accuracy M=%d\n", M);
    printf("%-26s %5s %5s | %-8s %10s %10s %10s %10s\n", "shape", "K", "N", "method", "rel_l2", "max_abs",
           "max|e|/S", "(/2^-24)");
    for (const Shape& sh : shapes) {
        if (g_small && sh.N != 512) continue;
        const int K = sh.K, N = sh.N;
        float *x, *y, *y32;
        bf16 *w, *planes;
        double *ref, *abss;
        CK(cudaMalloc(&x, (size_t)M * K * 4));
        CK(cudaMalloc(&planes, (size_t)3 * M * K * 2));
        CK(cudaMalloc(&w, (size_t)N * K * 2));
        CK(cudaMalloc(&y, (size_t)M * N * 4));
        CK(cudaMalloc(&y32, (size_t)M * N * 4));
        CK(cudaMalloc(&ref, (size_t)M * N * 8));
        CK(cudaMalloc(&abss, (size_t)M * N * 8));
        fill_x(x, M, K, 1000 + K + N);
        fill_w(w, (size_t)N * K, 2000 + K + N);
        ref_f64<<<N, M>>>(x, w, ref, abss, M, N, K);
        CKL();
        ref_f32<<<N, M>>>(x, w, y32, M, N, K);
        CKL();
        std::vector<double> hr((size_t)M * N), ha((size_t)M * N);
        std::vector<float> hy((size_t)M * N);
        CK(cudaMemcpy(hr.data(), ref, hr.size() * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(ha.data(), abss, ha.size() * 8, cudaMemcpyDeviceToHost));
        auto report = [&](const char* method) {
            double se = 0, sr = 0, mx = 0, mxn = 0;
            size_t bad = 0;
            for (size_t i = 0; i < hy.size(); ++i) {
                if (!std::isfinite(hy[i])) { ++bad; continue; }
                const double e = (double)hy[i] - hr[i];
                se += e * e;
                sr += hr[i] * hr[i];
                mx = std::max(mx, fabs(e));
                mxn = std::max(mxn, fabs(e) / ha[i]);
            }
            const double rel = sqrt(se / sr);
            printf("%-26s %5d %5d | %-8s %10.3e %10.3e %10.3e %10.2f%s\n", sh.name, K, N, method, rel, mx, mxn,
                   mxn / ldexp(1.0, -24), bad ? "  UNWRITTEN/NaN!" : "");
            fprintf(log, "acc shape=%s K=%d N=%d method=%s rel_l2=%.6e max_abs=%.6e max_norm=%.6e nonfinite=%zu\n",
                    sh.name, K, N, method, rel, mx, mxn, bad);
        };
        CK(cudaMemcpy(hy.data(), y32, hy.size() * 4, cudaMemcpyDeviceToHost));
        report("f32-fma");
        for (int fold = 0; fold < 2; ++fold)
        for (int P = 1; P <= 3; ++P) {
            g_fold = fold;
            split(P, x, planes, (size_t)M * K);
            // R and L; the others are bit-identical (invariance test); all of them in san mode
            for (int v = VR; v <= VL; v += g_small ? 1 : VL - VR) {
                CK(cudaMemset(y, 0xFF, (size_t)M * N * 4));  // NaN poison
                gemm(P, (Var)v, planes, w, y, M, N, K);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
                char nm[32];
                snprintf(nm, sizeof nm, "tc%d%s-%s", P, fold ? "f" : "", var_name[v]);
                report(nm);
            }
        }
        g_fold = false;
        CK(cudaFree(x)); CK(cudaFree(planes)); CK(cudaFree(w)); CK(cudaFree(y)); CK(cudaFree(y32));
        CK(cudaFree(ref)); CK(cudaFree(abss));
    }
}

// ---------------------------------------------------------------- 2. row invariance
// Row r0 computed alone (M=1, R) is the baseline; then at each width, at several positions, through each tile
// variant and the width dispatch, its bits must be identical. CTRL (split-K chosen by M) must differ.
static int invariance(FILE* log) {
    const int widths[] = {1, 2, 3, 8, 16, 33, 64, 128, 512, 2048};
    const int KN[3][2] = {{2048, 2048}, {2048, 6144}, {1536, 2048}};
    int fails = 0;
    printf("\n== row invariance: row's bits at each width/position vs the row alone; R,D16,D32,S,L,dispatch\n");
    for (const auto& kn : KN) {
        const int K = kn[0], N = kn[1];
        const int MX = 2048;
        float *x, *y, *y1;
        bf16 *w, *planes;
        CK(cudaMalloc(&x, (size_t)MX * K * 4));
        CK(cudaMalloc(&planes, (size_t)3 * MX * K * 2));
        CK(cudaMalloc(&w, (size_t)N * K * 2));
        CK(cudaMalloc(&y, (size_t)MX * N * 4));
        CK(cudaMalloc(&y1, (size_t)N * 4));
        fill_w(w, (size_t)N * K, 77 + N);
        float* xr;
        CK(cudaMalloc(&xr, (size_t)K * 4));
        fill_x(xr, 1, K, 4242);
        std::vector<float> base(N), got((size_t)MX * N);
        for (int fold = 0; fold < 2; ++fold)
        for (int P = 1; P <= 3; ++P) {
            g_fold = fold;
            split(P, xr, planes, K);
            CK(cudaMemset(y1, 0xFF, N * 4));
            gemm(P, VR, planes, w, y1, 1, N, K);
            CK(cudaMemcpy(base.data(), y1, N * 4, cudaMemcpyDeviceToHost));
            printf("K=%d N=%d P=%d %-4s:", K, N, P, fold_tag());
            for (int M : widths) {
                int pos_list[4] = {0, M - 1, std::min(13, M - 1), M / 2};
                bool ok = true, ctrl_same = true, written = true;
                for (int pi = 0; pi < 4; ++pi) {
                    const int pos = pos_list[pi];
                    fill_x(x, M, K, 9000 + 31 * M + pi + 1000 * P);  // other rows random, fresh per case
                    CK(cudaMemcpy(x + (size_t)pos * K, xr, K * 4, cudaMemcpyDeviceToDevice));
                    split(P, x, planes, (size_t)M * K);
                    for (int v = VR; v <= VCTRL + 1; ++v) {
                        const Var var = v == VCTRL + 1 ? dispatch(M) : (Var)v;
                        CK(cudaMemset(y, 0xFF, (size_t)M * N * 4));
                        gemm(P, var, planes, w, y, M, N, K);
                        CK(cudaDeviceSynchronize());
                        CK(cudaMemcpy(got.data(), y, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
                        for (size_t i = 0; i < (size_t)M * N; ++i) {
                            uint32_t u;
                            memcpy(&u, &got[i], 4);
                            if (u == 0xFFFFFFFFu) { written = false; break; }
                        }
                        const bool same = memcmp(got.data() + (size_t)pos * N, base.data(), N * 4) == 0;
                        if (v == VCTRL) ctrl_same = ctrl_same && same;
                        else if (!same) {
                            ok = false;
                            fprintf(log, "inv MISMATCH K=%d N=%d P=%d form=%s M=%d pos=%d var=%s\n", K, N, P,
                                    fold_tag(), M, pos, var_name[var]);
                        }
                    }
                }
                if (!written) ok = false;
                fails += !ok;
                printf(" %d:%s%s", M, ok ? "PASS" : "FAIL", ctrl_same ? "" : "(ctrl red)");
                fprintf(log, "inv N=%d K=%d P=%d form=%s M=%d verdict=%s written=%d control=%s\n", N, K, P,
                        fold_tag(), M, ok ? "PASS" : "FAIL", written, ctrl_same ? "same(green)" : "differs(red)");
            }
            printf("\n");
        }
        g_fold = false;
        CK(cudaFree(x)); CK(cudaFree(planes)); CK(cudaFree(w)); CK(cudaFree(y)); CK(cudaFree(y1));
        CK(cudaFree(xr));
    }
    return fails;
}

// ---------------------------------------------------------------- 3. timing
struct Timer {
    cudaEvent_t a, b;
    Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
    template <class F>
    double median_us(F f, int reps_per_sample = 10, int samples = 21, int warm = 5) {
        for (int i = 0; i < warm; ++i) f(i);
        CK(cudaDeviceSynchronize());
        std::vector<double> t;
        int it = 0;
        for (int s = 0; s < samples; ++s) {
            CK(cudaEventRecord(a));
            for (int r = 0; r < reps_per_sample; ++r) f(it++);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            t.push_back(ms * 1000.0 / reps_per_sample);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
};

static void timing(FILE* log, double bw_ceiling_gbs) {
    const int K = 2048;
    struct TS { int N; std::vector<int> Ms; };
    const TS cases[] = {{6144, {1, 4, 16, 64, 256, 1024, 2048, 4096}},
                        {2048, {1, 4, 16, 64, 256, 1024, 2048, 4096}},
                        {65536, {1, 16, 256, 2048}}};
    Timer tm;
#ifdef HAVE_CUBLAS
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); exit(4); }
#endif
    printf("\n== timing K=%d (median of 21 samples x 10 launches, rotating weight/activation sets beyond L2)\n", K);
    printf("%6s %5s %2s %-4s %-6s %10s %9s %9s %7s\n", "N", "M", "P", "form", "var", "us", "tcTFLOP/s", "W GB/s",
           "%bw");
    for (const TS& ts : cases) {
        const int N = ts.N;
        const size_t wbytes = (size_t)N * K * 2;
        const int nw = (int)std::max<size_t>(2, cdiv((size_t)256 << 20, wbytes));
        const int MX = 4096, nx = 3;
        std::vector<bf16*> ws(nw);
        for (int i = 0; i < nw; ++i) { CK(cudaMalloc(&ws[i], wbytes)); fill_w(ws[i], (size_t)N * K, 500 + i); }
        std::vector<float*> xs(nx);
        std::vector<bf16*> ps(nx);
        for (int i = 0; i < nx; ++i) {
            CK(cudaMalloc(&xs[i], (size_t)MX * K * 4));
            CK(cudaMalloc(&ps[i], (size_t)3 * MX * K * 2));
            fill_x(xs[i], MX, K, 600 + i);
        }
        float* y;
        CK(cudaMalloc(&y, (size_t)MX * N * 4));
        for (int M : ts.Ms) {
            const double flop = 2.0 * M * N * K;
            auto line = [&](int P, const char* vn, const char* form, double us) {
                const double tf = flop * P / (us * 1e-6) / 1e12;  // tensor-core work actually issued
                const double gbs = wbytes / (us * 1e-6) / 1e9;
                printf("%6d %5d %2d %-4s %-6s %10.2f %9.1f %9.0f %6.1f%%\n", N, M, P, form, vn, us, tf, gbs,
                       100.0 * gbs / bw_ceiling_gbs);
                fprintf(log,
                        "time N=%d K=%d M=%d P=%d form=%s var=%s us=%.3f tc_tflops=%.2f useful_tflops=%.2f "
                        "w_gbs=%.1f\n",
                        N, K, M, P, form, vn, us, tf, flop / (us * 1e-6) / 1e12, gbs);
            };
            for (int P = 1; P <= 3; ++P) {
                for (int i = 0; i < nx; ++i) split(P, xs[i], ps[i], (size_t)M * K);
                CK(cudaDeviceSynchronize());
                const double us_split = tm.median_us([&](int i) { split(P, xs[i % nx], ps[i % nx], (size_t)M * K); });
                fprintf(log, "time N=%d K=%d M=%d P=%d var=split us=%.3f\n", N, K, M, P, us_split);
                for (int fold = 0; fold < 2; ++fold)
                for (int v = VR; v <= VL; ++v) {
                    if (v <= VD32 && M > 256) continue;  // one m16 tile per block: decode shapes only
                    if (v == VS && M > 1024) continue;
                    g_fold = fold;
                    const double us = tm.median_us(
                        [&](int i) { gemm(P, (Var)v, ps[i % nx], ws[i % nw], y, M, N, K); });
                    line(P, var_name[v], fold_tag(), us);
                }
                g_fold = false;
                printf("%6d %5d %2d %-5s %10.2f\n", N, M, P, "split", us_split);
            }
#ifdef HAVE_CUBLAS
            const float alpha = 1.f, beta = 0.f;
            const double us = tm.median_us([&](int i) {
                cublasStatus_t st = cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, ws[i % nw], CUDA_R_16BF,
                                                 K, ps[i % nx], CUDA_R_16BF, K, &beta, y, CUDA_R_32F, N,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                if (st != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasGemmEx failed %d\n", (int)st); exit(4); }
            });
            line(1, "cublas", "bf16", us);
#endif
        }
        for (auto p : ws) CK(cudaFree(p));
        for (int i = 0; i < nx; ++i) { CK(cudaFree(xs[i])); CK(cudaFree(ps[i])); }
        CK(cudaFree(y));
    }
}

static double copy_bw(FILE* log) {
    const size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    Timer tm;
    const double us = tm.median_us([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 2, 9, 2);
    CK(cudaFree(a));
    CK(cudaFree(b));
    const double gbs = 2.0 * bytes / (us * 1e-6) / 1e9;
    printf("device copy: %.0f GB/s (read+write)\n", gbs);
    fprintf(log, "copy_bw_gbs=%.1f\n", gbs);
    return gbs;
}

int main(int argc, char** argv) {
    const char* what = argc > 1 ? argv[1] : "all";
    const char* logpath = argc > 2 ? argv[2] : "tc_raw.log";
    FILE* log = fopen(logpath, "w");
    if (!log) { perror("log"); return 1; }
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    g_smem_optin = (int)pr.sharedMemPerBlockOptin;
    printf("device: %s, %d SMs, L2 %d MB, smem optin %d KB, cc %d.%d\n", pr.name, pr.multiProcessorCount,
           pr.l2CacheSize >> 20, g_smem_optin >> 10, pr.major, pr.minor);
    fprintf(log, "device=%s sms=%d l2=%d cc=%d.%d\n", pr.name, pr.multiProcessorCount, pr.l2CacheSize, pr.major,
            pr.minor);
    std::string w = what;
    int fails = 0;
    if (w == "san") { g_small = true; accuracy(log); }
    if (w == "all" || w == "acc") accuracy(log);
    fflush(log);
    if (w == "all" || w == "inv") fails = invariance(log);
    fflush(log);
    if (w == "all" || w == "time") timing(log, copy_bw(log));
    fprintf(log, "invariance_fails=%d\n", fails);
    fclose(log);
    printf("\ninvariance failures: %d\n", fails);
    return fails ? 1 : 0;
}
