//! Row kernels: embedding gather, RMSNorm, elementwise add, row gather and the greedy pick.

// out[r, c] = table[ids[r * stride], c] widened exactly: bf16 by a 16-bit shift, Q8 as fmaf(code, scale, bias)
// (MatView::get). One thread an element. Host ids (stride 1) were checked against the table before the launch; ids a
// kernel wrote on the device (a draw's [token, status, index] words, stride 3) cannot be, so an id past the table
// gives a NaN row, which the next pick flags.
extern "C" __global__ void embed(const void* table, const float* scales, const float* biases, int group, int dtype,
                                 int vocab, const u32* ids, int stride, const u32* held, const int* pick,
                                 int rows, int h, float* out) {
  PDL_ENTRY();
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * (u64)h) return;
  u64 r = i / (u64)h;
  u64 c = i % (u64)h;
  u64 id = ids[r * (u64)stride];
#ifdef FAULT_EMBED_STRIDE_IGNORED
  id = ids[r];
#endif
  // Held drafts: row r takes the id of draw word pick[r] (a [token, status, index] triple) when pick[r] >= 0.
  if (pick != 0 && pick[r] >= 0) {
    int p = pick[r];
#ifdef FAULT_EMBED_HELD_PREV
    p = p > 0 ? p - 1 : p;
#endif
    id = held[3 * (u64)p];
  }
#ifdef FAULT_EMBED_OFF_BY_ONE
  id = min_u64(id + 1, (u64)(vocab - 1));
#endif
#ifdef FAULT_EMBED_CLAMP
  id = min_u64(id, (u64)(vocab - 1));
#endif
  if (id >= (u64)vocab) {
    out[i] = __uint_as_float(0x7fc00000u);
    return;
  }
  u64 at = id * (u64)h + c;
  float v;
  if (dtype == DT_F32) {
    v = ((const float*)table)[at];
  } else if (dtype == DT_BF16) {
    v = bf16_to_f32(((const u16*)table)[at]);
  } else {
    u64 g = id * (u64)(h / group) + c / (u64)group;
    u32 q = dtype == DT_Q4 ? (((const u8*)table)[at / 2] >> (4 * (at & 1))) & 0xfu : ((const u8*)table)[at];
    v = fmaf((float)q, scales[g], biases[g]);
  }
  out[i] = v;
}

// Elements a thread of a row kernel loads before it uses the first: up to NV loads in flight a thread.
#define NV 8

// The block's total of the threads' partial sums s: each warp folds by warp_sum, thread 0 adds the 8 warp sums in
// warp order from 0, and every thread gets the total. red holds WPB floats, total one (shared).
__device__ __forceinline__ float block_total(float s, float* red, float* total) {
  int t = threadIdx.x;
  s = warp_sum(s);
  if ((t & 31) == 0) red[t >> 5] = s;
  __syncthreads();
  if (t == 0) {
    float a = 0.0f;
    for (int i = 0; i < WPB; i++) a = a + red[i];
    *total = a;
  }
  __syncthreads();
  return *total;
}

// o[c] = x[c] * scale * w[c] for this thread's elements c = t, t + 256, ... (NV loaded before the first store).
__device__ __forceinline__ void scale_out(const float* xr, const float* w, float scale, int width, float* o) {
  for (int c0 = threadIdx.x; c0 < width; c0 += NV * 32 * WPB) {
    float a[NV];
    float g[NV];
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int c = c0 + u * 32 * WPB;
      if (c < width) {
        a[u] = xr[c];
        g[u] = w[c];
      }
    }
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int c = c0 + u * 32 * WPB;
      if (c < width) o[c] = a[u] * scale * g[u];
    }
  }
}

// Row-wise RMSNorm: x * (1 / sqrt(sumsq / width + eps)) * w.
// One block of 256 threads a row (a decode step's single row then has 8 warps of loads in flight, not one), in
// row_sumsq's order: thread t accumulates with fmaf the squares of elements t, t+256, ..., each warp folds by
// warp_sum, and thread 0 adds the 8 warp sums in warp order from 0. The order depends only on width.
extern "C" __global__ void __launch_bounds__(256) rmsnorm(const float* x, const float* w, float eps, int width, int rows,
                                                          float* out) {
  PDL_ENTRY();
  __shared__ float red[WPB];
  __shared__ float total;
  int r = blockIdx.x;
  if (r >= rows) return;  // the whole block leaves together
  const float* xr = x + (u64)r * (u64)width;
  float s = 0.0f;
  for (int i0 = threadIdx.x; i0 < width; i0 += NV * 32 * WPB) {
    float a[NV];
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int i = i0 + u * 32 * WPB;
      if (i < width) a[u] = xr[i];
    }
#pragma unroll
    for (int u = 0; u < NV; u++) {
      if (i0 + u * 32 * WPB < width) s = fmaf(a[u], a[u], s);
    }
  }
  float ss = block_total(s, red, &total);
  float n = (float)width;
