//! Attention on the tensor cores (the tensor-core mode's form of attn_partial, after attention.cu in its module): QK^T and P.V on mma.sync with q, k, p and v as three bf16 pieces, an online softmax over fixed 64-key sub-blocks.
// With TENSORFOLD_CUDA_TENSOR_CORES=1 every attention call (causal, and the drafter's block attention) runs attn_mma
// (or attn_mma_few, its bits for tiles of at most 16 pairs), a decode row and a prefill tile alike, so decode ==
// prefill, chunked == whole and concurrent == solo hold inside the mode. It fills attn_partial's partials (m, l, o
// of each (row, head, KEY_CHUNK-key chunk)) and attn_combine folds them as in the CUDA-core mode; the bits differ
// from attn_partial's (the contract's `cuda.attention_tc` states the bound).
// - A block is (chunk, KV head, tile of rows of one segment). Its (row, query head) pairs are the mmas' M rows, pair m
//   = (tile row m / group, head m % group), 16 a warp, AM_WARPS warps: a tile has at most AM_M / group rows (the host
//   cuts) and a decode row is a tile of one. An mma's output row depends only on its own A row, so a pair's bits
//   depend neither on the tile nor on its slot in it.
// - A chunk's keys go in sub-blocks of AM_SUB fixed by key position (a fixed split SIZE, never a count): keys
//   [start + AM_SUB b, start + AM_SUB (b + 1)). A sub-block's K and V enter shared memory as tc_pieces3 pieces once for
//   the whole tile; keys past the tile's last row's count are zero.
// - Scores: s = scale * (sum over the k16 steps, in order, of a fresh tensor-core partial over the six piece products
//   q_i k_j with i + j <= 2, in the order (0,0) (0,1) (1,0) (0,2) (1,1) (2,0)), each step added in f32 (the tensor
//   cores' internal sum is not IEEE, so each 16-long step is rounded in on its own). Keys past the row's own count
//   score -inf.
// - Per pair and sub-block: mx = max(m, the sub-block's max), alpha = exp(m - mx), p = exp(s - mx), l = l alpha + the
//   sum of p (each lane's 16 in key order, then lane t ^ 1's, then t ^ 2's), o = o alpha, then o += a fresh partial of
//   the six products p_i v_j for each k16 step of keys, in order. A sub-block holding none of the row's keys leaves
//   (m, l, o) as they were (selected), so the longer rows of a tile cost a shorter one no bit.
// Needs hd % 8 == 0 and hd <= AM_HD (the host refuses other shapes in the mode); head dims past hd up to HDP, the
// next multiple of 16, are zero in q, k and v (exact: they add zero products). tiles: a word a tile, low 32 bits its
// first call row, high 32 its rows. Dynamic shared memory: 3 AM_SUB (HDP / 2 + 4) words of K pieces and 3 HDP AM_VS
// words of V pieces (each row padded by 4 words, so the 8 rows one fragment load reads hit distinct banks), then
// AM_THREADS 3 (HDP / 16) 4 words of the lanes' query fragments, then 2 (AM_SUB / 8) 4 32 words of a decode tile's
// scores and probabilities (attn_mma_few_body's shs and shp).
// - A tile of at most 16 pairs (decode) runs attn_mma_few, which spreads a sub-block's scores, exps and output dims
//   over the block's warps (attn_mma_few_body) with the same chains, so the bits are the tile form's.
#define AM_SUB 64
#define AM_WARPS 4
#define AM_THREADS 128  // AM_WARPS warps
#define AM_M (16 * AM_WARPS)
#define AM_HD 64
#define AM_VS (AM_SUB / 2 + 4)

// tc_pieces3 with attention's planted control.
__device__ __forceinline__ void am_split(float v0, float v1, u32 p[3]) {
  tc_pieces3(v0, v1, p);
#ifdef FAULT_ATTN_MMA_DROP_LO
  p[1] = 0u;  // planted: q, k, p and v rounded to one bf16 piece
  p[2] = 0u;
#endif
}

