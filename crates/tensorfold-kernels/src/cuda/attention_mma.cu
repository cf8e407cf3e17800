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
// scores and probabilities (am_share).
// - A tile of at most 16 pairs (decode) runs attn_mma_few, which spreads a sub-block's scores, exps and output dims
//   over the block's warps (SPLIT below) with the same chains, so the bits are the tile form's.
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
// pair]; keys from `sk` on and dims from `hd` on are zero. The loads of a round are all issued before the first is
// used, so a sub-block waits for memory twice, not once an element.
template <int HDP>
__device__ __forceinline__ void am_stage(const RowKv& r, const float* kin, const float* vin, int hd, int width, int off,
                                         int j0, int sk, u32* kp, u32* vp) {
  constexpr int KS = HDP / 2 + 4;
  constexpr int N = AM_SUB * (HDP / 2) / AM_THREADS;  // K pairs a thread; as many V pairs
  constexpr int H = N > 1 ? N / 2 : 1;                 // pairs a round: two rounds bound the registers held
#pragma unroll
  for (int n0 = 0; n0 < N; n0 += H) {
    float2 kx[H];
    float2 vx[H];
#pragma unroll
    for (int n = 0; n < H; n++) {
      int i = threadIdx.x + (n0 + n) * AM_THREADS;
      int key = i / (HDP / 2), pr = i - key * (HDP / 2);
      kx[n] = make_float2(0.0f, 0.0f);
      if (key < sk && 2 * pr < hd) kx[n] = *reinterpret_cast<const float2*>(kv_row(r, r.k, kin, j0 + key, width, off) + 2 * pr);
      int kq = i / HDP, d = i - kq * HDP;
      bool in = d < hd;
      vx[n].x = in && 2 * kq < sk ? kv_row(r, r.v, vin, j0 + 2 * kq, width, off)[d] : 0.0f;
      vx[n].y = in && 2 * kq + 1 < sk ? kv_row(r, r.v, vin, j0 + 2 * kq + 1, width, off)[d] : 0.0f;
    }
    u32 p[3];
#pragma unroll
    for (int n = 0; n < H; n++) {
      int i = threadIdx.x + (n0 + n) * AM_THREADS;
      int key = i / (HDP / 2), pr = i - key * (HDP / 2);
      am_split(kx[n].x, kx[n].y, p);
#pragma unroll
      for (int pc = 0; pc < 3; pc++) kp[(pc * AM_SUB + key) * KS + pr] = p[pc];
      int kq = i / HDP, d = i - kq * HDP;
      am_split(vx[n].x, vx[n].y, p);
#pragma unroll
      for (int pc = 0; pc < 3; pc++) vp[(pc * HDP + d) * AM_VS + kq] = p[pc];
    }
  }
}

// One pair's softmax state: the running max and the sum of p.
struct AmRow {
  float m;
  float l;
};