#ifdef FAULT_RMS_NO_EPS
  eps = 0.0f;
#endif
#ifdef FAULT_RMS_WIDTH_M1
  n = (float)(width - 1);
#endif
  scale_out(xr, w, 1.0f / sqrtf(ss / n + eps), width, out + (u64)r * (u64)width);
}

// Elements a thread of a one-pass row kernel holds: rows of at most ONE_PASS = NV * 256 elements (2048: the hidden
// width of the LFM2 MoE models) are read, summed and written with every load in flight before the first use.
#define ONE_PASS (NV * 32 * WPB)

// The residual add fused with the next RMSNorm over row xr: xr[i] += y_i (written back), then, with a weight w,
// o = rmsnorm(xr) * w, with the same threads, elements and order as add_inplace then rmsnorm, so the bits equal the
// two launches'. fill(b) puts y_i of this thread's elements i = threadIdx.x + 256 u (u < NV, i < width) in b[u]
// (rows of at most ONE_PASS); y_at(i) gives one y_i (wider rows). The whole block must call it.
template <class Fill, class Y>
__device__ __forceinline__ void add_norm_row(float* xr, Fill fill, Y y_at, const float* w, float eps, int width,
                                             float* o) {
  __shared__ float red[WPB];
  __shared__ float total;
  float s = 0.0f;
  if (width <= ONE_PASS) {
    // One pass: x, y and the weight all loaded first; the sums stay in registers for the output.
    float a[NV];
    float b[NV];
    float g[NV];
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int i = threadIdx.x + u * 32 * WPB;
      if (i < width) {
        a[u] = xr[i];
        g[u] = w ? w[i] : 0.0f;
      }
    }
    fill(b);
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int i = threadIdx.x + u * 32 * WPB;
      if (i < width) {
        float v = a[u] + b[u];
#ifdef FAULT_ADDNORM_PRE
        s = fmaf(a[u], a[u], s);
#else
        s = fmaf(v, v, s);
#endif
        xr[i] = v;
        a[u] = v;
      }
    }
    if (!w) return;  // the last layer: the add alone (uniform over the block)
    float scale = 1.0f / sqrtf(block_total(s, red, &total) / (float)width + eps);
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int i = threadIdx.x + u * 32 * WPB;
      if (i < width) o[i] = a[u] * scale * g[u];
    }
    return;
  }
  for (int i0 = threadIdx.x; i0 < width; i0 += NV * 32 * WPB) {
    float a[NV];
    float b[NV];
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int i = i0 + u * 32 * WPB;
      if (i < width) {
        a[u] = xr[i];
        b[u] = y_at(i);
      }
    }
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int i = i0 + u * 32 * WPB;
      if (i < width) {
        float v = a[u] + b[u];
#ifdef FAULT_ADDNORM_PRE
        s = fmaf(a[u], a[u], s);
#else
        s = fmaf(v, v, s);
#endif
        xr[i] = v;
      }
    }
  }
  if (!w) return;
  float ss = block_total(s, red, &total);
  scale_out(xr, w, 1.0f / sqrtf(ss / (float)width + eps), width, o);
}

// x[r] += y[r], then out[r] = rmsnorm(x[r]) * w (add_norm_row). One block a row.
extern "C" __global__ void __launch_bounds__(256) add_rmsnorm(float* x, const float* y, const float* w, float eps,
                                                              int width, int rows, float* out) {
  PDL_ENTRY();
  int r = blockIdx.x;
  if (r >= rows) return;  // the whole block leaves together
  const float* yr = y + (u64)r * (u64)width;
  auto fill = [&](float* b) {
#pragma unroll
    for (int u = 0; u < NV; u++) {
      int i = threadIdx.x + u * 32 * WPB;
      if (i < width) b[u] = yr[i];
    }
  };
  add_norm_row(x + (u64)r * (u64)width, fill, [&](int i) { return yr[i]; }, w, eps, width, out + (u64)r * (u64)width);
}

// Ranks of a MoE combine whose loads are in flight together (the one-pass form).
#define COMBINE_RANKS 4