// d += the six piece products of A (a[piece]) and B (b[piece][0..1]) in the header's order.
__device__ __forceinline__ void am_products(float d[4], const u32 a[3][4], const u32 b[3][2]) {
  tc_mma(d, a[0], b[0][0], b[0][1]);
  tc_mma(d, a[0], b[1][0], b[1][1]);
  tc_mma(d, a[1], b[0][0], b[0][1]);
  tc_mma(d, a[0], b[2][0], b[2][1]);
  tc_mma(d, a[1], b[1][0], b[1][1]);
  tc_mma(d, a[2], b[0][0], b[0][1]);
}

// A fragment word `w` of a row pair (v0, v1) split into its pieces: a[pc][w].
__device__ __forceinline__ void am_frag(float v0, float v1, u32 a[3][4], int w) {
  u32 p[3];
  am_split(v0, v1, p);
#pragma unroll
  for (int pc = 0; pc < 3; pc++) a[pc][w] = p[pc];
}

// This lane's B fragment of one k16 step: words at `at` and `at + 4` of each piece's plane (`plane` words apart).
__device__ __forceinline__ void am_bfrag(const u32* at, int plane, u32 b[3][2]) {
#pragma unroll
  for (int pc = 0; pc < 3; pc++) {
    b[pc][0] = at[pc * plane];
    b[pc][1] = at[pc * plane + 4];
  }
}

// The key count of call row `row` (its cache keys and own rows).
__device__ __forceinline__ int am_keys(const u64* desc, u64 row) {
  RowKv r = row_kv(desc, row);
  return r.ckeys + r.own;
}

// One sub-block's K and V into shared memory as pieces: kp[pc][key][pair] (pair = dims 2i, 2i+1), vp[pc][dim][key
// pair]; keys from `sk` on and dims from `hd` on are zero. Every load is 16 bytes (4 dims of a key row; hd % 8 == 0
// keeps a quad wholly in or out) and all are issued before the first is used, so a sub-block waits for memory once.
// A warp's V quads are 8 key pairs by 4 quads, so its 32-bit piece stores meet at most 2 to a bank.
template <int HDP>
__device__ __forceinline__ void am_stage(const RowKv& r, const float* kin, const float* vin, int hd, int width, int off,
                                         int j0, int sk, u32* kp, u32* vp) {
  constexpr int KS = HDP / 2 + 4;
  constexpr int Q = HDP / 4;                       // quads a key row
  constexpr int NK = AM_SUB * Q / AM_THREADS;      // K quads a thread
  constexpr int NV = AM_SUB / 2 * Q / AM_THREADS;  // V (key pair, quad)s a thread
  const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 kx[NK], va[NV], vb[NV];
#pragma unroll
  for (int n = 0; n < NK; n++) {
    int i = threadIdx.x + n * AM_THREADS, key = i / Q, qd = i - key * Q;
    bool in = key < sk && 4 * qd < hd;
    kx[n] = in ? *reinterpret_cast<const float4*>(kv_row(r, r.k, kin, j0 + key, width, off) + 4 * qd) : z;
  }
#pragma unroll
  for (int n = 0; n < NV; n++) {
    int i = threadIdx.x + n * AM_THREADS, w = i >> 5, l = i & 31;
    int kq = 8 * (w & 3) + (l & 7), qd = 4 * (w >> 2) + (l >> 3);
    bool in = 4 * qd < hd;
    const float* ra = kv_row(r, r.v, vin, j0 + 2 * kq, width, off) + 4 * qd;
    const float* rb = kv_row(r, r.v, vin, j0 + 2 * kq + 1, width, off) + 4 * qd;
    va[n] = in && 2 * kq < sk ? *reinterpret_cast<const float4*>(ra) : z;
    vb[n] = in && 2 * kq + 1 < sk ? *reinterpret_cast<const float4*>(rb) : z;
  }
  u32 p0[3], p1[3];
#pragma unroll
  for (int n = 0; n < NK; n++) {
    int i = threadIdx.x + n * AM_THREADS, key = i / Q, qd = i - key * Q;
    am_split(kx[n].x, kx[n].y, p0);
    am_split(kx[n].z, kx[n].w, p1);
#pragma unroll
    for (int pc = 0; pc < 3; pc++)
      *reinterpret_cast<uint2*>(kp + (pc * AM_SUB + key) * KS + 2 * qd) = make_uint2(p0[pc], p1[pc]);
  }
#pragma unroll
  for (int n = 0; n < NV; n++) {
    int i = threadIdx.x + n * AM_THREADS, w = i >> 5, l = i & 31;
    int kq = 8 * (w & 3) + (l & 7), qd = 4 * (w >> 2) + (l >> 3);
    const float a[4] = {va[n].x, va[n].y, va[n].z, va[n].w}, b[4] = {vb[n].x, vb[n].y, vb[n].z, vb[n].w};
#pragma unroll
    for (int c = 0; c < 4; c++) {
      am_split(a[c], b[c], p0);
#pragma unroll
      for (int pc = 0; pc < 3; pc++) vp[(pc * HDP + 4 * qd + c) * AM_VS + kq] = p0[pc];
    }
  }
}

