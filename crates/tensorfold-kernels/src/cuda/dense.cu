//! Linear kernels: a warp computes CT output columns over a tile of up to RT rows, or one column a row at a time with several loads in flight; plain, fused gate-up (SwiGLU) and MoE expert-grouped forms.
// The reduction order (the row-invariance promise): for a weight row of length k, lane l of the warp accumulates
// with fmaf the elements of its chunks l, l+32, l+64, ... in increasing order, where a chunk is 8 consecutive
// elements when k (and a Q8 matrix's group) is a multiple of 8 (the "v8" kernels), else 1 element (the "v1"
// kernels); then the 32 lane sums fold by warp_sum's butterfly. Which form runs depends only on the matrix, and a
// tile shares each weight load across its rows but never an accumulator, so a row's bits depend only on its own
// values and k: not on the call's row count, its tiling, or the other rows.

struct Mat {
  const void* w;        // f32 values, bf16 bits, Q8 codes or Q4 code pairs, row-major [n, k]
  const float* scales;  // Q8, Q4 only: [n, k / group]
  const float* biases;  // Q8, Q4 only: [n, k / group]
  int group;            // Q8, Q4 only: elements a group
};

// 8 consecutive weights of row `row` from column c as loaded (c % 8 == 0, k % 8 == 0, Q8 / Q4: group % 8 == 0, so
// the 8 share one group), widened to f32 only by widen8: a group of loads can be in flight before the first
// multiply. Row starts are then 16-byte (f32, bf16), 8-byte (Q8) or 4-byte (Q4) aligned: device allocations are
// 256-byte aligned.
struct Raw8 {
  uint4 a;  // bf16: 8 values; f32: the first 4; Q8: .x, .y the 8 codes; Q4: .x the 8 codes
  uint4 b;  // f32: the last 4
  float s;  // Q8, Q4: the group's scale
  float o;  // Q8, Q4: the group's bias
};

template <int DT>
__device__ __forceinline__ Raw8 load_raw8(const Mat& m, u64 row, int k, int c) {
  u64 at = row * (u64)k + (u64)c;
  Raw8 r;
  if (DT == DT_F32) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(m.w) + at);
    r.a = __ldg(p);
    r.b = __ldg(p + 1);
  } else if (DT == DT_BF16) {
    r.a = __ldg(reinterpret_cast<const uint4*>(static_cast<const u16*>(m.w) + at));
  } else {
    if (DT == DT_Q4) {
      // 8 codes are one 4-byte word at byte at / 2 (at % 8 == 0).
      r.a.x = __ldg(reinterpret_cast<const u32*>(static_cast<const u8*>(m.w) + at / 2));
    } else {
      uint2 a = __ldg(reinterpret_cast<const uint2*>(static_cast<const u8*>(m.w) + at));
      r.a.x = a.x;
      r.a.y = a.y;
    }
    u64 g = row * (u64)(k / m.group) + (u64)(c / m.group);
    r.s = __ldg(m.scales + g);
    r.o = __ldg(m.biases + g);
  }
  return r;
}

template <int DT>
__device__ __forceinline__ void widen8(const Raw8& r, float* o) {
  if (DT == DT_F32) {
    o[0] = __uint_as_float(r.a.x); o[1] = __uint_as_float(r.a.y);
    o[2] = __uint_as_float(r.a.z); o[3] = __uint_as_float(r.a.w);
    o[4] = __uint_as_float(r.b.x); o[5] = __uint_as_float(r.b.y);
    o[6] = __uint_as_float(r.b.z); o[7] = __uint_as_float(r.b.w);
  } else if (DT == DT_BF16) {
    // Little-endian: element c is the low half of the first word.
    o[0] = __uint_as_float(r.a.x << 16); o[1] = __uint_as_float(r.a.x & 0xffff0000u);
    o[2] = __uint_as_float(r.a.y << 16); o[3] = __uint_as_float(r.a.y & 0xffff0000u);
    o[4] = __uint_as_float(r.a.z << 16); o[5] = __uint_as_float(r.a.z & 0xffff0000u);
    o[6] = __uint_as_float(r.a.w << 16); o[7] = __uint_as_float(r.a.w & 0xffff0000u);
  } else if (DT == DT_Q4) {
    u32 x = r.a.x;
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = fmaf((float)((x >> (4 * e)) & 0xfu), r.s, r.o);
  } else {
    u32 x = r.a.x;
    u32 y = r.a.y;
    o[0] = fmaf((float)(x & 0xffu), r.s, r.o); o[1] = fmaf((float)((x >> 8) & 0xffu), r.s, r.o);
    o[2] = fmaf((float)((x >> 16) & 0xffu), r.s, r.o); o[3] = fmaf((float)(x >> 24), r.s, r.o);
    o[4] = fmaf((float)(y & 0xffu), r.s, r.o); o[5] = fmaf((float)((y >> 8) & 0xffu), r.s, r.o);
    o[6] = fmaf((float)((y >> 16) & 0xffu), r.s, r.o); o[7] = fmaf((float)(y >> 24), r.s, r.o);
  }
}

