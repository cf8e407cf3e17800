//! Attention kernels: K/V appends into each stream's cache, and GQA softmax attention over a row's keys in FIXED chunks of KEY_CHUNK keys (per-chunk partials, then a combine in chunk order).
// A row's keys are its stream's cache rows [0, ckeys) followed by `own` rows of the call's k/v input starting at
// call row `first` (the block pass's whole block; for causal attention the segment's rows up to the row itself,
// which attn_combine then appends to the cache).
// The chunks of a row depend only on its key count, and every reduction inside a chunk is a fixed tree over the
// block's 256 threads, so a row's bits do not depend on the call's other rows.

// Row descriptor, 4 words a call row: d[0] cache K, d[1] cache V (f32 [held, width]); d[2] low 32 bits the cache
// keys the row sees, high 32 bits its own block rows; d[3] the first call row of its block.
struct RowKv {
  const float* k;
  const float* v;
  int ckeys;
  int own;
  int first;
};

__device__ __forceinline__ RowKv row_kv(const u64* desc, u64 row) {
  const u64* d = desc + 4 * row;
  RowKv r;
  r.k = (const float*)d[0];
  r.v = (const float*)d[1];
  r.ckeys = (int)(d[2] & 0xffffffffull);
  r.own = (int)(d[2] >> 32);
  r.first = (int)d[3];
#ifdef FAULT_ATTN_FIRST_STREAM
  r.k = (const float*)desc[0];
  r.v = (const float*)desc[1];
  int c0 = (int)(desc[2] & 0xffffffffull);
  r.ckeys = r.ckeys < c0 ? r.ckeys : c0;
#endif
#ifdef FAULT_ATTN_SKIP_NEWEST
  if (r.own > 0) r.own = r.own - 1;
#endif
#ifdef FAULT_BLOCK_CAUSAL
  if (r.own > 0) r.own = (int)(row - (u64)r.first) + 1;
#endif
  return r;
}

// Row j of a row's keys (or values), at column `off` (the KV head's first column).
__device__ __forceinline__ const float* kv_row(const RowKv& r, const float* cache, const float* in, int j, int width, int off) {
  return j < r.ckeys ? cache + (u64)j * (u64)width + off : in + (u64)(r.first + j - r.ckeys) * (u64)width + off;
}

// q . k over hd in 8 interleaved accumulators (d mod 8; a tail past a multiple of 8 goes to the first), folded as a
// fixed tree: the order depends only on hd.
__device__ __forceinline__ float dot_head(const float* q, const float* k, int hd) {
  float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int d = 0;
  for (; d + 8 <= hd; d += 8) {
#pragma unroll
    for (int e = 0; e < 8; e++) a[e] = fmaf(q[d + e], k[d + e], a[e]);
  }
  for (; d < hd; d++) a[0] = fmaf(q[d], k[d], a[0]);
  float b0 = a[0] + a[4];
  float b1 = a[1] + a[5];
  float b2 = a[2] + a[6];
  float b3 = a[3] + a[7];
  return (b0 + b2) + (b1 + b3);
}