// One pair's softmax state: the running max and the sum of p.
struct AmRow {
  float m;
  float l;
};

// The pair's new running max over the sub-block's scores s (half e2 = 0: row g's slots 0, 1; 2: row g + 8's
// slots 2, 3). `live`: the sub-block holds some of the pair's keys (by position, so a NaN score propagates as in
// attn_partial instead of reading as an empty sub-block); where not, the max is 0 and am_fold keeps the state.
__device__ __forceinline__ float am_newmax(const float (*s)[4], int e2, const AmRow& st, bool live) {
  float mx = -inf_f();
#pragma unroll
  for (int nt = 0; nt < AM_SUB / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][e2], s[nt][e2 + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  return live ? fmaxf(st.m, mx) : 0.0f;
}

// The pair's sum of p (each lane's 16 in key order, then lane t ^ 1's, then t ^ 2's) folded into its state with
// alpha = exp(m - nm), which it returns (1 where not live). `few`: attn_mma_few's call (its planted control).
__device__ __forceinline__ float am_fold(const float (*p)[4], int e2, AmRow& st, bool live, float nm, bool few) {
  float sum = 0.0f;
#pragma unroll
  for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
    for (int e = e2; e < e2 + 2; e++) {
#ifdef FAULT_ATTN_MMA_SPLIT_SUM
      if (few) {  // planted: a decode tile sums p by key group in reverse
        sum = sum + p[AM_SUB / 8 - 1 - nt][e];
        continue;
      }
#endif
      sum = sum + p[nt][e];
    }
  sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
  sum = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
  float alpha = live ? exp_f(st.m - nm) : 1.0f;
  if (live) {
    st.l = st.l * alpha + sum;
    st.m = nm;
  }
  return alpha;
}

// A block's tile (the tile word of blockIdx.z) and key chunk (blockIdx.x) at KV head blockIdx.y.
struct AmBlock {
  u64 first;    // the tile's first call row
  int pairs;    // its (row, query head) pairs
  int start;    // the chunk's first key
  int nk;       // keys of the chunk the tile's longest row sees
  int off;      // the KV head's first column
  RowKv last;   // the tile's longest row: every key any row sees
};

// The block's tile and chunk; false when no row of the tile reaches the chunk (the whole block leaves together).
__device__ __forceinline__ bool am_block(const u64* desc, const u64* tiles, int group, int hd, AmBlock& b) {
  u64 tw = tiles[blockIdx.z];
  b.first = tw & 0xffffffffull;
  int nrows = (int)(tw >> 32);
  b.pairs = nrows * group;
  b.start = blockIdx.x * KEY_CHUNK;
  b.last = row_kv(desc, b.first + (u64)nrows - 1);
  int tile_keys = b.last.ckeys + b.last.own;
  b.nk = tile_keys - b.start < KEY_CHUNK ? tile_keys - b.start : KEY_CHUNK;
  b.off = blockIdx.y * hd;
  return b.start < tile_keys;
}

// This lane's two pairs of warp mw's 16 (pr: mw 16 + g and + 8; valid: within the tile; keys: each one's count) and
// their query fragments as pieces in qs (the lane's own words: no barrier).
template <int HDP>
__device__ __forceinline__ void am_query(const float* q, const u64* desc, const AmBlock& b, int heads, int group,
                                         int hd, int mw, u32* qs, int (&pr)[2], bool (&valid)[2], int (&keys)[2]) {
  constexpr int KST = HDP / 16;
  int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    pr[i] = mw * 16 + g + 8 * i;
    valid[i] = pr[i] < b.pairs;
    int p = valid[i] ? pr[i] : 0;
    keys[i] = valid[i] ? am_keys(desc, b.first + (u64)(p / group)) : 0;
    int qp = p;
#ifdef FAULT_ATTN_MMA_ROW
    if (p + 1 < b.pairs) qp = p + 1;  // planted: an M row reads the next pair's query
#endif
    u64 head = (u64)(blockIdx.y * group + qp % group);
    const float* qr = q + ((b.first + (u64)(qp / group)) * (u64)heads + head) * (u64)hd;
#pragma unroll
    for (int ks = 0; ks < KST; ks++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int d = 16 * ks + 8 * h + 2 * t;
        float2 x = valid[i] && d < hd ? *reinterpret_cast<const float2*>(qr + d) : make_float2(0.0f, 0.0f);
        u32 pc3[3];
        am_split(x.x, x.y, pc3);
#pragma unroll
        for (int pc = 0; pc < 3; pc++) qs[((pc * KST + ks) * 4 + 2 * h + i) * 32] = pc3[pc];
      }
  }
}