// Weight (row, i) widened to f32.
template <int DT>
__device__ __forceinline__ float load_w1(const Mat& m, u64 row, int k, int i) {
  u64 at = row * (u64)k + (u64)i;
  if (DT == DT_F32) return __ldg(static_cast<const float*>(m.w) + at);
  if (DT == DT_BF16) return bf16_to_f32(__ldg(static_cast<const u16*>(m.w) + at));
  u64 g = row * (u64)(k / m.group) + (u64)(i / m.group);
  if (DT == DT_Q4) {
    u32 q = (__ldg(static_cast<const u8*>(m.w) + at / 2) >> (4 * (at & 1))) & 0xfu;
    return fmaf((float)q, __ldg(m.scales + g), __ldg(m.biases + g));
  }
  return fmaf((float)__ldg(static_cast<const u8*>(m.w) + at), __ldg(m.scales + g), __ldg(m.biases + g));
}

// This lane's part of the dots of weight rows row .. row + nc - 1 (nc <= C) of m0 (and of m1 when NW == 2) with
// the tile's rows xs[0..nr) (nr <= R), into a0[r * C + q] (a1). The lane's chunks are loaded U at a time (all U
// loads issued before the first multiply) and multiplied in the same increasing order whatever U, R or C: U puts
// more loads in flight, C reuses each x load over C columns, and neither changes a bit. The one-row kernels (R = 1)
// take U = 8, C = 1; the RT-row tiles U = 1, C = CT (their registers go to the rows and columns).
// `rev` walks the lane's chunks backwards: only a planted fault (the contract's batch-order control) sets it.
template <int DT, int V, int NW, int R, int U, int C>
__device__ __forceinline__ void tile_dot(const Mat& m0, const Mat& m1, u64 row, int nc, int k, const float* const* xs,
                                         int nr, float* a0, float* a1, bool rev) {
  int lane = threadIdx.x & 31;
  int first = lane * V;
  int steps = first < k ? (k - first + 32 * V - 1) / (32 * V) : 0;
  for (int s0 = 0; s0 < steps; s0 += U) {
    int n = steps - s0 < U ? steps - s0 : U;
    if (V == 8) {
      Raw8 r0[U][C];
      Raw8 r1[U][C];
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (u < n) {
          int c = first + 32 * V * (rev ? steps - 1 - (s0 + u) : s0 + u);
#pragma unroll
          for (int q = 0; q < C; q++) {
            u64 w = row + (u64)(q < nc ? q : 0);
            r0[u][q] = load_raw8<DT>(m0, w, k, c);
            if (NW == 2) r1[u][q] = load_raw8<DT>(m1, w, k, c);
          }
        }
      }
#pragma unroll
      for (int p = 0; p < U; p++) {
#ifdef FAULT_LINEAR_R1_ORDER
        int u = R == 1 ? U - 1 - p : p;
#else
        int u = p;
#endif
        if (u < n) {
          int c = first + 32 * V * (rev ? steps - 1 - (s0 + u) : s0 + u);
          float w0[C][8];
          float w1[C][8];
#pragma unroll
          for (int q = 0; q < C; q++) {
            widen8<DT>(r0[u][q], w0[q]);
            if (NW == 2) widen8<DT>(r1[u][q], w1[q]);
#ifdef FAULT_LINEAR_DROP_LAST
            if (c + 8 == k) { w0[q][7] = 0.0f; w1[q][7] = 0.0f; }
#endif
          }
#pragma unroll
          for (int r = 0; r < R; r++) {
            if (r < nr) {
              const float4* xp = reinterpret_cast<const float4*>(xs[r] + c);
              float4 xa = __ldg(xp);
              float4 xb = __ldg(xp + 1);
              float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
              for (int q = 0; q < C; q++) {
#pragma unroll
                for (int e = 0; e < 8; e++) {
                  a0[r * C + q] = fmaf(w0[q][e], xv[e], a0[r * C + q]);
                  if (NW == 2) a1[r * C + q] = fmaf(w1[q][e], xv[e], a1[r * C + q]);
                }
              }
            }
          }
        }
      }
    } else {
      float w0[U][C];
      float w1[U][C];
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (u < n) {
          int c = first + 32 * V * (rev ? steps - 1 - (s0 + u) : s0 + u);
#pragma unroll
          for (int q = 0; q < C; q++) {
            u64 w = row + (u64)(q < nc ? q : 0);
            w0[u][q] = load_w1<DT>(m0, w, k, c);
            w1[u][q] = NW == 2 ? load_w1<DT>(m1, w, k, c) : 0.0f;
          }
        }
      }
#pragma unroll
      for (int p = 0; p < U; p++) {
#ifdef FAULT_LINEAR_R1_ORDER
        int u = R == 1 ? U - 1 - p : p;
#else
        int u = p;
#endif
        if (u < n) {
          int c = first + 32 * V * (rev ? steps - 1 - (s0 + u) : s0 + u);
#pragma unroll
          for (int r = 0; r < R; r++) {
            if (r < nr) {
              float xv = __ldg(xs[r] + c);
#pragma unroll
              for (int q = 0; q < C; q++) {
                float v0 = w0[u][q];
                float v1 = w1[u][q];
#ifdef FAULT_LINEAR_DROP_LAST
                if (c + 1 == k) { v0 = 0.0f; v1 = 0.0f; }
#endif
                a0[r * C + q] = fmaf(v0, xv, a0[r * C + q]);
                if (NW == 2) a1[r * C + q] = fmaf(v1, xv, a1[r * C + q]);
              }
            }
          }
        }
      }
    }
  }
}

