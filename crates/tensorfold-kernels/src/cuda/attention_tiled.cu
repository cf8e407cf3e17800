//! The tiled form of attn_partial (after attention.cu in its module): a tile of rows of one segment and a KV head share each key chunk's loads; every (row, head) keeps attn_partial's bits.
// For calls whose segments hold many rows (prefill chunks, verify and drafter blocks). One block of KEY_CHUNK threads
// a (chunk, KV head, tile of consecutive rows of one segment): the rows of a tile share every key, so the chunk's K and
// V rows are read into shared memory once for all of them and all the KV head's query heads. Each (row, head) then
// gets attn_partial's arithmetic exactly: dot_head's order, the same max and sum trees over the chunk's 256 slots, the
// same P.V chains and group fold, so its partial is bit-equal to attn_partial's (the contract's `invariance` gate
// compares the two). A warp takes one (row, block of ATTN_HB heads) at a time; lane l owns keys l + 32 i (i < 8), so
// the trees' levels 128, 64 and 32 pair two keys of one lane, and levels 16 to 1 are shuffles pairing lane t with lane
// t + s, as the block trees pair red[t] with red[t + s].
// Needs hd <= ATTN_TILE_HD and hd % 4 == 0 (the host checks). tiles: a word a tile, low 32 bits its first call row,
// high 32 bits its rows. Dynamic shared memory: KEY_CHUNK (hd + 1) floats of K (an odd row stride, so the 32 lanes
// reading one column of 32 consecutive keys hit 32 distinct banks), KEY_CHUNK hd of V, and WPB ATTN_HB
// (hd + KEY_CHUNK) of each warp's query heads and probabilities (16-byte aligned: every offset is a multiple of 4).
#define ATTN_HB 4
#define ATTN_TILE_HD 64

// dot_head of ATTN_HB query heads (qh, hd apart, 16-byte aligned) with two keys k0 and k1 at once: each query load
// serves both keys. out0[h] = dot_head(qh + h hd, k0, hd), out1[h] likewise with k1, in dot_head's order.
template <int HD>
__device__ __forceinline__ void dot_heads2(const float* qh, const float* k0, const float* k1, int hd, float* out0,
                                           float* out1) {
  const int D = HD > 0 ? HD : hd;
  float a[2][ATTN_HB][8];
#pragma unroll
  for (int t = 0; t < 2; t++)
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++)
#pragma unroll
      for (int e = 0; e < 8; e++) a[t][h][e] = 0.0f;
  int d = 0;
#pragma unroll 2
  for (; d + 8 <= D; d += 8) {
    float x0[8];
    float x1[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      x0[e] = k0[d + e];
      x1[e] = k1[d + e];
    }
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) {
      float4 lo = *reinterpret_cast<const float4*>(qh + h * D + d);
      float4 hi = *reinterpret_cast<const float4*>(qh + h * D + d + 4);
      float qv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int e = 0; e < 8; e++) {
        a[0][h][e] = fmaf(qv[e], x0[e], a[0][h][e]);
        a[1][h][e] = fmaf(qv[e], x1[e], a[1][h][e]);
      }
    }
  }
  for (; d < D; d++)
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) {
      a[0][h][0] = fmaf(qh[h * D + d], k0[d], a[0][h][0]);
      a[1][h][0] = fmaf(qh[h * D + d], k1[d], a[1][h][0]);
    }