// Key group nt's fresh score partial of one k16 step (query fragments a, the K pieces of the step at kst) added to sc.
template <int HDP>
__device__ __forceinline__ void am_score(float sc[4], const u32 (&a)[3][4], const u32* kst, int nt) {
  constexpr int KS = HDP / 2 + 4;
  int g = (threadIdx.x & 31) >> 2;
  u32 b[3][2];
  am_bfrag(kst + (nt * 8 + g) * KS, AM_SUB * KS, b);
  float pt[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  am_products(pt, a, b);
#pragma unroll
  for (int e = 0; e < 4; e++) sc[e] = sc[e] + pt[e];
}

// Output dim group nt's fresh P.V partial of one k16 step of keys (p fragments a, the V pieces of the step at vst)
// added to o where the pair's sub-block is live.
template <int HDP>
__device__ __forceinline__ void am_pv(float o[4], const u32 (&a)[3][4], const u32* vst, int nt, const bool (&live)[2]) {
  int g = (threadIdx.x & 31) >> 2;
  u32 b[3][2];
  am_bfrag(vst + (nt * 8 + g) * AM_VS, HDP * AM_VS, b);
  float pt[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  am_products(pt, a, b);
#pragma unroll
  for (int e = 0; e < 4; e++) o[e] = live[e >> 1] ? o[e] + pt[e] : o[e];
}

// The p fragments of k16 step ks of keys (key groups 2 ks, 2 ks + 1) as pieces.
__device__ __forceinline__ void am_pfrag(const float (*p)[4], int ks, u32 (&a)[3][4]) {
  am_frag(p[2 * ks][0], p[2 * ks][1], a, 0);
  am_frag(p[2 * ks][2], p[2 * ks][3], a, 1);
  am_frag(p[2 * ks + 1][0], p[2 * ks + 1][1], a, 2);
  am_frag(p[2 * ks + 1][2], p[2 * ks + 1][3], a, 3);
}

// The sub-block size: AM_SUB keys by position (a function only for the planted control).
__device__ __forceinline__ int am_sub(const AmBlock& b) {
  int sub = AM_SUB;
#ifdef FAULT_ATTN_MMA_SPLIT_COUNT
  sub = ((b.nk + 3) / 4 + 7) / 8 * 8;  // planted: the chunk cut into 4 sub-blocks by count (the tile's keys), not size
#endif
  return sub;
}

// Sub-block j0 (of `sub` keys) into kp and vp, between the barriers that end the previous one's reads and publish it.
template <int HDP>
__device__ __forceinline__ void am_next(const AmBlock& b, const float* kin, const float* vin, int hd, int width,
                                        int j0, int sub, u32* kp, u32* vp) {
  int sk = b.start + b.nk - j0 < sub ? b.start + b.nk - j0 : sub;
  __syncthreads();  // the previous sub-block's reads are done
  am_stage<HDP>(b.last, kin, vin, hd, width, b.off, j0, sk, kp, vp);
  __syncthreads();
}

// This lane's query fragments of k16 step ks (its own words of qs).
template <int HDP>
__device__ __forceinline__ void am_qfrag(const u32* qs, int ks, u32 (&a)[3][4]) {
  constexpr int KST = HDP / 16;
#pragma unroll
  for (int pc = 0; pc < 3; pc++)
#pragma unroll
    for (int w = 0; w < 4; w++) a[pc][w] = qs[((pc * KST + ks) * 4 + w) * 32];
}

// N groups of 4 sums set to +0.
template <int N>
__device__ __forceinline__ void am_zero(float (&x)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) x[i][e] = 0.0f;
}

// Key position `key`'s score: scaled where the pair (half e >> 1) sees it, -inf past its keys.
__device__ __forceinline__ float am_mask(float s, int key, int e, const int (&keys)[2], int end, float scale) {
  return key < keys[e >> 1] && key < end ? s * scale : -inf_f();
}

// The pair's partial (m, l, o) of the chunk, for each of this lane's valid pairs that sees the chunk: output dims
// of group nt (o_at(nt)) where own(nt), m and l where `ml`.
template <int NT, class Own, class OAt>
__device__ __forceinline__ void am_put(const AmBlock& b, const int (&pr)[2], const bool (&valid)[2],
                                       const int (&keys)[2], const AmRow (&st)[2], int heads, int group, int hd,
                                       int max_chunks, float* part, int row0, bool ml, Own own, OAt o_at) {
  int t = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    if (!valid[i] || b.start >= keys[i]) continue;  // no partial: the combine reads only the row's own chunks
    u64 row = b.first + (u64)(pr[i] / group);
    u64 h = (u64)(blockIdx.y * group + pr[i] % group);
    float* out = part + (((row - (u64)row0) * (u64)heads + h) * (u64)max_chunks + blockIdx.x) * (u64)(hd + 2);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
      if (nt * 8 < hd && own(nt)) {
        const float* o = o_at(nt);
        *reinterpret_cast<float2*>(out + 2 + nt * 8 + 2 * t) = make_float2(o[2 * i], o[2 * i + 1]);
      }
    if (t == 0 && ml) {
      out[0] = st[i].m;
      out[1] = st[i].l;
    }
  }
}