// silu(g) * u as the CPU writes it: g / (1 + exp(-g)) * u.
__device__ __forceinline__ float silu_mul(float g, float u) {
#ifdef FAULT_SWIGLU_SWAPPED
  float t = g; g = u; u = t;
#endif
  return g / (1.0f + exp_f(-g)) * u;
}

// The warp's outputs, columns j .. j + nc - 1 (nc <= C), over a tile of nt slots (nt <= RT), R slots at a time:
// slot i reads input row in_row(i) of x (k values) and hands its dot with m0's row j + q (and m1's, when NW == 2)
// to put(i, q, v0, v1) on lane 0. Each (slot, column) accumulator starts from 0 and folds alone, so R, U and C
// change no bit.
template <int DT, int V, int NW, int R, int U, int C, class In, class Put>
__device__ __forceinline__ void tile_run(const Mat& m0, const Mat& m1, int j, int nc, int k, int nt, const float* x,
                                         In in_row, Put put, bool rev) {
  int lane = threadIdx.x & 31;
  for (int b = 0; b < nt; b += R) {
    int nr = nt - b < R ? nt - b : R;
    const float* xs[R];
    float a0[R * C];
    float a1[R * C];
#pragma unroll
    for (int r = 0; r < R; r++) xs[r] = x + (u64)in_row(b + (r < nr ? r : 0)) * (u64)k;
#pragma unroll
    for (int i = 0; i < R * C; i++) {
      a0[i] = 0.0f;
      a1[i] = 0.0f;
    }
    tile_dot<DT, V, NW, R, U, C>(m0, m1, (u64)j, nc, k, xs, nr, a0, a1, rev);
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
      for (int q = 0; q < C; q++) {
        if (r < nr && q < nc) {
          float v0 = warp_sum(a0[r * C + q]);
          float v1 = NW == 2 ? warp_sum(a1[r * C + q]) : 0.0f;
          if (lane == 0) put(b + r, q, v0, v1);
        }
      }
    }
  }
}

// The first output column of this warp of block bx along x (C columns a warp, WPB warps a block) and how many it
// has of n.
template <int C>
__device__ __forceinline__ int warp_cols_at(int bx, int n, int* nc) {
  int j = (bx * WPB + (threadIdx.x >> 5)) * C;
  *nc = n - j < C ? n - j : C;
  return j;
}

template <int C>
__device__ __forceinline__ int warp_cols(int n, int* nc) {
  return warp_cols_at<C>(blockIdx.x, n, nc);
}

// out[r, j] = dot(x[r], w[j]) (+ bias[j]) for the tile of rows row0 + blockIdx.y * RT ..; the warp's columns j of
// block bx along x.
template <int DT, int V, int R, int U, int C>
__device__ __forceinline__ void linear_tile(const float* x, int rows, int k, int n, Mat m, const float* bias, float* out,
                                            int row0, int bx) {
  int nc;
  int j = warp_cols_at<C>(bx, n, &nc);
  int r0 = row0 + (int)blockIdx.y * RT;
  if (nc <= 0 || r0 >= rows) return;  // whole warps leave together
  bool rev = false;
#ifdef FAULT_LINEAR_BATCH_ORDER
  rev = rows > 1;
#endif
  auto in_row = [&](int i) { return r0 + i; };
  auto put = [&](int i, int q, float v, float) {
    out[(u64)(r0 + i) * (u64)n + j + q] = bias ? v + bias[j + q] : v;
  };
  tile_run<DT, V, 1, R, U, C>(m, m, j, nc, k, rows - r0 < RT ? rows - r0 : RT, x, in_row, put, rev);
}

