//! Linear kernels: one warp an output column over a tile of up to RT rows; plain, fused gate-up (SwiGLU) and MoE expert-grouped forms.
// The reduction order (the row-invariance promise): for a weight row of length k, lane l of the warp accumulates
// with fmaf the elements of its chunks l, l+32, l+64, ... in increasing order, where a chunk is 8 consecutive
// elements when k (and a Q8 matrix's group) is a multiple of 8 (the "v8" kernels), else 1 element (the "v1"
// kernels); then the 32 lane sums fold by warp_sum's butterfly. Which form runs depends only on the matrix, and a
// tile shares each weight load across its rows but never an accumulator, so a row's bits depend only on its own
// values and k: not on the call's row count, its tiling, or the other rows.

struct Mat {
  const void* w;        // f32 values, bf16 bits or Q8 codes, row-major [n, k]
  const float* scales;  // Q8 only: [n, k / group]
  const float* biases;  // Q8 only: [n, k / group]
  int group;            // Q8 only: elements a group
};

// 8 consecutive weights of row `row` from column c (c % 8 == 0, k % 8 == 0, Q8: group % 8 == 0, so the 8 share
// one group). Row starts are then 16-byte (f32, bf16) or 8-byte (Q8) aligned: device allocations are 256-byte aligned.
template <int DT>
__device__ __forceinline__ void load_w8(const Mat& m, u64 row, int k, int c, float* o) {
  u64 at = row * (u64)k + (u64)c;
  if (DT == DT_F32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(m.w) + at);
    float4 a = __ldg(p);
    float4 b = __ldg(p + 1);
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
  } else if (DT == DT_BF16) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const u16*>(m.w) + at);
    uint4 a = __ldg(p);
    // Little-endian: element c is the low half of the first word.
    o[0] = __uint_as_float(a.x << 16); o[1] = __uint_as_float(a.x & 0xffff0000u);
    o[2] = __uint_as_float(a.y << 16); o[3] = __uint_as_float(a.y & 0xffff0000u);
    o[4] = __uint_as_float(a.z << 16); o[5] = __uint_as_float(a.z & 0xffff0000u);
    o[6] = __uint_as_float(a.w << 16); o[7] = __uint_as_float(a.w & 0xffff0000u);
  } else {
    const uint2* p = reinterpret_cast<const uint2*>(static_cast<const u8*>(m.w) + at);
    uint2 a = __ldg(p);
    u64 g = row * (u64)(k / m.group) + (u64)(c / m.group);
    float s = __ldg(m.scales + g);
    float b = __ldg(m.biases + g);
    o[0] = fmaf((float)(a.x & 0xffu), s, b); o[1] = fmaf((float)((a.x >> 8) & 0xffu), s, b);
    o[2] = fmaf((float)((a.x >> 16) & 0xffu), s, b); o[3] = fmaf((float)(a.x >> 24), s, b);
    o[4] = fmaf((float)(a.y & 0xffu), s, b); o[5] = fmaf((float)((a.y >> 8) & 0xffu), s, b);
    o[6] = fmaf((float)((a.y >> 16) & 0xffu), s, b); o[7] = fmaf((float)(a.y >> 24), s, b);
  }
}

// Weight (row, i) widened to f32.
template <int DT>
__device__ __forceinline__ float load_w1(const Mat& m, u64 row, int k, int i) {
  u64 at = row * (u64)k + (u64)i;
  if (DT == DT_F32) return __ldg(static_cast<const float*>(m.w) + at);
  if (DT == DT_BF16) return bf16_to_f32(__ldg(static_cast<const u16*>(m.w) + at));
  u64 g = row * (u64)(k / m.group) + (u64)(i / m.group);
  return fmaf((float)__ldg(static_cast<const u8*>(m.w) + at), __ldg(m.scales + g), __ldg(m.biases + g));
}