// A block's dynamic shared memory (the header's layout): K and V pieces, this lane's query fragment words, and this
// lane's words of the decode form's shared scores (shs) and probabilities (shp).
struct AmSmem {
  u32* kp;
  u32* vp;
  u32* qs;
  float* shs;
  float* shp;
};

template <int HDP>
__device__ __forceinline__ AmSmem am_smem(float* sm) {
  constexpr int KST = HDP / 16;
  AmSmem m;
  m.kp = reinterpret_cast<u32*>(sm);
  m.vp = m.kp + 3 * AM_SUB * (HDP / 2 + 4);
  u32* qbase = m.vp + 3 * HDP * AM_VS;
  m.qs = qbase + (threadIdx.x >> 5) * (3 * KST * 4 * 32) + (threadIdx.x & 31);
  m.shs = reinterpret_cast<float*>(qbase + AM_THREADS * 3 * KST * 4) + (threadIdx.x & 31);
  m.shp = m.shs + AM_SUB / 8 * 4 * 32;
  return m;
}

// The arguments of both entries' bodies.
#define AM_PARAMS                                                                                               \
  float *sm, const float *q, const float *kin, const float *vin, const u64 *desc, int heads, int group, int hd, \
      int width, float scale, int max_chunks, float *part, int row0, const u64 *tiles