// act[r, j] = silu(dot(x[r], g[j])) * dot(x[r], u[j]): the SwiGLU gate and up projections in one pass over x.
template <int DT, int V, int R, int U, int C>
__device__ __forceinline__ void gateup_tile(const float* x, int rows, int k, int n, Mat g, Mat u, float* act, int row0) {
  int nc;
  int j = warp_cols<C>(n, &nc);
  int r0 = row0 + (int)blockIdx.y * RT;
  if (nc <= 0 || r0 >= rows) return;
  auto in_row = [&](int i) { return r0 + i; };
  auto put = [&](int i, int q, float gv, float uv) { act[(u64)(r0 + i) * (u64)n + j + q] = silu_mul(gv, uv); };
  tile_run<DT, V, 2, R, U, C>(g, u, j, nc, k, rows - r0 < RT ? rows - r0 : RT, x, in_row, put, false);
}

// Expert matrices of a MoE call, 9 words an expert: w1, w1 scales, w1 biases, w3 (same), w2 (same).
__device__ __forceinline__ Mat expert_mat(const u64* tab, int e, int which, int group) {
  const u64* p = tab + 9 * (u64)e + 3 * (u64)which;
  Mat m;
  m.w = (const void*)p[0];
  m.scales = (const float*)p[1];
  m.biases = (const float*)p[2];
  m.group = group;
  return m;
}

// MoE gate-up over one expert tile: tile t = tile0 + blockIdx.y holds (expert, first slot, slots); slot s is the
// assignment list[s] = row * kk + rank, whose input row is x[list[s] / kk]. act[s, j] as gateup_tile.
template <int DT, int V, int R, int U, int C>
__device__ __forceinline__ void moe_gateup_tile(const float* x, int k, int n, const u64* tab, int group, const int* tiles,
                                                const int* ntiles, const int* list, int kk, float* act, int tile0) {
  int t = tile0 + (int)blockIdx.y;
  int nc;
  int j = warp_cols<C>(n, &nc);
  if (t >= *ntiles || nc <= 0) return;
  int e = tiles[3 * t];
  int s0 = tiles[3 * t + 1];
  auto in_row = [&](int i) { return list[s0 + i] / kk; };
  auto put = [&](int i, int q, float gv, float uv) { act[(u64)(s0 + i) * (u64)n + j + q] = silu_mul(gv, uv); };
  Mat g = expert_mat(tab, e, 0, group);
  Mat u = expert_mat(tab, e, 1, group);
  tile_run<DT, V, 2, R, U, C>(g, u, j, nc, k, tiles[3 * t + 2], x, in_row, put, false);
}

// MoE down projection over one expert tile: y[list[s], j] = dot(act[s], w2[j]).
template <int DT, int V, int R, int U, int C>
__device__ __forceinline__ void moe_down_tile(const float* act, int k, int n, const u64* tab, int group, const int* tiles,
                                              const int* ntiles, const int* list, float* y, int tile0) {
  int t = tile0 + (int)blockIdx.y;
  int nc;
  int j = warp_cols<C>(n, &nc);
  if (t >= *ntiles || nc <= 0) return;
  int e = tiles[3 * t];
  int s0 = tiles[3 * t + 1];
  auto in_row = [&](int i) { return s0 + i; };
  auto put = [&](int i, int q, float v, float) { y[(u64)list[s0 + i] * (u64)n + j + q] = v; };
  Mat w = expert_mat(tab, e, 2, group);
  tile_run<DT, V, 1, R, U, C>(w, w, j, nc, k, tiles[3 * t + 2], act, in_row, put, false);
}

// Linears of one input in one launch (linear3_*, the q, k and v projections): mats holds 6 words a matrix (values,
// scales, biases, outputs n, out, its first block along x), up to 3 matrices, unused ones with a first block past
// the grid. Returns this block's matrix i and its block index within that matrix; each matrix's outputs are then
// computed exactly as its own linear launch would, so the bits equal three launches'.
__device__ __forceinline__ int multi_block(const u64* mats, int* i) {
  int b = blockIdx.x;
  int m = 0;
  while (m < 2 && (u64)b >= mats[6 * (m + 1) + 5]) m++;
  *i = m;
#ifdef FAULT_LINEAR_MULTI_OFFSET
  if (m == 2) return b - (int)mats[6 * m + 5] + 1;  // planted: the last matrix's first block skipped
#endif
  return b - (int)mats[6 * m + 5];
}