#pragma unroll
  for (int t = 0; t < 2; t++)
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) {
      float b0 = a[t][h][0] + a[t][h][4];
      float b1 = a[t][h][1] + a[t][h][5];
      float b2 = a[t][h][2] + a[t][h][6];
      float b3 = a[t][h][3] + a[t][h][7];
      (t == 0 ? out0 : out1)[h] = (b0 + b2) + (b1 + b3);
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

// pv_chains (below) at any hd, where a slot's group may differ from lane to lane: each slot's chain walks its own
// keys.
__device__ __forceinline__ void pv_chains_any(const float* pw, const float* vt, int hd, int nk, int lane,
                                              float (*o)[ATTN_HB]) {
  int groups = KEY_CHUNK / hd;
#pragma unroll
  for (int u = 0; u < 8; u++) {
    int slot = lane + 32 * u;
    int g = slot / hd;
    int d = slot - g * hd;
    if (g < groups) {
      for (int i = g; i < nk; i += groups) {
        float vv = vt[i * hd + d];
#pragma unroll
        for (int h = 0; h < ATTN_HB; h++) o[u][h] = fmaf(pw[h * KEY_CHUNK + i], vv, o[u][h]);
      }
    }
  }
}

// P.V of one (row, head block): o[u][h] for slot t = lane + 32 u = g hd + d (g < groups = KEY_CHUNK / hd) chains
// keys g, g + groups, ... below nk in key order, fmaf(p, v, o), as attn_partial's thread t does. With HD known (32 or
// 64, so a slot's group is the same in every lane), the chains advance a row of groups keys at a time, each key's
// probabilities read once for the heads as broadcast vectors.
template <int HD>
__device__ __forceinline__ void pv_chains(const float* pw, const float* vt, int hd, int nk, int lane,
                                          float (*o)[ATTN_HB]) {
#pragma unroll
  for (int u = 0; u < 8; u++)
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) o[u][h] = 0.0f;
  if constexpr (HD == 32 || HD == 64) {
    const int G = KEY_CHUNK / HD;
    int base = 0;
    for (; base + G <= nk; base += G) {
      float p[ATTN_HB][G];
#pragma unroll
      for (int h = 0; h < ATTN_HB; h++)
#pragma unroll
        for (int g = 0; g < G; g += 4) {
          float4 v4 = *reinterpret_cast<const float4*>(pw + h * KEY_CHUNK + base + g);
          p[h][g] = v4.x;
          p[h][g + 1] = v4.y;
          p[h][g + 2] = v4.z;
          p[h][g + 3] = v4.w;
        }
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int g = 32 * u / HD;
        float vv = vt[(base + g) * HD + lane + 32 * u - g * HD];
#pragma unroll
        for (int h = 0; h < ATTN_HB; h++) o[u][h] = fmaf(p[h][g], vv, o[u][h]);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
      const int g = 32 * u / HD;
      if (base + g < nk) {
        float vv = vt[(base + g) * HD + lane + 32 * u - g * HD];
#pragma unroll
        for (int h = 0; h < ATTN_HB; h++) o[u][h] = fmaf(pw[h * KEY_CHUNK + base + g], vv, o[u][h]);
      }
    }
  } else {
    pv_chains_any(pw, vt, hd, nk, lane, o);
  }
}

// One (row, head block) of a tile: scores, softmax weights, P.V and the group fold into the row's partials.
struct TileItem {
  u64 row;  // the call row
  int h0;   // its first query head
  int nh;   // its heads (at most ATTN_HB)
  int nk;   // keys of this chunk the row sees
};

template <int HD>
__device__ __forceinline__ void tile_item(const TileItem& it, const float* q, const float* kt, const float* vt,
                                          float* qw, float* pw, int heads, int hd, float scale, int max_chunks,
                                          float* part, int row0, int chunk, int lane) {
  const int D = HD > 0 ? HD : hd;
  int ks = D + 1;
  const float* qrow = q + (it.row * (u64)heads + (u64)it.h0) * (u64)D;
  for (int e = lane; e < ATTN_HB * D; e += 32) qw[e] = e < it.nh * D ? qrow[e] : 0.0f;
  __syncwarp();
  float s[ATTN_HB][8];
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    int j0 = lane + 32 * i;
    int j1 = j0 + 32;
    float d0[ATTN_HB] = {0.0f, 0.0f, 0.0f, 0.0f};
    float d1[ATTN_HB] = {0.0f, 0.0f, 0.0f, 0.0f};
    // A key past nk reads row j0 again (in the chunk's shared memory) and is dropped below.
    if (j0 < it.nk) dot_heads2<HD>(qw, kt + j0 * ks, kt + (j1 < it.nk ? j1 : j0) * ks, D, d0, d1);
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) {
      s[h][i] = j0 < it.nk ? d0[h] * scale : -inf_f();
      s[h][i + 1] = j1 < it.nk ? d1[h] * scale : -inf_f();
    }
  }
  float m[ATTN_HB];
  float l[ATTN_HB];