// HDP: head_dim rounded up to a multiple of 16 (the k16 steps of a score and the n8 tiles of an output row cover
// it; dims from hd on are zero). The tile form: warp w holds pairs 16 w .. 16 w + 15 and computes all of them.
template <int HDP>
__device__ __forceinline__ void attn_mma_body(AM_PARAMS) {
  constexpr int KST = HDP / 16;
  constexpr int NT = HDP / 8;
  AmSmem m = am_smem<HDP>(sm);
  u32 *kp = m.kp, *vp = m.vp, *qs = m.qs;
  AmBlock b;
  if (!am_block(desc, tiles, group, hd, b)) return;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
  bool active = warp * 16 < b.pairs;  // warp-uniform
  int pr[2], keys[2];
  bool valid[2];
  am_query<HDP>(q, desc, b, heads, group, hd, warp, qs, pr, valid, keys);
  AmRow st[2] = {{-inf_f(), 0.0f}, {-inf_f(), 0.0f}};
  float o[NT][4];
  am_zero(o);
  int sub = am_sub(b);
  for (int j0 = b.start; j0 < b.start + b.nk; j0 += sub) {
    am_next<HDP>(b, kin, vin, hd, width, j0, sub, kp, vp);
    if (!active) continue;
    float s[AM_SUB / 8][4];
    am_zero(s);
#pragma unroll
    for (int ks = 0; ks < KST; ks++) {
      u32 a[3][4];
      am_qfrag<HDP>(qs, ks, a);
#pragma unroll
      for (int nt = 0; nt < AM_SUB / 8; nt++) am_score<HDP>(s[nt], a, kp + ks * 8 + t, nt);
    }
#pragma unroll
    for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = am_mask(s[nt][e], j0 + nt * 8 + 2 * t + (e & 1), e, keys, j0 + sub, scale);
    bool live[2] = {j0 < keys[0], j0 < keys[1]};
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float nm = am_newmax(s, 2 * h, st[h], live[h]);
#pragma unroll
      for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; e++) s[nt][e] = exp_f(s[nt][e] - nm);
      alpha[h] = am_fold(s, 2 * h, st[h], live[h], nm, false);
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) o[nt][e] = o[nt][e] * alpha[e >> 1];
#pragma unroll
    for (int ks = 0; ks < AM_SUB / 16; ks++) {
      u32 a[3][4];
      am_pfrag(s, ks, a);
#pragma unroll
      for (int nt = 0; nt < NT; nt++) am_pv<HDP>(o[nt], a, vp + ks * 8 + t, nt, live);
    }
  }
  if (!active) return;
  am_put<NT>(b, pr, valid, keys, st, heads, group, hd, max_chunks, part, row0, true, [](int) { return true; },
             [&](int nt) { return o[nt]; });
}