// Entry points, one per (dtype, chunk form, row form): linear_bf16_v8 (tiles of RT rows), linear_bf16_v8_r1 (one
// row at a time, U chunks in flight a lane), gateup_q8_v1, moe_down_f32_v8_r1, ... The host takes the _r1 form for
// calls of at most 4 rows (Dev::one_row); both forms give every row the same bits. A warp of a tile form covers CT columns
// (CT / 2 for the gate-up forms, which read two matrices), of a one-row form 1.
#define GC(C) ((C + 1) / 2)
#define TF_DENSE_ENTRIES(NAME, DT, V, R, U, C)                                                                         \
  extern "C" __global__ void __launch_bounds__(256) linear_##NAME(                                                     \
      const float* x, int rows, int k, int n, const void* w, const float* ws, const float* wb, int group,              \
      const float* bias, float* out, int row0) {                                                                       \
    PDL_ENTRY();                                                                                                       \
    Mat m;                                                                                                             \
    m.w = w; m.scales = ws; m.biases = wb; m.group = group;                                                            \
    linear_tile<DT, V, R, U, C>(x, rows, k, n, m, bias, out, row0, blockIdx.x);                                        \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) linear3_##NAME(const float* x, int rows, int k, int group,         \
                                                                   const u64* mats, int row0) {                        \
    PDL_ENTRY();                                                                                                       \
    int i;                                                                                                             \
    int bx = multi_block(mats, &i);                                                                                    \
    const u64* d = mats + 6 * i;                                                                                       \
    Mat m;                                                                                                             \
    m.w = (const void*)d[0]; m.scales = (const float*)d[1]; m.biases = (const float*)d[2]; m.group = group;            \
    linear_tile<DT, V, R, U, C>(x, rows, k, (int)d[3], m, 0, (float*)d[4], row0, bx);                                  \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) gateup_##NAME(                                                     \
      const float* x, int rows, int k, int n, const void* g, const float* gs, const float* gb, const void* u,          \
      const float* us, const float* ub, int group, float* act, int row0) {                                             \
    PDL_ENTRY();                                                                                                       \
    Mat mg;                                                                                                            \
    mg.w = g; mg.scales = gs; mg.biases = gb; mg.group = group;                                                        \
    Mat mu;                                                                                                            \
    mu.w = u; mu.scales = us; mu.biases = ub; mu.group = group;                                                        \
    gateup_tile<DT, V, R, U, GC(C)>(x, rows, k, n, mg, mu, act, row0);                                                 \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) moe_gateup_##NAME(                                                 \
      const float* x, int k, int n, const u64* tab, int group, const int* tiles, const int* ntiles, const int* list,   \
      int kk, float* act, int tile0) {                                                                                 \
    PDL_ENTRY();                                                                                                       \
    moe_gateup_tile<DT, V, R, U, GC(C)>(x, k, n, tab, group, tiles, ntiles, list, kk, act, tile0);                     \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) moe_down_##NAME(                                                   \
      const float* act, int k, int n, const u64* tab, int group, const int* tiles, const int* ntiles,                  \
      const int* list, float* y, int tile0) {                                                                          \
    PDL_ENTRY();                                                                                                       \
    moe_down_tile<DT, V, R, U, C>(act, k, n, tab, group, tiles, ntiles, list, y, tile0);                               \
  }

TF_DENSE_ENTRIES(f32_v8, DT_F32, 8, RT, 1, CT)
TF_DENSE_ENTRIES(f32_v1, DT_F32, 1, RT, 1, CT)
TF_DENSE_ENTRIES(bf16_v8, DT_BF16, 8, RT, 1, CT)
TF_DENSE_ENTRIES(bf16_v1, DT_BF16, 1, RT, 1, CT)
TF_DENSE_ENTRIES(q8_v8, DT_Q8, 8, RT, 1, CT)
TF_DENSE_ENTRIES(q8_v1, DT_Q8, 1, RT, 1, CT)
TF_DENSE_ENTRIES(q4_v8, DT_Q4, 8, RT, 1, CT)
TF_DENSE_ENTRIES(q4_v1, DT_Q4, 1, RT, 1, CT)
// One row: 8 chunks in flight a lane (a bf16 lane then holds 8 x 16 B of one weight row, 2 x that for gate-up);
// f32 chunks are twice the registers, so 4.
TF_DENSE_ENTRIES(f32_v8_r1, DT_F32, 8, 1, 4, 1)
TF_DENSE_ENTRIES(f32_v1_r1, DT_F32, 1, 1, 8, 1)
TF_DENSE_ENTRIES(bf16_v8_r1, DT_BF16, 8, 1, 8, 1)
TF_DENSE_ENTRIES(bf16_v1_r1, DT_BF16, 1, 1, 8, 1)
TF_DENSE_ENTRIES(q8_v8_r1, DT_Q8, 8, 1, 8, 1)
TF_DENSE_ENTRIES(q8_v1_r1, DT_Q8, 1, 1, 8, 1)
TF_DENSE_ENTRIES(q4_v8_r1, DT_Q4, 8, 1, 8, 1)
TF_DENSE_ENTRIES(q4_v1_r1, DT_Q4, 1, 1, 8, 1)