// This lane's part of the dots of weight row `row` of m0 (and of m1 when NW == 2) with the tile's rows xs[0..nr).
// `rev` walks the lane's chunks backwards: only the planted FAULT_LINEAR_BATCH_ORDER sets it.
template <int DT, int V, int NW>
__device__ __forceinline__ void tile_dot(const Mat& m0, const Mat& m1, u64 row, int k, const float* const* xs, int nr,
                                         float* a0, float* a1, bool rev) {
  int lane = threadIdx.x & 31;
  int first = lane * V;
  int steps = first < k ? (k - first + 32 * V - 1) / (32 * V) : 0;
  for (int s = 0; s < steps; s++) {
    int c = first + 32 * V * (rev ? steps - 1 - s : s);
    if (V == 8) {
      float w0[8];
      float w1[8];
      load_w8<DT>(m0, row, k, c, w0);
      if (NW == 2) load_w8<DT>(m1, row, k, c, w1);
#ifdef FAULT_LINEAR_DROP_LAST
      if (c + 8 == k) { w0[7] = 0.0f; w1[7] = 0.0f; }
#endif
#pragma unroll
      for (int r = 0; r < RT; r++) {
        if (r < nr) {
          const float4* xp = reinterpret_cast<const float4*>(xs[r] + c);
          float4 xa = __ldg(xp);
          float4 xb = __ldg(xp + 1);
          float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
          for (int e = 0; e < 8; e++) {
            a0[r] = fmaf(w0[e], xv[e], a0[r]);
            if (NW == 2) a1[r] = fmaf(w1[e], xv[e], a1[r]);
          }
        }
      }
    } else {
      float w0 = load_w1<DT>(m0, row, k, c);
      float w1 = NW == 2 ? load_w1<DT>(m1, row, k, c) : 0.0f;
#ifdef FAULT_LINEAR_DROP_LAST
      if (c + 1 == k) { w0 = 0.0f; w1 = 0.0f; }
#endif
#pragma unroll
      for (int r = 0; r < RT; r++) {
        if (r < nr) {
          float xv = __ldg(xs[r] + c);
          a0[r] = fmaf(w0, xv, a0[r]);
          if (NW == 2) a1[r] = fmaf(w1, xv, a1[r]);
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

// out[r, j] = dot(x[r], w[j]) (+ bias[j]) for the tile of rows row0 + blockIdx.y * RT ..; column j is this warp's.
template <int DT, int V>
__device__ __forceinline__ void linear_tile(const float* x, int rows, int k, int n, Mat m, const float* bias, float* out,
                                            int row0) {
  int warp = threadIdx.x >> 5;
  int lane = threadIdx.x & 31;
  int j = blockIdx.x * WPB + warp;
  int r0 = row0 + (int)blockIdx.y * RT;
  if (j >= n || r0 >= rows) return;  // whole warps leave together
  int nr = rows - r0 < RT ? rows - r0 : RT;
  const float* xs[RT];
  float a0[RT];
  float a1[RT];
#pragma unroll
  for (int r = 0; r < RT; r++) {
    xs[r] = x + (u64)(r0 + (r < nr ? r : 0)) * (u64)k;
    a0[r] = 0.0f;
    a1[r] = 0.0f;
  }
  bool rev = false;
#ifdef FAULT_LINEAR_BATCH_ORDER
  rev = rows > 1;
#endif
  tile_dot<DT, V, 1>(m, m, (u64)j, k, xs, nr, a0, a1, rev);
#pragma unroll
  for (int r = 0; r < RT; r++) {
    if (r < nr) {
      float v = warp_sum(a0[r]);
      if (lane == 0) out[(u64)(r0 + r) * (u64)n + j] = bias ? v + bias[j] : v;
    }
  }
}

// act[r, j] = silu(dot(x[r], g[j])) * dot(x[r], u[j]): the SwiGLU gate and up projections in one pass over x.
template <int DT, int V>
__device__ __forceinline__ void gateup_tile(const float* x, int rows, int k, int n, Mat g, Mat u, float* act, int row0) {
  int warp = threadIdx.x >> 5;
  int lane = threadIdx.x & 31;
  int j = blockIdx.x * WPB + warp;
  int r0 = row0 + (int)blockIdx.y * RT;
  if (j >= n || r0 >= rows) return;
  int nr = rows - r0 < RT ? rows - r0 : RT;
  const float* xs[RT];
  float a0[RT];
  float a1[RT];
#pragma unroll
  for (int r = 0; r < RT; r++) {
    xs[r] = x + (u64)(r0 + (r < nr ? r : 0)) * (u64)k;
    a0[r] = 0.0f;
    a1[r] = 0.0f;
  }
  tile_dot<DT, V, 2>(g, u, (u64)j, k, xs, nr, a0, a1, false);
#pragma unroll
  for (int r = 0; r < RT; r++) {
    if (r < nr) {
      float gv = warp_sum(a0[r]);
      float uv = warp_sum(a1[r]);
      if (lane == 0) act[(u64)(r0 + r) * (u64)n + j] = silu_mul(gv, uv);
    }
  }
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
template <int DT, int V>
__device__ __forceinline__ void moe_gateup_tile(const float* x, int k, int n, const u64* tab, int group, const int* tiles,
                                                const int* ntiles, const int* list, int kk, float* act, int tile0) {
  int warp = threadIdx.x >> 5;
  int lane = threadIdx.x & 31;
  int t = tile0 + (int)blockIdx.y;
  int j = blockIdx.x * WPB + warp;
  if (t >= *ntiles || j >= n) return;
  int e = tiles[3 * t];
  int s0 = tiles[3 * t + 1];
  int nr = tiles[3 * t + 2];
  const float* xs[RT];
  float a0[RT];
  float a1[RT];
#pragma unroll
  for (int r = 0; r < RT; r++) {
    xs[r] = x + (u64)(list[s0 + (r < nr ? r : 0)] / kk) * (u64)k;
    a0[r] = 0.0f;
    a1[r] = 0.0f;
  }
  Mat g = expert_mat(tab, e, 0, group);
  Mat u = expert_mat(tab, e, 1, group);
  tile_dot<DT, V, 2>(g, u, (u64)j, k, xs, nr, a0, a1, false);
#pragma unroll
  for (int r = 0; r < RT; r++) {
    if (r < nr) {
      float gv = warp_sum(a0[r]);
      float uv = warp_sum(a1[r]);
      if (lane == 0) act[(u64)(s0 + r) * (u64)n + j] = silu_mul(gv, uv);
    }
  }
}

// MoE down projection over one expert tile: y[list[s], j] = dot(act[s], w2[j]).
template <int DT, int V>
__device__ __forceinline__ void moe_down_tile(const float* act, int k, int n, const u64* tab, int group, const int* tiles,
                                              const int* ntiles, const int* list, float* y, int tile0) {
  int warp = threadIdx.x >> 5;
  int lane = threadIdx.x & 31;
  int t = tile0 + (int)blockIdx.y;
  int j = blockIdx.x * WPB + warp;
  if (t >= *ntiles || j >= n) return;
  int e = tiles[3 * t];
  int s0 = tiles[3 * t + 1];
  int nr = tiles[3 * t + 2];
  const float* xs[RT];
  float a0[RT];
  float a1[RT];
#pragma unroll
  for (int r = 0; r < RT; r++) {
    xs[r] = act + (u64)(s0 + (r < nr ? r : 0)) * (u64)k;
    a0[r] = 0.0f;
    a1[r] = 0.0f;
  }
  Mat w = expert_mat(tab, e, 2, group);
  tile_dot<DT, V, 1>(w, w, (u64)j, k, xs, nr, a0, a1, false);
#pragma unroll
  for (int r = 0; r < RT; r++) {
    if (r < nr) {
      float v = warp_sum(a0[r]);
      if (lane == 0) y[(u64)list[s0 + r] * (u64)n + j] = v;
    }
  }
}

// Entry points, one per (dtype, chunk form): linear_bf16_v8, gateup_q8_v1, moe_down_f32_v8, ...
#define TF_DENSE_ENTRIES(NAME, DT, V)                                                                                \
  extern "C" __global__ void __launch_bounds__(256) linear_##NAME(                                                  \
      const float* x, int rows, int k, int n, const void* w, const float* ws, const float* wb, int group,            \
      const float* bias, float* out, int row0) {                                                                     \
    Mat m;                                                                                                           \
    m.w = w; m.scales = ws; m.biases = wb; m.group = group;                                                          \
    linear_tile<DT, V>(x, rows, k, n, m, bias, out, row0);                                                           \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) gateup_##NAME(                                                  \
      const float* x, int rows, int k, int n, const void* g, const float* gs, const float* gb, const void* u,        \
      const float* us, const float* ub, int group, float* act, int row0) {                                           \
    Mat mg;                                                                                                          \
    mg.w = g; mg.scales = gs; mg.biases = gb; mg.group = group;                                                      \
    Mat mu;                                                                                                          \
    mu.w = u; mu.scales = us; mu.biases = ub; mu.group = group;                                                      \
    gateup_tile<DT, V>(x, rows, k, n, mg, mu, act, row0);                                                            \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) moe_gateup_##NAME(                                              \
      const float* x, int k, int n, const u64* tab, int group, const int* tiles, const int* ntiles, const int* list, \
      int kk, float* act, int tile0) {                                                                               \
    moe_gateup_tile<DT, V>(x, k, n, tab, group, tiles, ntiles, list, kk, act, tile0);                                \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) moe_down_##NAME(                                                \
      const float* act, int k, int n, const u64* tab, int group, const int* tiles, const int* ntiles,                \
      const int* list, float* y, int tile0) {                                                                        \
    moe_down_tile<DT, V>(act, k, n, tab, group, tiles, ntiles, list, y, tile0);                                      \
  }

TF_DENSE_ENTRIES(f32_v8, DT_F32, 8)
TF_DENSE_ENTRIES(f32_v1, DT_F32, 1)
TF_DENSE_ENTRIES(bf16_v8, DT_BF16, 8)
TF_DENSE_ENTRIES(bf16_v1, DT_BF16, 1)
TF_DENSE_ENTRIES(q8_v8, DT_Q8, 8)
TF_DENSE_ENTRIES(q8_v1, DT_Q8, 1)