// The decode form (a tile of at most 16 pairs: one warp's mma rows), with the tile form's bits: every warp takes
// the same pairs and the block shares each sub-block's work. Warp w scores the key groups nt = w + AM_WARPS j and
// computes their probabilities, and adds the output dims of groups nt = w + AM_WARPS j, each element on the tile
// form's chain; the scores and the probabilities meet in shared memory (shs, shp: a lane's word (nt, e) at
// (4 nt + e) 32), so the max and the sum of p run over every key in the tile form's order in each warp. A warp's
// loops cover only its own groups (the tile form's code for all of them stalled on instruction fetch: Nsight
// Compute, docs/receipts/2026-12-06-decode-attn-fetch.md).
template <int HDP>
__device__ __forceinline__ void attn_mma_few_body(AM_PARAMS) {
  constexpr int KST = HDP / 16;
  constexpr int NT = HDP / 8;
  constexpr int OWN = AM_SUB / 8 / AM_WARPS;              // key groups a warp scores
  constexpr int OWNO = (NT + AM_WARPS - 1) / AM_WARPS;    // output dim groups a warp adds, at most
  AmSmem m = am_smem<HDP>(sm);
  u32 *kp = m.kp, *vp = m.vp, *qs = m.qs;
  float *shs = m.shs, *shp = m.shp;
  AmBlock b;
  if (!am_block(desc, tiles, group, hd, b)) return;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
  int pr[2], keys[2];
  bool valid[2];
  am_query<HDP>(q, desc, b, heads, group, hd, 0, qs, pr, valid, keys);
  AmRow st[2] = {{-inf_f(), 0.0f}, {-inf_f(), 0.0f}};
  float o[OWNO][4];
  am_zero(o);
  int sub = am_sub(b);
  for (int j0 = b.start; j0 < b.start + b.nk; j0 += sub) {
    am_next<HDP>(b, kin, vin, hd, width, j0, sub, kp, vp);
    float so[OWN][4];
    am_zero(so);
#pragma unroll
    for (int ks = 0; ks < KST; ks++) {
      u32 a[3][4];
      am_qfrag<HDP>(qs, ks, a);
#pragma unroll
      for (int j = 0; j < OWN; j++) am_score<HDP>(so[j], a, kp + ks * 8 + t, warp + AM_WARPS * j);
    }
#pragma unroll
    for (int j = 0; j < OWN; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int nt = warp + AM_WARPS * j;
        so[j][e] = am_mask(so[j][e], j0 + nt * 8 + 2 * t + (e & 1), e, keys, j0 + sub, scale);
        shs[(4 * nt + e) * 32] = so[j][e];
      }
    __syncthreads();
    float s[AM_SUB / 8][4];
#pragma unroll
    for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = shs[(4 * nt + e) * 32];
    bool live[2] = {j0 < keys[0], j0 < keys[1]};
    float nm[2] = {am_newmax(s, 0, st[0], live[0]), am_newmax(s, 2, st[1], live[1])};
#pragma unroll
    for (int j = 0; j < OWN; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) shp[(4 * (warp + AM_WARPS * j) + e) * 32] = exp_f(so[j][e] - nm[e >> 1]);
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = shp[(4 * nt + e) * 32];
    float alpha[2] = {am_fold(s, 0, st[0], live[0], nm[0], true), am_fold(s, 2, st[1], live[1], nm[1], true)};
#pragma unroll
    for (int j = 0; j < OWNO; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) o[j][e] = o[j][e] * alpha[e >> 1];
#pragma unroll
    for (int ks = 0; ks < AM_SUB / 16; ks++) {
      u32 a[3][4];
      am_pfrag(s, ks, a);
#pragma unroll
      for (int j = 0; j < OWNO; j++)
        if (warp + AM_WARPS * j < NT) am_pv<HDP>(o[j], a, vp + ks * 8 + t, warp + AM_WARPS * j, live);
    }
  }
  am_put<NT>(b, pr, valid, keys, st, heads, group, hd, max_chunks, part, row0, warp == 0,
             [&](int nt) { return nt % AM_WARPS == warp; }, [&](int nt) { return o[nt / AM_WARPS]; });
}

// BODY at HDP, head_dim rounded up to a multiple of 16.
#define AM_BY_HD(BODY)                                                                                        \
  if (hd > 48) {                                                                                              \
    BODY<64>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);           \
  } else if (hd > 32) {                                                                                       \
    BODY<48>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);           \
  } else if (hd > 16) {                                                                                       \
    BODY<32>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);           \
  } else {                                                                                                    \
    BODY<16>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);           \
  }

// attn_partial's partials on the tensor cores: one block of AM_WARPS warps a (chunk, KV head, tile); attn_partial's
// arguments with `tiles` last (hd a multiple of 8, at most AM_HD).
extern "C" __global__ void __launch_bounds__(AM_THREADS)
    attn_mma(const float* q, const float* kin, const float* vin, const u64* desc, int heads, int group, int hd,
             int width, float scale, int max_chunks, float* part, int row0, const u64* tiles) {
  PDL_ENTRY();
  extern __shared__ float sm[];
  AM_BY_HD(attn_mma_body)
}

// attn_mma over tiles of at most 16 (row, head) pairs (decode rows): its own entry so the tile form keeps its
// registers. The host sends each tile to one of the two by its pairs (cuda/attention.rs, `by_pairs`).
extern "C" __global__ void __launch_bounds__(AM_THREADS)
    attn_mma_few(const float* q, const float* kin, const float* vin, const u64* desc, int heads, int group, int hd,
                 int width, float scale, int max_chunks, float* part, int row0, const u64* tiles) {
  PDL_ENTRY();
  extern __shared__ float sm[];
  AM_BY_HD(attn_mma_few_body)
}