// Wide tiles, for calls of many rows (prefill; the host's Dev::wide): a block of 256 threads computes WTM rows by
// WTN columns, thread (ty, tx) = (t / 32, t % 32) the rows 4ty .. 4ty+3 and columns 4tx .. 4tx+3, from stages of
// shared memory, so each staged value feeds 4 rows or 4 columns of fmaf. The bits are the warp kernels' above:
// an output is warp_sum's butterfly tree over the 32 lane classes (class l: the chunks l, l+32, ... that lane l
// walks), each class an fmaf chain from +0 in increasing order. The block walks the classes one at a time in the
// tree's leaf order, bit-reversed l (0, 16, 8, 24, ...: the butterfly adds l and l^16 first), and folds each
// finished class into a stack of partial sums like a binary counter, so every pair is added where warp_sum adds it.
// A stage holds WJG chunks of one class for the tile's rows and columns, widened to f32 (as widen8).
#define WTM 32
#define WTN 128
#define WJG 8

struct alignas(16) WideSmem {  // read as float4
  float x[WJG * 8][WTM];  // [element of the stage][row]
  float w[WJG * 8][WTN];  // [element of the stage][column]
};

// Leaf p of the butterfly's tree is lane class bitrev5(p).
__device__ __forceinline__ int wide_class(int p) {
#ifdef FAULT_LINEAR_WIDE_TREE
  return p;  // planted: the classes folded in lane order, another tree
#else
  return ((p & 1) << 4) | ((p & 2) << 2) | (p & 4) | ((p & 8) >> 2) | ((p & 16) >> 4);
#endif
}

// Chunks lane class l walks over a row of k (tile_dot's `steps` for V = 8).
__device__ __forceinline__ int class_steps(int l, int k) { return 8 * l < k ? (k - 8 * l + 255) / 256 : 0; }

// Chunks of class l that group g of WJG holds.
__device__ __forceinline__ int stage_chunks(int l, int k, int g) {
  int d = class_steps(l, k) - WJG * g;
  return d < 0 ? 0 : (d > WJG ? WJG : d);
}

// One stage's global loads, held in registers while the stage before it is multiplied.
struct WideLoad {
  uint4 xa, xb;  // a row's chunk (f32 bits)
  Raw8 w[4];     // four weight chunks
};

// The loads of stage (class l, group g): thread t stages row t % 32 at chunk t / 32 and column (t % WTN) at chunks
// t / WTN + 2u. NW == 2 puts m0's columns j0 .. j0+63 at 0 .. 63 and m1's at 64 .. 127. Chunks past the class, rows
// past nt and columns past n are not loaded (they are never multiplied, or never written).
template <int DT, int NW, class In>
__device__ __forceinline__ void wide_fetch(const Mat& m0, const Mat& m1, int j0, int n, int k, int nt, const float* x,
                                           In in_row, int l, int g, int nv, WideLoad& ld) {
  int t = threadIdx.x;
  int jj = t >> 5;
  if ((t & 31) < nt && jj < nv) {
    const uint4* p = reinterpret_cast<const uint4*>(x + (u64)in_row(t & 31) * (u64)k + 8 * l + 256 * (8 * g + jj));
    ld.xa = __ldg(p);
    ld.xb = __ldg(p + 1);
  }
  int vc = t % WTN;
  int col = NW == 2 ? j0 + (vc & 63) : j0 + vc;
  const Mat& m = NW == 2 && vc >= 64 ? m1 : m0;
#pragma unroll
  for (int u = 0; u < 4; u++) {
    int cj = t / WTN + 2 * u;
    if (col < n && cj < nv) ld.w[u] = load_raw8<DT>(m, (u64)col, k, 8 * l + 256 * (8 * g + cj));
  }
}

// The held loads into shared memory, widened; what was not loaded is staged as zeros.
template <int DT>
__device__ __forceinline__ void wide_put(WideSmem& sm, int n_ok, int nt, int nv, const WideLoad& ld) {
  int t = threadIdx.x;
  int jj = t >> 5;
  bool xok = (t & 31) < nt && jj < nv;
  float xv[8] = {__uint_as_float(ld.xa.x), __uint_as_float(ld.xa.y), __uint_as_float(ld.xa.z),
                 __uint_as_float(ld.xa.w), __uint_as_float(ld.xb.x), __uint_as_float(ld.xb.y),
                 __uint_as_float(ld.xb.z), __uint_as_float(ld.xb.w)};
#pragma unroll
  for (int e = 0; e < 8; e++) sm.x[8 * jj + e][t & 31] = xok ? xv[e] : 0.0f;
#pragma unroll
  for (int u = 0; u < 4; u++) {
    int cj = t / WTN + 2 * u;
    float wv[8];
    widen8<DT>(ld.w[u], wv);
    bool ok = n_ok && cj < nv;
#pragma unroll
    for (int e = 0; e < 8; e++) sm.w[8 * cj + e][t % WTN] = ok ? wv[e] : 0.0f;
  }
}