// The MoE combine fused with the residual add and the next RMSNorm: x[r] += moe_sum(y, wts, r, kk, width, i) (the
// combine's own arithmetic, common.cuh: each element from +0 in rank order), then out[r] = rmsnorm(x[r]) * w; w
// null: the add alone (the last layer). The bits equal moe_combine then add_rmsnorm (or add_inplace). One block a
// row; the one-pass form loads COMBINE_RANKS ranks of the thread's elements at a time.
extern "C" __global__ void __launch_bounds__(256) moe_combine_add_rmsnorm(float* x, const float* y, const float* wts,
                                                                          int kk, const float* w, float eps, int width,
                                                                          int rows, float* out) {
  PDL_ENTRY();
  int r = blockIdx.x;
  if (r >= rows) return;  // the whole block leaves together
  float* o = w ? out + (u64)r * (u64)width : 0;
  const float* yr = y + (u64)r * (u64)kk * (u64)width;
  const float* wr = wts + (u64)r * (u64)kk;
  auto fill = [&](float* b) {
#pragma unroll
    for (int u = 0; u < NV; u++) b[u] = 0.0f;
    for (int q0 = 0; q0 < kk; q0 += COMBINE_RANKS) {
      float yv[COMBINE_RANKS][NV];
      float wv[COMBINE_RANKS];
#pragma unroll
      for (int q = 0; q < COMBINE_RANKS; q++) {
        if (q0 + q < kk) {
          wv[q] = wr[q0 + q];
#pragma unroll
          for (int u = 0; u < NV; u++) {
            int i = threadIdx.x + u * 32 * WPB;
            if (i < width) yv[q][u] = yr[(u64)(q0 + q) * (u64)width + (u64)i];
          }
        }
      }
#pragma unroll
      for (int q = 0; q < COMBINE_RANKS; q++) {
#ifdef FAULT_COMBINE_FUSED_REVERSE
        int qq = COMBINE_RANKS - 1 - q;  // planted: the ranks of each group from the last
        bool live = q0 + qq < kk;
#else
        int qq = q;
        bool live = q0 + q < kk;
#endif
        if (live) {
#pragma unroll
          for (int u = 0; u < NV; u++) b[u] = b[u] + wv[qq] * yv[qq][u];
        }
      }
    }
  };
  auto y_at = [&](int i) { return moe_sum(y, wts, (u64)r, kk, (u64)width, (u64)i); };
  add_norm_row(x + (u64)r * (u64)width, fill, y_at, w, eps, width, o);
}

// acc[i] += y[i] for i < n.
extern "C" __global__ void add_inplace(float* acc, const float* y, u64 n) {
  PDL_ENTRY();
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = acc[i] + y[i];
}

// out[r] = x[idx[r]] for rows of `width`; the host checked every index against src_rows.
extern "C" __global__ void gather_rows(const float* x, int width, const u32* idx, int n_out, int src_rows, float* out) {
  PDL_ENTRY();
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)n_out * (u64)width) return;
  u64 r = i / (u64)width;
  u64 c = i % (u64)width;
  u64 s = idx[r];
#ifdef FAULT_GATHER_OFF_BY_ONE
  if (s + 1 < (u64)src_rows) s = s + 1;
#endif
  out[i] = x[s * (u64)width + c];
}

// Is (v, i) a better greedy candidate than (bv, bi)? Larger wins; equal values go to the lower id. Exact
// comparisons only, so any combining order gives the same winner.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
#ifdef FAULT_GREEDY_TIES_HIGH
  return v > bv || (v == bv && i > bi);
#else
  return v > bv || (v == bv && i < bi);
#endif
}

#define GREEDY_THREADS 1024

// Greedy pick of each row: one block of GREEDY_THREADS threads a row (the host launches exactly that many).
// picks[2r] is the first largest finite logit's id (0 when there is none), picks[2r+1] is 1 when the row holds a NaN
// or an infinity (or is empty). `total` is the buffer's length; the last row may be shorter than vocab, as the CPU's chunks are.
extern "C" __global__ void __launch_bounds__(GREEDY_THREADS) greedy(const float* logits, u64 total, int vocab,
                                                                     u32* picks) {
  PDL_ENTRY();
  __shared__ float sv[GREEDY_THREADS];
  __shared__ int si[GREEDY_THREADS];
  int t = threadIdx.x;
  u64 row = blockIdx.x;
  u64 base = row * (u64)vocab;
  int len = (int)min_u64((u64)vocab, total - base);
  const float* l = logits + base;
  float bv = 0.0f;
  int bi = -1;
  int nf = 0;
#pragma unroll 4
  for (int i = t; i < len; i += GREEDY_THREADS) {
    float v = l[i];
    if (!finite_f(v)) {
#ifdef FAULT_GREEDY_NAN
      if (!nan_f(v)) nf = 1;
#else
      nf = 1;
#endif
    } else if (bi < 0 || better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  sv[t] = bv;
  si[t] = bi;
  nf = __syncthreads_or(nf);
  for (int s = GREEDY_THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      int oi = si[t + s];
      float ov = sv[t + s];
      if (oi >= 0 && (si[t] < 0 || better(ov, oi, sv[t], si[t]))) {
        sv[t] = ov;
        si[t] = oi;
      }
    }
    __syncthreads();
  }
  if (t == 0) {
    picks[2 * row] = si[0] < 0 ? 0u : (u32)si[0];
    picks[2 * row + 1] = (nf != 0 || len == 0) ? 1u : 0u;
  }
}