// The sub-block's update of one pair (half e2 = 0: row g's slots 0, 1; 2: row g + 8's slots 2, 3): turns its scores
// into p in place and returns alpha. `live`: the sub-block holds some of the pair's keys (by position, so a NaN score
// propagates as in attn_partial instead of reading as an empty sub-block); where not, alpha is 1 and the state stays.
__device__ __forceinline__ float am_softmax(float (*s)[4], int e2, AmRow& st, bool live) {
  float mx = -inf_f();
#pragma unroll
  for (int nt = 0; nt < AM_SUB / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][e2], s[nt][e2 + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  float nm = live ? fmaxf(st.m, mx) : 0.0f;
  float sum = 0.0f;
#pragma unroll
  for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
    for (int e = e2; e < e2 + 2; e++) {
      s[nt][e] = exp_f(s[nt][e] - nm);
      sum = sum + s[nt][e];
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

// SPLIT's scores: each warp writes the key groups it computed (nt % AM_WARPS == warp) to sh (a lane's word (nt, e)
// at (4 nt + e) 32), and after the barrier reads every group back, so each warp holds the scores the tile form's
// one warp holds. Callers pass sh already offset by the lane.
__device__ __forceinline__ void am_share(float (&s)[AM_SUB / 8][4], float* sh, int warp) {
#pragma unroll
  for (int nt = 0; nt < AM_SUB / 8; nt++)
    if (nt % AM_WARPS == warp)
#pragma unroll
      for (int e = 0; e < 4; e++) sh[(4 * nt + e) * 32] = s[nt][e];
  __syncthreads();
#pragma unroll
  for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[nt][e] = sh[(4 * nt + e) * 32];
}

// am_softmax for both halves of a SPLIT block, with the exps shared: every warp takes the max as am_softmax does,
// computes p for its own key groups, and after a barrier (through sh, as am_share) sums every p in am_softmax's
// order; so s, st and alpha end as am_softmax leaves them, in every warp.
__device__ __forceinline__ void am_softmax_split(float (&s)[AM_SUB / 8][4], float* sh, int warp, AmRow (&st)[2],
                                                 const bool (&live)[2], float (&alpha)[2]) {
  float nm[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int e2 = 2 * h;
    float mx = -inf_f();
#pragma unroll
    for (int nt = 0; nt < AM_SUB / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][e2], s[nt][e2 + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    nm[h] = live[h] ? fmaxf(st[h].m, mx) : 0.0f;
  }
  // This warp's key groups nt = warp + AM_WARPS j picked by selects, so every exp runs unconditionally (exps under
  // a warp test spilled registers to local memory) and p lands back in s[nt] by selects.
  constexpr int OWN = AM_SUB / 8 / AM_WARPS;
  float own[OWN][4];
#pragma unroll
  for (int j = 0; j < OWN; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = s[AM_WARPS * j][e];
#pragma unroll
      for (int w = 1; w < AM_WARPS; w++) v = warp == w ? s[AM_WARPS * j + w][e] : v;
      own[j][e] = exp_f(v - nm[e >> 1]);
    }
#pragma unroll
  for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[nt][e] = nt % AM_WARPS == warp ? own[nt / AM_WARPS][e] : s[nt][e];
  am_share(s, sh, warp);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int e2 = 2 * h;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
      for (int e = e2; e < e2 + 2; e++) {
#ifdef FAULT_ATTN_MMA_SPLIT_SUM
        sum = sum + s[AM_SUB / 8 - 1 - nt][e];  // planted: a decode tile sums p by key group in reverse
#else
        sum = sum + s[nt][e];
#endif
      }
    sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
    sum = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
    alpha[h] = live[h] ? exp_f(st[h].m - nm[h]) : 1.0f;
    if (live[h]) {
      st[h].l = st[h].l * alpha[h] + sum;
      st[h].m = nm[h];
    }
  }
}

// HDP: head_dim rounded up to a multiple of 16 (the k16 steps of a score and the n8 tiles of an output row cover
// it; dims from hd on are zero).
// SPLIT: a tile of at most 16 pairs (a decode row; a few rows of a small group) fills one warp's mma rows, so
// instead of one warp computing while three wait, every warp takes the same pairs and the block shares each
// sub-block's work: warp w computes the scores of the key groups nt % AM_WARPS == w, the probabilities of those keys
// and the output dims of the groups nt % AM_WARPS == w, through shared memory (am_share). Each element's chain, the
// max and the sum of p are the tile form's, in its order, so the bits are its (the invariance gate compares
// one-row calls with tiles of 16 rows).
template <int HDP, bool SPLIT>
__device__ __forceinline__ void attn_mma_body(float* sm, const float* q, const float* kin, const float* vin,
                                              const u64* desc, int heads, int group, int hd, int width, float scale,
                                              int max_chunks, float* part, int row0, const u64* tiles) {
  constexpr int KS = HDP / 2 + 4;
  constexpr int KST = HDP / 16;
  constexpr int NT = HDP / 8;
  u32* kp = reinterpret_cast<u32*>(sm);
  u32* vp = kp + 3 * AM_SUB * KS;
  // This lane's query fragments, by lane (a lane reads back only its own words: no barrier).
  u32* qs = vp + 3 * HDP * AM_VS + (threadIdx.x >> 5) * (3 * KST * 4 * 32) + (threadIdx.x & 31);
  // SPLIT's shared scores and probabilities: AM_SUB / 8 * 4 words a lane each (am_share).
  float* shs = reinterpret_cast<float*>(vp + 3 * HDP * AM_VS + AM_THREADS * 3 * KST * 4) + (threadIdx.x & 31);
  float* shp = shs + AM_SUB / 8 * 4 * 32;
  u64 tw = tiles[blockIdx.z];
  u64 first = tw & 0xffffffffull;
  int nrows = (int)(tw >> 32);
  int kh = blockIdx.y;
  int start = blockIdx.x * KEY_CHUNK;
  RowKv last = row_kv(desc, first + (u64)nrows - 1);  // the tile's longest row: every key any row sees
  int tile_keys = last.ckeys + last.own;
  if (start >= tile_keys) return;  // the whole block leaves together
  int nk = tile_keys - start < KEY_CHUNK ? tile_keys - start : KEY_CHUNK;
  int off = kh * hd;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int mw = SPLIT ? 0 : warp;  // the warp whose pairs these lanes hold
  int pairs = nrows * group;
  bool active = mw * 16 < pairs;  // warp-uniform
  int pr[2] = {mw * 16 + g, mw * 16 + g + 8};
  bool valid[2] = {pr[0] < pairs, pr[1] < pairs};
  int keys[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    int p = valid[i] ? pr[i] : 0;
    keys[i] = valid[i] ? am_keys(desc, first + (u64)(p / group)) : 0;
    int qp = p;
#ifdef FAULT_ATTN_MMA_ROW
    if (p + 1 < pairs) qp = p + 1;  // planted: an M row reads the next pair's query
#endif
    const float* qr = q + ((first + (u64)(qp / group)) * (u64)heads + (u64)(kh * group + qp % group)) * (u64)hd;
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
  AmRow st[2] = {{-inf_f(), 0.0f}, {-inf_f(), 0.0f}};
  float o[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[nt][e] = 0.0f;
  int sub = AM_SUB;  // a variable (and the `key < j0 + sub` test below) only for the planted control
#ifdef FAULT_ATTN_MMA_SPLIT_COUNT
  sub = ((nk + 3) / 4 + 7) / 8 * 8;  // planted: the chunk cut into 4 sub-blocks by count (the tile's keys), not size
#endif
  for (int j0 = start; j0 < start + nk; j0 += sub) {
    int sk = start + nk - j0 < sub ? start + nk - j0 : sub;
    __syncthreads();  // the previous sub-block's reads are done
    am_stage<HDP>(last, kin, vin, hd, width, off, j0, sk, kp, vp);
    __syncthreads();
    if (!active) continue;
    float s[AM_SUB / 8][4];
#pragma unroll
    for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KST; ks++) {
      u32 a[3][4];
#pragma unroll
      for (int pc = 0; pc < 3; pc++)
#pragma unroll
        for (int w = 0; w < 4; w++) a[pc][w] = qs[((pc * KST + ks) * 4 + w) * 32];
#pragma unroll
      for (int nt = 0; nt < AM_SUB / 8; nt++) {
        if (SPLIT && nt % AM_WARPS != warp) continue;
        u32 b[3][2];
        am_bfrag(kp + (nt * 8 + g) * KS + ks * 8 + t, AM_SUB * KS, b);
        float pt[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        am_products(pt, a, b);
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = s[nt][e] + pt[e];
      }
    }
#pragma unroll
    for (int nt = 0; nt < AM_SUB / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int key = j0 + nt * 8 + 2 * t + (e & 1);
        s[nt][e] = key < keys[e >> 1] && key < j0 + sub ? s[nt][e] * scale : -inf_f();
      }
    bool live[2] = {j0 < keys[0], j0 < keys[1]};
    float alpha[2];
    if (SPLIT) {
      am_share(s, shs, warp);  // every warp: all of the sub-block's scores
      am_softmax_split(s, shp, warp, st, live, alpha);
    } else {
      alpha[0] = am_softmax(s, 0, st[0], live[0]);
      alpha[1] = am_softmax(s, 2, st[1], live[1]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) o[nt][e] = o[nt][e] * alpha[e >> 1];
#pragma unroll
    for (int ks = 0; ks < AM_SUB / 16; ks++) {
      u32 a[3][4];
      am_frag(s[2 * ks][0], s[2 * ks][1], a, 0);
      am_frag(s[2 * ks][2], s[2 * ks][3], a, 1);
      am_frag(s[2 * ks + 1][0], s[2 * ks + 1][1], a, 2);
      am_frag(s[2 * ks + 1][2], s[2 * ks + 1][3], a, 3);
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        if (SPLIT && nt % AM_WARPS != warp) continue;
        u32 b[3][2];
        am_bfrag(vp + (nt * 8 + g) * AM_VS + ks * 8 + t, HDP * AM_VS, b);
        float pt[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        am_products(pt, a, b);
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = live[e >> 1] ? o[nt][e] + pt[e] : o[nt][e];
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    if (!valid[i] || start >= keys[i]) continue;  // no partial: the combine reads only the row's own chunks
    int p = pr[i];
    u64 row = first + (u64)(p / group);
    u64 h = (u64)(kh * group + p % group);
    float* out = part + (((row - (u64)row0) * (u64)heads + h) * (u64)max_chunks + blockIdx.x) * (u64)(hd + 2);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
      if (nt * 8 < hd && (!SPLIT || nt % AM_WARPS == warp))
        *reinterpret_cast<float2*>(out + 2 + nt * 8 + 2 * t) = make_float2(o[nt][2 * i], o[nt][2 * i + 1]);
    if (t == 0 && (!SPLIT || warp == 0)) {
      out[0] = st[i].m;
      out[1] = st[i].l;
    }
  }
}

// attn_mma_body at HDP, head_dim rounded up to a multiple of 16.
template <bool SPLIT>
__device__ __forceinline__ void attn_mma_hd(float* sm, const float* q, const float* kin, const float* vin,
                                            const u64* desc, int heads, int group, int hd, int width, float scale,
                                            int max_chunks, float* part, int row0, const u64* tiles) {
  if (hd > 48) {
    attn_mma_body<64, SPLIT>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);
  } else if (hd > 32) {
    attn_mma_body<48, SPLIT>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);
  } else if (hd > 16) {
    attn_mma_body<32, SPLIT>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);
  } else {
    attn_mma_body<16, SPLIT>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);
  }
}

// attn_partial's partials on the tensor cores: one block of AM_WARPS warps a (chunk, KV head, tile); attn_partial's
// arguments with `tiles` last (hd a multiple of 8, at most AM_HD).
extern "C" __global__ void __launch_bounds__(AM_THREADS)
    attn_mma(const float* q, const float* kin, const float* vin, const u64* desc, int heads, int group, int hd,
             int width, float scale, int max_chunks, float* part, int row0, const u64* tiles) {
  PDL_ENTRY();
  extern __shared__ float sm[];
  attn_mma_hd<false>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);
}

// attn_mma over tiles of at most 16 (row, head) pairs (decode rows), SPLIT: its own entry so the tile form keeps
// its registers. The host sends each tile to one of the two by its pairs (cuda/attention.rs, `by_pairs`).
extern "C" __global__ void __launch_bounds__(AM_THREADS)
    attn_mma_few(const float* q, const float* kin, const float* vin, const u64* desc, int heads, int group, int hd,
                 int width, float scale, int max_chunks, float* part, int row0, const u64* tiles) {
  PDL_ENTRY();
  extern __shared__ float sm[];
  attn_mma_hd<true>(sm, q, kin, vin, desc, heads, group, hd, width, scale, max_chunks, part, row0, tiles);
}