// This thread's 4 x 4 outputs (rows 4ty + r, columns 4tx + c of the tile) into fin[r][c], bit-equal to tile_run's.
// Every thread of the block must call it (barriers).
template <int DT, int NW, class In>
__device__ __forceinline__ void wide_tile(WideSmem& sm, const Mat& m0, const Mat& m1, int j0, int n, int k, int nt,
                                          const float* x, In in_row, float fin[4][4]) {
  int t = threadIdx.x;
  int ty = t >> 5;
  int tx = t & 31;
  int vc = t % WTN;
  bool n_ok = (NW == 2 ? j0 + (vc & 63) : j0 + vc) < n;
  int groups = (class_steps(0, k) + WJG - 1) / WJG;
  float acc[4][4];
  float st[5][4][4];
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int c = 0; c < 4; c++) { acc[r][c] = 0.0f; fin[r][c] = 0.0f; }
  if (groups == 0) return;  // k == 0: every class is empty and the tree of +0 is +0
  WideLoad ld;
  wide_fetch<DT, NW>(m0, m1, j0, n, k, nt, x, in_row, wide_class(0), 0, stage_chunks(wide_class(0), k, 0), ld);
  for (int s = 0; s < 32 * groups; s++) {
    int p = s / groups;
    int g = s % groups;
    int l = wide_class(p);
    int nv = stage_chunks(l, k, g);
    __syncthreads();  // the stage before is multiplied
    wide_put<DT>(sm, n_ok, nt, nv, ld);
    __syncthreads();
    if (s + 1 < 32 * groups) {
      int p1 = (s + 1) / groups;
      int g1 = (s + 1) % groups;
      int l1 = wide_class(p1);
      wide_fetch<DT, NW>(m0, m1, j0, n, k, nt, x, in_row, l1, g1, stage_chunks(l1, k, g1), ld);
    }
#pragma unroll 8
    for (int e = 0; e < 8 * nv; e++) {
      float4 xv = *reinterpret_cast<const float4*>(&sm.x[e][4 * ty]);
      float4 wv = *reinterpret_cast<const float4*>(&sm.w[e][4 * tx]);
      float xr[4] = {xv.x, xv.y, xv.z, xv.w};
      float wc[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[r][c] = fmaf(wc[c], xr[r], acc[r][c]);
    }
    if (g == groups - 1) {
      // Leaf p done: add the stack's partial sums its binary counter carries into (p's trailing ones), then hold it.
      int carry = 0;
      while (carry < 5 && ((p >> carry) & 1)) carry++;
#pragma unroll
      for (int lv = 0; lv < 5; lv++)
        if (lv < carry)
#pragma unroll
          for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][c] = st[lv][r][c] + acc[r][c];
#pragma unroll
      for (int lv = 0; lv < 5; lv++)
        if (lv == carry)
#pragma unroll
          for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) st[lv][r][c] = acc[r][c];
      if (carry == 5)
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
          for (int c = 0; c < 4; c++) fin[r][c] = acc[r][c];
#pragma unroll
      for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[r][c] = 0.0f;
    }
  }
}

// The gate-up tile's activations: fin holds gate columns (tx < 16) or up columns (tx >= 16); they meet in shared
// memory, then thread t writes act for columns j0 + t % 64 of rows t / 64, +4, ... via put(i, j, silu_mul(g, u)).
template <class Put>
__device__ __forceinline__ void wide_gateup_out(WideSmem& sm, const float fin[4][4], int j0, int n, int nt, Put put) {
  float* o = &sm.w[0][0];  // [WTM][WTN]
  int t = threadIdx.x;
  __syncthreads();  // the last stage is multiplied
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int c = 0; c < 4; c++) o[(4 * (t >> 5) + r) * WTN + 4 * (t & 31) + c] = fin[r][c];
  __syncthreads();
  int j = t & 63;
  for (int i = t >> 6; i < nt; i += 4)
    if (j0 + j < n) put(i, j0 + j, silu_mul(o[i * WTN + j], o[i * WTN + 64 + j]));
}

// Plain tile outputs: put(i, j, v) for this thread's rows i < nt and columns j < n.
template <class Put>
__device__ __forceinline__ void wide_out(const float fin[4][4], int j0, int n, int nt, Put put) {
  int t = threadIdx.x;
#pragma unroll
  for (int r = 0; r < 4; r++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int i = 4 * (t >> 5) + r;
      int j = j0 + 4 * (t & 31) + c;
      if (i < nt && j < n) put(i, j, fin[r][c]);
    }
}

