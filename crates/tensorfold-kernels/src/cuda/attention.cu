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
extern "C" __global__ void __launch_bounds__(256) attn_partial(const float* q, const float* kin, const float* vin,
                                                               const u64* desc, int heads, int group, int hd, int width,
                                                               float scale, int max_chunks, float* part, int row0) {
  PDL_ENTRY();
  extern __shared__ float sm[];
  u64 row = (u64)row0 + blockIdx.z;
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

// ---- The tiled form of attn_partial, for calls whose segments hold many rows (prefill chunks, verify and drafter
// blocks). One block of KEY_CHUNK threads a (chunk, KV head, tile of consecutive rows of one segment): the rows of a
// tile share every key, so the chunk's K and V rows are read into shared memory once for all of them and all the
// KV head's query heads. Each (row, head) then gets attn_partial's arithmetic exactly: dot_head's order, the same
// max and sum trees over the chunk's 256 slots, the same P.V chains and group fold, so its partial is bit-equal to
// attn_partial's (the contract's `invariance` gate compares the two). A warp takes one (row, block of ATTN_HB
// heads) at a time; lane l owns keys l + 32 i (i < 8), so the trees' levels 128, 64 and 32 pair two keys of one lane
// and levels 16 to 1 are shuffles pairing lane t with lane t + s, as the block trees pair red[t] with red[t + s].
// Needs hd <= ATTN_TILE_HD and hd % 4 == 0 (the host checks). tiles: a word a tile, low 32 bits its first call
// row, high 32 bits its rows. Dynamic shared memory: KEY_CHUNK (hd + 1) floats of K (an odd row stride, so the 32
// lanes reading one column of 32 consecutive keys hit 32 distinct banks), KEY_CHUNK hd of V, and WPB ATTN_HB
// (hd + KEY_CHUNK) of each warp's query heads and probabilities.
#define ATTN_HB 4
#define ATTN_TILE_HD 64

// ATTN_HB dot_heads of one key at once (its loads shared): out[h] = dot_head(qh + h * hd, k, hd), same order.
__device__ __forceinline__ void dot_heads(const float* qh, const float* k, int hd, float* out) {
  float a[ATTN_HB][8];
#pragma unroll
  for (int h = 0; h < ATTN_HB; h++)
#pragma unroll
    for (int e = 0; e < 8; e++) a[h][e] = 0.0f;
  int d = 0;
  for (; d + 8 <= hd; d += 8) {
    float kv[8];
#pragma unroll
    for (int e = 0; e < 8; e++) kv[e] = k[d + e];
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++)
#pragma unroll
      for (int e = 0; e < 8; e++) a[h][e] = fmaf(qh[h * hd + d + e], kv[e], a[h][e]);
  }
  for (; d < hd; d++)
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) a[h][0] = fmaf(qh[h * hd + d], k[d], a[h][0]);
#pragma unroll
  for (int h = 0; h < ATTN_HB; h++) {
    float b0 = a[h][0] + a[h][4];
    float b1 = a[h][1] + a[h][5];
    float b2 = a[h][2] + a[h][6];
    float b3 = a[h][3] + a[h][7];
    out[h] = (b0 + b2) + (b1 + b3);
  }
}

// The block trees of attn_partial over 256 slots held 8 a lane (slot l + 32 i in v[i]): max (sum with `add`).
// Every lane gets the result.
__device__ __forceinline__ float lane_tree(const float* v, bool add, int lane) {
#ifdef FAULT_ATTN_TILE_ORDER
  // Planted: the tiled form pairs the slots in another order (a sum's bits move; the max's do not).
  float a0 = add ? v[0] + v[1] : fmaxf(v[0], v[1]);
  float a1 = add ? v[2] + v[3] : fmaxf(v[2], v[3]);
  float a2 = add ? v[4] + v[5] : fmaxf(v[4], v[5]);
  float a3 = add ? v[6] + v[7] : fmaxf(v[6], v[7]);
#else
  float a0 = add ? v[0] + v[4] : fmaxf(v[0], v[4]);  // level 128: slot t with t + 128
  float a1 = add ? v[1] + v[5] : fmaxf(v[1], v[5]);
  float a2 = add ? v[2] + v[6] : fmaxf(v[2], v[6]);
  float a3 = add ? v[3] + v[7] : fmaxf(v[3], v[7]);
#endif
  float b0 = add ? a0 + a2 : fmaxf(a0, a2);  // level 64
  float b1 = add ? a1 + a3 : fmaxf(a1, a3);
  float c = add ? b0 + b1 : fmaxf(b0, b1);  // level 32
  for (int s = 16; s > 0; s >>= 1) {
    // Lane t < s takes lane t + s's value, as red[t] takes red[t + s]; lanes past s compute what nothing reads.
    float o = __shfl_sync(0xffffffffu, c, (lane + s) & 31);
    c = add ? c + o : fmaxf(c, o);
  }
  return __shfl_sync(0xffffffffu, c, 0);
}