#pragma unroll
  for (int h = 0; h < ATTN_HB; h++) {
    m[h] = lane_tree(s[h], false, lane);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int j = lane + 32 * i;
      s[h][i] = j < it.nk ? exp_f(s[h][i] - m[h]) : 0.0f;
      pw[h * KEY_CHUNK + j] = s[h][i];
    }
    l[h] = lane_tree(s[h], true, lane);
  }
  __syncwarp();
  float o[8][ATTN_HB];
  pv_chains<HD>(pw, vt, D, it.nk, lane, o);
  __syncwarp();
#pragma unroll
  for (int u = 0; u < 8; u++)
#pragma unroll
    for (int h = 0; h < ATTN_HB; h++) pw[h * KEY_CHUNK + lane + 32 * u] = o[u][h];
  __syncwarp();
  int groups = KEY_CHUNK / D;
  for (int h = 0; h < it.nh; h++) {
    u64 at = ((u64)(it.row - (u64)row0) * (u64)heads + (u64)(it.h0 + h)) * (u64)max_chunks + (u64)chunk;
    float* out = part + at * (u64)(D + 2);
    for (int d = lane; d < D; d += 32) {
      float acc = 0.0f;
      for (int gi = 0; gi < groups; gi++) acc = acc + pw[h * KEY_CHUNK + gi * D + d];
      out[2 + d] = acc;
    }
    if (lane == 0) {
      out[0] = m[h];
      out[1] = l[h];
    }
  }
  __syncwarp();
}

// The block's work after its chunk is in shared memory: the warps take the tile's (row, head block) items in turn.
template <int HD>
__device__ __forceinline__ void tile_items(const float* q, const u64* desc, u64 first, int n, int kvh, int heads,
                                           int group, int hd, float scale, int max_chunks, float* part, int row0,
                                           int chunk, const float* kt, const float* vt) {
  int warp = threadIdx.x >> 5;
  int lane = threadIdx.x & 31;
  float* qw = (float*)vt + KEY_CHUNK * hd + warp * ATTN_HB * (hd + KEY_CHUNK);
  float* pw = qw + ATTN_HB * hd;
  int hblocks = (group + ATTN_HB - 1) / ATTN_HB;
  int start = chunk * KEY_CHUNK;
  for (int item = warp; item < n * hblocks; item += WPB) {
    int ri = item / hblocks;
    int hb = item - ri * hblocks;
    TileItem it;
    it.row = first + (u64)ri;
    RowKv r = row_kv(desc, it.row);
    int keys = r.ckeys + r.own;
    if (start >= keys) continue;  // the whole warp: attn_partial writes no partial for this chunk either
    it.nk = keys - start < KEY_CHUNK ? keys - start : KEY_CHUNK;
    it.h0 = kvh * group + hb * ATTN_HB;
    it.nh = group - hb * ATTN_HB < ATTN_HB ? group - hb * ATTN_HB : ATTN_HB;
    tile_item<HD>(it, q, kt, vt, qw, pw, heads, hd, scale, max_chunks, part, row0, chunk, lane);
  }
}

// Takes attn_partial's arguments, `tiles` in place of its row list.
extern "C" __global__ void __launch_bounds__(256) attn_tiled(const float* q, const float* kin, const float* vin,
                                                             const u64* desc, int heads, int group, int hd, int width,
                                                             float scale, int max_chunks, float* part, int row0,
                                                             const u64* tiles) {
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
  if (hd == 64) {
    tile_items<64>(q, desc, first, n, kvh, heads, group, hd, scale, max_chunks, part, row0, chunk, kt, vt);
  } else if (hd == 32) {
    tile_items<32>(q, desc, first, n, kvh, heads, group, hd, scale, max_chunks, part, row0, chunk, kt, vt);
  } else {
    tile_items<0>(q, desc, first, n, kvh, heads, group, hd, scale, max_chunks, part, row0, chunk, kt, vt);
  }
}