// Entry points linear_wide_bf16_v8, gateup_wide_q8_v8, moe_gateup_wide_f32_v8, moe_down_wide_bf16_v8, ...: grid x
// the row tiles of WTM rows (MoE: the plan's tiles, planned at WTM slots), grid y the column blocks (WTN columns,
// WTN / 2 for gate-up). Only the 8-element chunk form: the v1 matrices keep the warp kernels.
#define TF_WIDE_ENTRIES(NAME, DT)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) linear_wide_##NAME(                                                \
      const float* x, int rows, int k, int n, const void* w, const float* ws, const float* wb, int group,              \
      const float* bias, float* out) {                                                                                 \
    PDL_ENTRY();                                                                                                       \
    __shared__ WideSmem sm;                                                                                            \
    Mat m;                                                                                                             \
    m.w = w; m.scales = ws; m.biases = wb; m.group = group;                                                            \
    int r0 = blockIdx.x * WTM, j0 = blockIdx.y * WTN, nt = rows - r0 < WTM ? rows - r0 : WTM;                                       \
    float fin[4][4];                                                                                                   \
    wide_tile<DT, 1>(sm, m, m, j0, n, k, nt, x, [&](int i) { return r0 + i; }, fin);                                   \
    wide_out(fin, j0, n, nt, [&](int i, int j, float v) {                                                              \
      out[(u64)(r0 + i) * (u64)n + j] = bias ? v + bias[j] : v;                                                        \
    });                                                                                                                \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) gateup_wide_##NAME(                                                \
      const float* x, int rows, int k, int n, const void* g, const float* gs, const float* gb, const void* u,          \
      const float* us, const float* ub, int group, float* act) {                                                       \
    PDL_ENTRY();                                                                                                       \
    __shared__ WideSmem sm;                                                                                            \
    Mat mg;                                                                                                            \
    mg.w = g; mg.scales = gs; mg.biases = gb; mg.group = group;                                                        \
    Mat mu;                                                                                                            \
    mu.w = u; mu.scales = us; mu.biases = ub; mu.group = group;                                                        \
    int r0 = blockIdx.x * WTM, j0 = blockIdx.y * (WTN / 2), nt = rows - r0 < WTM ? rows - r0 : WTM;                                 \
    float fin[4][4];                                                                                                   \
    wide_tile<DT, 2>(sm, mg, mu, j0, n, k, nt, x, [&](int i) { return r0 + i; }, fin);                                 \
    wide_gateup_out(sm, fin, j0, n, nt, [&](int i, int j, float v) { act[(u64)(r0 + i) * (u64)n + j] = v; });         \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) moe_gateup_wide_##NAME(                                            \
      const float* x, int k, int n, const u64* tab, int group, const int* tiles, const int* ntiles, const int* list,   \
      int kk, float* act) {                                                                                            \
    PDL_ENTRY();                                                                                                       \
    __shared__ WideSmem sm;                                                                                            \
    int t = blockIdx.x;                                                                                                \
    if (t >= *ntiles) return;                                                                                          \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = blockIdx.y * (WTN / 2);                   \
    Mat mg = expert_mat(tab, e, 0, group);                                                                             \
    Mat mu = expert_mat(tab, e, 1, group);                                                                             \
    float fin[4][4];                                                                                                   \
    wide_tile<DT, 2>(sm, mg, mu, j0, n, k, nt, x, [&](int i) { return list[s0 + i] / kk; }, fin);                      \
    wide_gateup_out(sm, fin, j0, n, nt, [&](int i, int j, float v) { act[(u64)(s0 + i) * (u64)n + j] = v; });         \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) moe_down_wide_##NAME(                                              \
      const float* act, int k, int n, const u64* tab, int group, const int* tiles, const int* ntiles,                  \
      const int* list, float* y) {                                                                                     \
    PDL_ENTRY();                                                                                                       \
    __shared__ WideSmem sm;                                                                                            \
    int t = blockIdx.x;                                                                                                \
    if (t >= *ntiles) return;                                                                                          \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = blockIdx.y * WTN;                         \
    Mat w = expert_mat(tab, e, 2, group);                                                                              \
    float fin[4][4];                                                                                                   \
    wide_tile<DT, 1>(sm, w, w, j0, n, k, nt, act, [&](int i) { return s0 + i; }, fin);                                 \
    wide_out(fin, j0, n, nt, [&](int i, int j, float v) { y[(u64)list[s0 + i] * (u64)n + j] = v; });                  \
  }

TF_WIDE_ENTRIES(f32_v8, DT_F32)
TF_WIDE_ENTRIES(bf16_v8, DT_BF16)
TF_WIDE_ENTRIES(q8_v8, DT_Q8)
TF_WIDE_ENTRIES(q4_v8, DT_Q4)