extern "C" __global__ void __launch_bounds__(256) attn_tiled(const float* q, const float* kin, const float* vin,
                                                             const u64* desc, const u64* tiles, int heads, int group,
                                                             int hd, int width, float scale, int max_chunks,
                                                             float* part, int row0) {
  PDL_ENTRY();
  extern __shared__ float sm[];
  int chunk = blockIdx.x;
  int kvh = blockIdx.y;
  u64 tw = tiles[blockIdx.z];
  u64 first = tw & 0xffffffffull;
  int n = (int)(tw >> 32);
  int start = chunk * KEY_CHUNK;
  // The tile's rows share every key; the row that sees the most names where each one is read from.
  u64 far = first;
  int most = 0;
  for (int i = 0; i < n; i++) {
    RowKv r = row_kv(desc, first + (u64)i);
    if (r.ckeys + r.own > most) {
      most = r.ckeys + r.own;
      far = first + (u64)i;
    }
  }
  if (start >= most) return;  // the whole block leaves together
  RowKv rf = row_kv(desc, far);
  int nk_most = most - start < KEY_CHUNK ? most - start : KEY_CHUNK;
  int ks = hd + 1;
  int off = kvh * hd;
  float* kt = sm;
  float* vt = kt + KEY_CHUNK * ks;
  for (int e = threadIdx.x; e < nk_most * hd; e += blockDim.x) {
    int j = e / hd;
    int d = e - j * hd;
    kt[j * ks + d] = kv_row(rf, rf.k, kin, start + j, width, off)[d];
    vt[j * hd + d] = kv_row(rf, rf.v, vin, start + j, width, off)[d];
  }
  __syncthreads();
  int warp = threadIdx.x >> 5;
  int lane = threadIdx.x & 31;
  float* qw = vt + KEY_CHUNK * hd + warp * ATTN_HB * (hd + KEY_CHUNK);
  float* pw = qw + ATTN_HB * hd;
  int hblocks = (group + ATTN_HB - 1) / ATTN_HB;
  int groups = KEY_CHUNK / hd;
  for (int item = warp; item < n * hblocks; item += WPB) {
    int ri = item / hblocks;
    int hb = item - ri * hblocks;
    u64 row = first + (u64)ri;
    RowKv r = row_kv(desc, row);
    int keys = r.ckeys + r.own;
    if (start >= keys) continue;  // the whole warp: attn_partial writes no partial for this chunk either
    int nk = keys - start < KEY_CHUNK ? keys - start : KEY_CHUNK;
    int h0 = kvh * group + hb * ATTN_HB;
    int nh = group - hb * ATTN_HB < ATTN_HB ? group - hb * ATTN_HB : ATTN_HB;
    const float* qrow = q + (row * (u64)heads + (u64)h0) * (u64)hd;
    for (int e = lane; e < ATTN_HB * hd; e += 32) qw[e] = e < nh * hd ? qrow[e] : 0.0f;
    __syncwarp();
    float s[ATTN_HB][8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int j = lane + 32 * i;
      float dots[ATTN_HB] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (j < nk) dot_heads(qw, kt + j * ks, hd, dots);
#pragma unroll
      for (int h = 0; h < ATTN_HB; h++) s[h][i] = j < nk ? dots[h] * scale : -inf_f();
    }
    float m[ATTN_HB];
    float l[ATTN_HB];
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) {
      m[h] = lane_tree(s[h], false, lane);
#pragma unroll
      for (int i = 0; i < 8; i++) {
        int j = lane + 32 * i;
        s[h][i] = j < nk ? exp_f(s[h][i] - m[h]) : 0.0f;
        pw[h * KEY_CHUNK + j] = s[h][i];
      }
      l[h] = lane_tree(s[h], true, lane);
    }
    __syncwarp();
    // P.V: slot t = g hd + d of the 256 (g < groups) chains keys g, g + groups, ... in key order, as thread t does.
    float o[8][ATTN_HB];
#pragma unroll
    for (int u = 0; u < 8; u++) {
      int slot = lane + 32 * u;
      int g = slot / hd;
      int d = slot - g * hd;
#pragma unroll
      for (int h = 0; h < ATTN_HB; h++) o[u][h] = 0.0f;
      if (g < groups) {
        for (int i = g; i < nk; i += groups) {
          float vv = vt[i * hd + d];
#pragma unroll
          for (int h = 0; h < ATTN_HB; h++) o[u][h] = fmaf(pw[h * KEY_CHUNK + i], vv, o[u][h]);
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < 8; u++)
#pragma unroll
      for (int h = 0; h < ATTN_HB; h++) pw[h * KEY_CHUNK + lane + 32 * u] = o[u][h];
    __syncwarp();
    for (int h = 0; h < nh; h++) {
      float* out = part + (((u64)(row - (u64)row0) * (u64)heads + (u64)(h0 + h)) * (u64)max_chunks + (u64)chunk) *
                              (u64)(hd + 2);
      for (int d = lane; d < hd; d += 32) {
        float acc = 0.0f;
        for (int gi = 0; gi < groups; gi++) acc = acc + pw[h * KEY_CHUNK + gi * hd + d];
        out[2 + d] = acc;
      }
      if (lane == 0) {
        out[0] = m[h];
        out[1] = l[h];
      }
    }
    __syncwarp();
  }
}