// Fixed-tree block reductions over the KEY_CHUNK threads of a block (all must call).
__device__ __forceinline__ float block_max(float v, float* red) {
  int t = threadIdx.x;
  red[t] = v;
  __syncthreads();
  for (int s = KEY_CHUNK / 2; s > 0; s >>= 1) {
    if (t < s) red[t] = fmaxf(red[t], red[t + s]);
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_sum(float v, float* red) {
  int t = threadIdx.x;
  red[t] = v;
  __syncthreads();
  for (int s = KEY_CHUNK / 2; s > 0; s >>= 1) {
    if (t < s) red[t] = red[t] + red[t + s];
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}

// Appends each segment's k, v rows to its cache: 4 words a segment (destination K and V, already at the cache's
// first new row; the first call row; the rows). blockIdx.y is the segment.
extern "C" __global__ void kv_append(const float* k, const float* v, const u64* segs, int width) {
  PDL_ENTRY();
  const u64* s = segs + 4 * (u64)blockIdx.y;
  float* dk = (float*)s[0];
  float* dv = (float*)s[1];
  u64 first = s[2];
  u64 n = s[3] * (u64)width;
  const float* sk = k + first * (u64)width;
  const float* sv = v + first * (u64)width;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    dk[i] = sk[i];
    dv[i] = sv[i];
  }
}

// One block of KEY_CHUNK threads a (chunk, head, row): thread t scores key chunk * KEY_CHUNK + t; the block takes the
// chunk's max m, p = exp(s - m), their sum l, and o[d] = sum of p * v[d] in key order; part gets (m, l, o[0..hd)).
// part is [launch rows, heads, max_chunks, hd + 2]. Dynamic shared memory: (hd + 2 * KEY_CHUNK) floats.
// `rows` (null: the launch's rows row0 + z in order): the call rows of the launch, one a z (a call whose other rows
// take the tiled form runs its one-row segments here).
extern "C" __global__ void __launch_bounds__(256) attn_partial(const float* q, const float* kin, const float* vin,
                                                               const u64* desc, int heads, int group, int hd, int width,
                                                               float scale, int max_chunks, float* part, int row0,
                                                               const u64* rows) {
  PDL_ENTRY();
  extern __shared__ float sm[];
  u64 row = rows ? rows[blockIdx.z] : (u64)row0 + blockIdx.z;
  int h = blockIdx.y;
  int chunk = blockIdx.x;
  int t = threadIdx.x;
  RowKv r = row_kv(desc, row);
  int keys = r.ckeys + r.own;
  int start = chunk * KEY_CHUNK;
  if (start >= keys) return;  // the whole block leaves together
  int off = (h / group) * hd;
  float* qs = sm;
  float* red = sm + hd;
  float* ps = red + KEY_CHUNK;
  const float* qh = q + (row * (u64)heads + (u64)h) * (u64)hd;
  for (int i = t; i < hd; i += KEY_CHUNK) qs[i] = qh[i];
  __syncthreads();
  int j = start + t;
  float s = -inf_f();
  if (j < keys) s = dot_head(qs, kv_row(r, r.k, kin, j, width, off), hd) * scale;
  float m = block_max(s, red);
  float p = j < keys ? exp_f(s - m) : 0.0f;
  ps[t] = p;
  float l = block_sum(p, red);  // its barriers also publish ps
  int nk = keys - start < KEY_CHUNK ? keys - start : KEY_CHUNK;
  float* out = part + (((u64)(row - (u64)row0) * (u64)heads + (u64)h) * (u64)max_chunks + (u64)chunk) * (u64)(hd + 2);
  if (hd > KEY_CHUNK) {
    for (int d = t; d < hd; d += KEY_CHUNK) {
      float o = 0.0f;
      for (int i = 0; i < nk; i++) o = fmaf(ps[i], kv_row(r, r.v, vin, start + i, width, off)[d], o);
      out[2 + d] = o;
    }
  } else {
    // G = KEY_CHUNK / hd groups of hd threads: group g sums keys g, g+G, ... in key order (G chains in flight, not
    // one), then thread d adds the G group sums in group order. The order depends only on nk and hd.
    int groups = KEY_CHUNK / hd;
    int g = t / hd;
    int d = t - g * hd;
    if (g < groups) {
      float o = 0.0f;
#pragma unroll 4
      for (int i = g; i < nk; i += groups) o = fmaf(ps[i], kv_row(r, r.v, vin, start + i, width, off)[d], o);
      red[t] = o;  // red is free after block_sum's last barrier
    }
    __syncthreads();
    if (t < hd) {
      float o = 0.0f;
      for (int gi = 0; gi < groups; gi++) o = o + red[gi * hd + t];
      out[2 + t] = o;
    }
  }
  if (t == 0) {
    out[0] = m;
    out[1] = l;
  }
}

// Combines a row's chunk partials in chunk order: M = max m_c, w_c = exp(m_c - M), out = sum o_c w_c / sum l_c w_c.
// One block a (head, row), threads over hd. With `append` (causal attention, whose own keys the partials read from
// kin/vin), the row's k and v also go to its cache row ckeys + own - 1 (its position; the host grew the cache), the
// row's heads sharing the copy: the append and the attention in one launch pair, not three launches.
extern "C" __global__ void attn_combine(const u64* desc, const float* part, int heads, int hd, int max_chunks, float* out,
                                        int row0, const float* kin, const float* vin, int width, int append) {
  PDL_ENTRY();
  u64 row = (u64)row0 + blockIdx.y;
  int h = blockIdx.x;
  RowKv r = row_kv(desc, row);
  int keys = r.ckeys + r.own;
  int nch = (keys + KEY_CHUNK - 1) / KEY_CHUNK;
  const float* pp = part + ((u64)(row - (u64)row0) * (u64)heads + (u64)h) * (u64)max_chunks * (u64)(hd + 2);
  float m = -inf_f();
  for (int c = 0; c < nch; c++) m = fmaxf(m, pp[(u64)c * (u64)(hd + 2)]);
  bool rev = false;
#ifdef FAULT_ATTN_BATCH_ORDER
  rev = gridDim.y > 1;
#endif
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float l = 0.0f;
    float o = 0.0f;
    for (int i = 0; i < nch; i++) {
      int c = rev ? nch - 1 - i : i;
      const float* pc = pp + (u64)c * (u64)(hd + 2);
      float w = exp_f(pc[0] - m);
      l = l + pc[1] * w;
      o = o + pc[2 + d] * w;
    }
    out[(row * (u64)heads + (u64)h) * (u64)hd + d] = o / l;
  }
#ifdef FAULT_ATTN_NO_APPEND
  append = 0;
#endif
  if (!append) return;
  // The raw descriptor, not row_kv's: a planted read fault must not move the write.
  const u64* dw = desc + 4 * row;
  u64 at = ((dw[2] & 0xffffffffull) + (dw[2] >> 32) - 1) * (u64)width;
  float* dk = (float*)dw[0] + at;
  float* dv = (float*)dw[1] + at;
  const float* sk = kin + row * (u64)width;
  const float* sv = vin + row * (u64)width;
  for (int i = h * blockDim.x + threadIdx.x; i < width; i += heads * blockDim.x) {
    dk[i] = sk[i];
    dv[i] = sv[i];
  }
}
