//! Tensor-core linears for bf16 matrices with k % 32 == 0 (issue 22's first form): f32 activations as three bf16 pieces on mma.sync, one K order at every width.
// Appended to dense.cu's module (cuda/device.rs), so it shares common.cuh. Only a process opened with tensor cores
// on runs these (docs/cuda.md); then every width of such a matrix runs them, so a row has one set of bits.
//
// The chain of an output y = sum_k x[k] w[k] (fixed by k alone; the row count, the tiling and the other rows change
// no bit):
// - x[k] = hi + lo + lo2, each the round-to-nearest bf16 of the residual before it (the residuals are exact in
//   f32), so the pieces carry x to about 2^-24 of itself; each piece times the bf16 weight is exact in f32.
// - k splits into C = k / 32 chunks and the chunks into TC_SEGS segments: segment s holds chunks
//   [s * C / TC_SEGS, (s + 1) * C / TC_SEGS).
// - A chunk's value is one tensor-core partial from +0: mma.sync m16n8k16 (bf16 in, f32 accumulate) over pieces
//   hi, lo, lo2 in that order, each over the chunk's two k16 halves in order. Slot (2t + 8j + e) of half h of an mma
//   holds element 8t + 4h + 2j + e of the chunk (t = lane % 4, j, e in {0, 1}): each lane loads 16 contiguous
//   bytes of its weight column (tc_frag_split and the wide tile's staging use the same map).
// - A segment adds its chunks' values in increasing order from +0 with f32 adds; the segments add in order:
//   ((seg0 + seg1) + seg2) + seg3.
// The tensor cores' internal sum of a partial is not IEEE round-to-nearest, which is why each 32-element chunk gets
// a fresh partial: an f32 add rounds each chunk in (the fold measured in tools/cuda/tc, 2.1e-7..2.5e-7 relative).
#define TC_SEGS 4

// Round-to-nearest-even bf16 bits of v (NaN stays a quiet NaN).
__device__ __forceinline__ u32 tc_bf16(float v) {
  u32 u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// The three pieces of the pair (v0, v1) as packed words (v0 in the low half): p[0] hi, p[1] lo, p[2] lo2.
__device__ __forceinline__ void tc_split2(float v0, float v1, u32 p[3]) {
  u32 h0 = tc_bf16(v0), h1 = tc_bf16(v1);
  float r0 = v0 - __uint_as_float(h0 << 16), r1 = v1 - __uint_as_float(h1 << 16);
  u32 m0 = tc_bf16(r0), m1 = tc_bf16(r1);
  float s0 = r0 - __uint_as_float(m0 << 16), s1 = r1 - __uint_as_float(m1 << 16);
  p[0] = h0 | (h1 << 16);
  p[1] = m0 | (m1 << 16);
  p[2] = tc_bf16(s0) | (tc_bf16(s1) << 16);
#ifdef FAULT_TC_DROP_LO
  p[1] = 0u;  // planted: the activations rounded to one bf16 piece
  p[2] = 0u;
#endif
}

// d += A B on the tensor cores for one m16n8k16 tile (a: this lane's A fragment, b0 b1: its B fragment).
__device__ __forceinline__ void tc_mma(float d[4], const u32 a[4], u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__)
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  tfemu_mma_16816(d, a, b0, b1);  // the CPU emulation's definition of the instruction (tools/cuda/emu/emu.h)
#endif
}

// One chunk into a segment's sums acc: a fresh partial over a[piece][half] with the weights q (this lane's 16 bytes
// of its column: q.x q.y the first half's B fragment, q.z q.w the second's), then one f32 add an element.
__device__ __forceinline__ void tc_chunk(float acc[4], const u32 a[3][2][4], uint4 q) {
  float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int pc = 0; pc < 3; pc++) {
    tc_mma(p, a[pc][0], q.x, q.y);
    tc_mma(p, a[pc][1], q.z, q.w);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) acc[i] = acc[i] + p[i];
}

// First chunk of segment s of C chunks.
__device__ __forceinline__ int tc_seg_start(int s, int c) { return (int)(((long long)s * c) / TC_SEGS); }

// This lane's A fragments of one chunk from its f32 activations, split as tc_split2 splits them: v[0] v[1] hold
// elements 8t .. 8t+7 of tile row g and v[2] v[3] those of row g + 8 (two false: no row g + 8 in the block, zero
// words).
// Slot map as the header says: a[pc][h] = {row g pair 2h, row g+8 pair 2h, row g pair 2h+1, row g+8 pair 2h+1}.
__device__ __forceinline__ void tc_frag_split(const float4 v[4], bool two, u32 a[3][2][4]) {
  u32 p[3];
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const float4& ra = v[h];
      tc_split2(e ? ra.z : ra.x, e ? ra.w : ra.y, p);
#pragma unroll
      for (int pc = 0; pc < 3; pc++) a[pc][h][2 * e] = p[pc];
      if (two) {
        const float4& rb = v[2 + h];
        tc_split2(e ? rb.z : rb.x, e ? rb.w : rb.y, p);
      } else {
        p[0] = p[1] = p[2] = 0u;
      }
#pragma unroll
      for (int pc = 0; pc < 3; pc++) a[pc][h][2 * e + 1] = p[pc];
    }
}

// Narrow form (decode and verify rounds): a block of TC_SEGS warps (32 * TC_SEGS threads) computes G groups of 8
// columns from j0 (group gi: columns j0 + 8 gi ..) of matrix w0 (and of w1 when NW == 2) over a tile of nt <= 16
// rows; tile row i reads input row in_row(i) of x (f32, rows of k). Warp s computes segment s of every output from
// the f32 activations, split into pieces in registers once for the G groups (so a block of G groups splits an
// activation once for 8 G columns); the segments meet in seg (TC_SEGS * G * NW * 128 floats of shared memory) and
// warp gi adds group gi's in order and hands each output to put(i, j, y0, y1). G changes no bit of an output (each
// output's chain is the same), so the host picks it by the column count.
template <int NW, int G, class In, class Put>
__device__ __forceinline__ void tc_narrow(float* seg, const float* x, int k, int n, const u16* w0, const u16* w1, int j0,
                                          int nt, In in_row, Put put) {
  constexpr int U = NW * G >= 4 ? 2 : 4;  // chunks in flight: U * G * NW weight loads of 16 bytes a lane
  int lane = threadIdx.x & 31, s = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  bool oka = g < nt, okb = g + 8 < nt, two = nt > 8;  // two is the block's: rows g + 8 are loaded and split
  int chunks = k / 32, c0 = tc_seg_start(s, chunks), c1 = tc_seg_start(s + 1, chunks);
  const uint4* p[G][NW];  // chunk c at + 4c
#pragma unroll
  for (int gi = 0; gi < G; gi++) {
    int col = j0 + 8 * gi + g < n ? j0 + 8 * gi + g : n - 1;  // a column past n: the last one, never written
    p[gi][0] = reinterpret_cast<const uint4*>(w0 + (u64)col * (u64)k) + t;
    p[gi][NW - 1] = reinterpret_cast<const uint4*>(w1 + (u64)col * (u64)k) + t;
  }
  const float4* xa = reinterpret_cast<const float4*>(x + (u64)in_row(oka ? g : 0) * (u64)k + 8 * t);  // + 8c
  const float4* xb = reinterpret_cast<const float4*>(x + (u64)in_row(okb ? g + 8 : 0) * (u64)k + 8 * t);
  const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float acc[G][NW][4];
#pragma unroll
  for (int gi = 0; gi < G; gi++)
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[gi][m][i] = 0.0f;
  // U chunks at a time: every load issued first, then each chunk's pieces split and its partials (independent
  // chains from +0, each in piece then half order), then folded in chunk order: the bits of one chunk at a time.
  for (int c = c0; c < c1; c += U) {
    uint4 q[U][G][NW];
    float4 v[U][4];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1) {
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
          for (int m = 0; m < NW; m++) q[u][gi][m] = __ldg(p[gi][m] + 4 * (c + u));
        v[u][0] = oka ? __ldg(xa + 8 * (c + u)) : z;
        v[u][1] = oka ? __ldg(xa + 8 * (c + u) + 1) : z;
        v[u][2] = two && okb ? __ldg(xb + 8 * (c + u)) : z;
        v[u][3] = two && okb ? __ldg(xb + 8 * (c + u) + 1) : z;
      }
    float part[U][G][NW][4];
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (c + u >= c1) continue;
      u32 a[3][2][4];
      tc_frag_split(v[u], two, a);
#pragma unroll
      for (int gi = 0; gi < G; gi++)
#pragma unroll
        for (int m = 0; m < NW; m++)
#pragma unroll
          for (int i = 0; i < 4; i++) part[u][gi][m][i] = 0.0f;
#pragma unroll
      for (int pc = 0; pc < 3; pc++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int m = 0; m < NW; m++) {
              const uint4& w = q[u][gi][m];
              tc_mma(part[u][gi][m], a[pc][h], h ? w.z : w.x, h ? w.w : w.y);
            }
    }
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int gi = 0; gi < G; gi++)
#pragma unroll
        for (int m = 0; m < NW; m++)
#pragma unroll
          for (int i = 0; i < 4; i++)
            if (c + u < c1) acc[gi][m][i] = acc[gi][m][i] + part[u][gi][m][i];
  }
  // seg[((s * G + gi) * NW + m) * 128 + 4 lane + i]
#pragma unroll
  for (int gi = 0; gi < G; gi++)
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) seg[((s * G + gi) * NW + m) * 128 + 4 * lane + i] = acc[gi][m][i];
  __syncthreads();
  if (s >= G) return;
  int gi = s;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float v[NW];
#pragma unroll
    for (int m = 0; m < NW; m++) {
      v[m] = seg[(gi * NW + m) * 128 + 4 * lane + i];
#pragma unroll
      for (int q = 1; q < TC_SEGS; q++) v[m] = v[m] + seg[((q * G + gi) * NW + m) * 128 + 4 * lane + i];
#ifdef FAULT_TC_GROUP_ORDER
      if (G > 1) {  // planted: blocks of several column groups add the segments in reverse
        v[m] = seg[(((TC_SEGS - 1) * G + gi) * NW + m) * 128 + 4 * lane + i];
        for (int q = TC_SEGS - 2; q >= 0; q--) v[m] = v[m] + seg[((q * G + gi) * NW + m) * 128 + 4 * lane + i];
      }
#endif
    }
    int r = g + (i >= 2 ? 8 : 0), j = j0 + 8 * gi + 2 * t + (i & 1);
    if (r < nt && j < n) put(r, j, v[0], v[NW - 1]);
  }
}

// Shared floats of a narrow block's segment sums (G * NW at most 4).
#define TC_SEG_FLOATS (TC_SEGS * 4 * 128)

// A narrow form of G groups of 8 columns a block (the column blocks along grid x).
template <int NW, int G, class In, class Put>
__device__ __forceinline__ void tc_narrow_g(float* seg, const float* x, int k, int n, const u16* w0, const u16* w1,
                                            int nt, In in_row, Put put) {
  static_assert(TC_SEGS * G * NW * 128 <= TC_SEG_FLOATS, "a narrow block's segment sums fit seg");
  tc_narrow<NW, G>(seg, x, k, n, w0, w1, 8 * G * (int)blockIdx.x, nt, in_row, put);
}

// Expert e's bf16 values of matrix `which` (0 w1, 1 w3, 2 w2) in a MoE call's table (9 words an expert, as dense.cu's
// expert_mat).
__device__ __forceinline__ const u16* tc_expert(const u64* tab, int e, int which) {
  return reinterpret_cast<const u16*>(tab[9 * (u64)e + 3 * (u64)which]);
}

// Narrow entry points, one for each group count G (NAME_tcG_bf16: a kernel's registers are its largest
// instantiation's, so each G gets its own; G 1 needs about half of G 4's). Grid x: column blocks of 8 G; grid y:
// row tiles of 16 (linear, gateup) or the plan's tiles from tile0 (MoE; tiles of at most RT slots).
#define TC_LINEAR_ENTRY(NAME, G)                                                                                  \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* x, int rows, int k, int n, const u16* w,    \
                                                         const float* bias, float* out) {                         \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int r0 = 16 * (int)blockIdx.y, nt = rows - r0 < 16 ? rows - r0 : 16;                                          \
    auto put = [&](int i, int j, float v, float) { out[(u64)(r0 + i) * (u64)n + j] = bias ? v + bias[j] : v; };  \
    tc_narrow_g<1, G>(seg, x, k, n, w, w, nt, [&](int i) { return r0 + i; }, put);                                \
  }
TC_LINEAR_ENTRY(linear_tc1_bf16, 1)
TC_LINEAR_ENTRY(linear_tc2_bf16, 2)
TC_LINEAR_ENTRY(linear_tc4_bf16, 4)

#define TC_GATEUP_ENTRY(NAME, G)                                                                                  \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* x, int rows, int k, int n, const u16* g,    \
                                                         const u16* u, float* act) {                              \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int r0 = 16 * (int)blockIdx.y, nt = rows - r0 < 16 ? rows - r0 : 16;                                          \
    auto put = [&](int i, int j, float gv, float uv) { act[(u64)(r0 + i) * (u64)n + j] = silu_mul(gv, uv); };    \
    tc_narrow_g<2, G>(seg, x, k, n, g, u, nt, [&](int i) { return r0 + i; }, put);                                \
  }
TC_GATEUP_ENTRY(gateup_tc1_bf16, 1)
TC_GATEUP_ENTRY(gateup_tc2_bf16, 2)

// MoE gate-up over tile t of the plan: slot s reads input row list[s] / kk of x [rows, k].
#define TC_MOE_GATEUP_ENTRY(NAME, G)                                                                              \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* x, int k, int n, const u64* tab,            \
                                                         const int* tiles, const int* ntiles, const int* list,    \
                                                         int kk, float* act, int tile0) {                         \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int t = tile0 + (int)blockIdx.y;                                                                              \
    if (t >= *ntiles) return;                                                                                     \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2];                                           \
    auto put = [&](int i, int j, float gv, float uv) { act[(u64)(s0 + i) * (u64)n + j] = silu_mul(gv, uv); };    \
    tc_narrow_g<2, G>(seg, x, k, n, tc_expert(tab, e, 0), tc_expert(tab, e, 1), nt,                               \
                      [&](int i) { return list[s0 + i] / kk; }, put);                                             \
  }
TC_MOE_GATEUP_ENTRY(moe_gateup_tc1_bf16, 1)
TC_MOE_GATEUP_ENTRY(moe_gateup_tc2_bf16, 2)

// MoE down projection over tile t: slot s reads activation row s of act [slots, k] and writes y[list[s]].
#define TC_MOE_DOWN_ENTRY(NAME, G)                                                                                \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* act, int k, int n, const u64* tab,          \
                                                         const int* tiles, const int* ntiles, const int* list,    \
                                                         float* y, int tile0) {                                   \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int t = tile0 + (int)blockIdx.y;                                                                              \
    if (t >= *ntiles) return;                                                                                     \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2];                                           \
    auto put = [&](int i, int j, float v, float) { y[(u64)list[s0 + i] * (u64)n + j] = v; };                      \
    const u16* w = tc_expert(tab, e, 2);                                                                          \
    tc_narrow_g<1, G>(seg, act, k, n, w, w, nt, [&](int i) { return s0 + i; }, put);                              \
  }
TC_MOE_DOWN_ENTRY(moe_down_tc1_bf16, 1)
TC_MOE_DOWN_ENTRY(moe_down_tc2_bf16, 2)
TC_MOE_DOWN_ENTRY(moe_down_tc4_bf16, 4)

// Wide form (prefill): a block of 8 warps computes TCM rows by TCN columns from shared-memory stages of TCK_STAGE
// chunks; warp (wm, wn) = (warp / 4, warp % 4) the rows 32 wm .. +31 (two m16 tiles) and columns 32 wn .. +31 (four
// n8 tiles). A stage holds the tile's A fragments (pieces split once, by tc_split2) and B fragments in lane order,
// so each fragment is one 16-byte shared load.
#define TCM 64
#define TCN 128
#define TCK_STAGE 2

struct alignas(16) TcSmem {
  uint4 a[TCK_STAGE][3][TCM / 16][2][32];  // [chunk][piece][m16 tile][half][lane]: {a0, a1, a2, a3}
  uint4 b[TCK_STAGE][TCN / 8][32];         // [chunk][n8 tile][lane]: 8 weights of column 8 tile + lane / 4
};

// One stage's global loads, held in registers while the stage before it is multiplied: 4 x float4 of activations
// and 4 x 16 bytes of weights a thread.
struct TcLoad {
  float4 x[4];
  uint4 w[4];
};

// Thread `tid`'s loads of stage `st` (chunks TCK_STAGE st ..): activation float4 f = tid + 256 i is tile row f / 16
// (input row in_row(f / 16) of x) at element 4 (f % 16) of the stage; weight load u = tid + 256 i is block column
// u / 8 at element 8 (u % 8): column j0 + u / 8 of w0, or with NW == 2 block columns 0 .. 63 from w0 and 64 .. 127
// from w1, both at j0 + (u / 8) % 64. Rows past nt and chunks past C load zeros; columns past n load the last column
// (never written).
template <int NW, class In>
__device__ __forceinline__ void tc_fetch(const float* x, In in_row, int nt, int k, const u16* w0, const u16* w1, int j0,
                                         int n, int st, int chunks, TcLoad& ld) {
  int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int f = tid + 256 * i, r = f / 16, e = 4 * (f % 16);
    int c = TCK_STAGE * st + e / 32;
#ifdef FAULT_TC_ROW_MIX
    if (r + 1 < nt) r++;  // planted: a row of the tile reads the next row's activations
#endif
    bool ok = r < nt && c < chunks;
    ld.x[i] = ok ? __ldg(reinterpret_cast<const float4*>(x + (u64)in_row(r) * (u64)k + 32 * c + e % 32))
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int u = tid + 256 * i, bc = u / 8, cw = TCK_STAGE * st + (u % 8) / 4;
    const u16* w = NW == 2 && bc >= TCN / 2 ? w1 : w0;
    int col = j0 + (NW == 2 ? bc % (TCN / 2) : bc);
    if (col >= n) col = n - 1;
    ld.w[i] = cw < chunks ? __ldg(reinterpret_cast<const uint4*>(w + (u64)col * (u64)k + 32 * cw + 8 * (u % 4)))
                          : make_uint4(0u, 0u, 0u, 0u);
  }
}

// The held loads into the stage: activations split into pieces at their fragment words, weights as loaded.
__device__ __forceinline__ void tc_put(TcSmem& sm, const TcLoad& ld) {
  int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int f = tid + 256 * i, r = f / 16, e = 4 * (f % 16);
    int cc = e / 32, kk = e % 32, t = kk / 8, h = (kk % 8) / 4;
    int mt = r / 16, rr = r % 16, lane = 4 * (rr % 8) + t, up = rr / 8;
    u32 p0[3], p1[3];
    tc_split2(ld.x[i].x, ld.x[i].y, p0);
    tc_split2(ld.x[i].z, ld.x[i].w, p1);
#pragma unroll
    for (int pc = 0; pc < 3; pc++) {
      u32* wd = reinterpret_cast<u32*>(&sm.a[cc][pc][mt][h][lane]);
      wd[up] = p0[pc];      // a0 (row g) or a1 (row g + 8)
      wd[2 + up] = p1[pc];  // a2 or a3
    }
    int u = tid + 256 * i, cl = u / 8;
    sm.b[(u % 8) / 4][cl / 8][4 * (cl % 8) + u % 4] = ld.w[i];
  }
}

// The wide block's sums: tile rows 0 .. nt - 1 (nt <= TCM; row i reads input row in_row(i)), block columns as
// tc_fetch's, into this thread's tot[m16 tile][n8 tile][fragment element]. Every thread must call it (barriers).
template <int NW, class In>
__device__ __forceinline__ void tc_wide_sums(TcSmem& sm, const float* x, In in_row, int nt, int k, const u16* w0,
                                             const u16* w1, int j0, int n, float tot[2][4][4]) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 2, wn = warp & 3;
  int chunks = k / 32, stages = (chunks + TCK_STAGE - 1) / TCK_STAGE;
  float acc[2][4][4];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int b = 0; b < 4; b++)
#pragma unroll
      for (int i = 0; i < 4; i++) { acc[a][b][i] = 0.0f; tot[a][b][i] = 0.0f; }
#ifdef FAULT_TC_WIDTH_SPLIT
  const int segs = 2;  // planted: the wide form splits k in two segments (a split chosen by the width)
#else
  const int segs = TC_SEGS;
#endif
  int seg = 0;
  // Closes every segment that ends at or before chunk c: the segment's sum joins the total, in segment order.
  auto close_until = [&](int c) {
    while (seg < segs && (int)(((long long)(seg + 1) * chunks) / segs) <= c) {
#pragma unroll
      for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
          for (int i = 0; i < 4; i++) {
            tot[a][b][i] = seg == 0 ? acc[a][b][i] : tot[a][b][i] + acc[a][b][i];
            acc[a][b][i] = 0.0f;
          }
      seg++;
    }
  };
  TcLoad ld;
  if (stages > 0) tc_fetch<NW>(x, in_row, nt, k, w0, w1, j0, n, 0, chunks, ld);
  for (int st = 0; st < stages; st++) {
    __syncthreads();  // the stage before is multiplied
    tc_put(sm, ld);
    __syncthreads();
    if (st + 1 < stages) tc_fetch<NW>(x, in_row, nt, k, w0, w1, j0, n, st + 1, chunks, ld);
#pragma unroll
    for (int cc = 0; cc < TCK_STAGE; cc++) {
      int c = TCK_STAGE * st + cc;
      if (c >= chunks) break;
      close_until(c);
      u32 a[2][3][2][4];
#pragma unroll
      for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int pc = 0; pc < 3; pc++)
#pragma unroll
          for (int h = 0; h < 2; h++) {
            uint4 v = sm.a[cc][pc][2 * wm + mi][h][lane];
            a[mi][pc][h][0] = v.x; a[mi][pc][h][1] = v.y; a[mi][pc][h][2] = v.z; a[mi][pc][h][3] = v.w;
          }
#pragma unroll
      for (int ni = 0; ni < 4; ni++) {
        uint4 q = sm.b[cc][4 * wn + ni][lane];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) tc_chunk(acc[mi][ni], a[mi], q);
      }
    }
  }
  close_until(chunks);
}

// Hands the wide block's outputs to put(i, j, y0, y1) for tile rows i < nt and columns j < n. NW == 1: y0 is block
// column j - j0 (y1 unused); NW == 2: y0 from w0 and y1 from w1 at column j (block columns j - j0 and 64 + j - j0),
// which meet in shared memory. Every thread must call it (barriers).
template <int NW, class Put>
__device__ __forceinline__ void tc_wide_out(TcSmem& sm, const float tot[2][4][4], int nt, int j0, int n, Put put) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 2, wn = warp & 3, g = lane >> 2, t = lane & 3;
  float* o = reinterpret_cast<float*>(&sm);  // NW == 2: [TCM][TCN], 32 KiB of the stage's 40
  if (NW == 2) __syncthreads();             // the last stage is multiplied
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int r = 32 * wm + 16 * mi + g + (i >= 2 ? 8 : 0), bc = 32 * wn + 8 * ni + 2 * t + (i & 1);
        if (NW == 1) {
          if (r < nt && j0 + bc < n) put(r, j0 + bc, tot[mi][ni][i], 0.0f);
        } else {
          o[r * TCN + bc] = tot[mi][ni][i];
        }
      }
  if (NW == 1) return;
  __syncthreads();
  for (int idx = threadIdx.x; idx < TCM * (TCN / 2); idx += 256) {
    int r = idx / (TCN / 2), c = idx % (TCN / 2);
    if (r < nt && j0 + c < n) put(r, j0 + c, o[r * TCN + c], o[r * TCN + TCN / 2 + c]);
  }
}

// Wide entry points. Grid x: row tiles of TCM rows (MoE: the plan's tiles, planned at TCM slots); grid y: column
// blocks of TCN (TCN / 2 for the gate-up forms, which read two matrices).
extern "C" __global__ void __launch_bounds__(256) linear_tcw_bf16(const float* x, int rows, int k, int n,
                                                                  const u16* w, const float* bias, float* out) {
  PDL_ENTRY();
  __shared__ TcSmem sm;
  int r0 = TCM * (int)blockIdx.x, nt = rows - r0 < TCM ? rows - r0 : TCM, j0 = TCN * (int)blockIdx.y;
  float tot[2][4][4];
  tc_wide_sums<1>(sm, x, [&](int i) { return r0 + i; }, nt, k, w, w, j0, n, tot);
  tc_wide_out<1>(sm, tot, nt, j0, n, [&](int i, int j, float v, float) {
    out[(u64)(r0 + i) * (u64)n + j] = bias ? v + bias[j] : v;
  });
}

extern "C" __global__ void __launch_bounds__(256) gateup_tcw_bf16(const float* x, int rows, int k, int n,
                                                                  const u16* g, const u16* u, float* act) {
  PDL_ENTRY();
  __shared__ TcSmem sm;
  int r0 = TCM * (int)blockIdx.x, nt = rows - r0 < TCM ? rows - r0 : TCM, j0 = (TCN / 2) * (int)blockIdx.y;
  float tot[2][4][4];
  tc_wide_sums<2>(sm, x, [&](int i) { return r0 + i; }, nt, k, g, u, j0, n, tot);
  tc_wide_out<2>(sm, tot, nt, j0, n, [&](int i, int j, float gv, float uv) {
    act[(u64)(r0 + i) * (u64)n + j] = silu_mul(gv, uv);
  });
}

extern "C" __global__ void __launch_bounds__(256) moe_gateup_tcw_bf16(const float* x, int k, int n, const u64* tab,
                                                                      const int* tiles, const int* ntiles,
                                                                      const int* list, int kk, float* act) {
  PDL_ENTRY();
  __shared__ TcSmem sm;
  int t = blockIdx.x;
  if (t >= *ntiles) return;
  int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = (TCN / 2) * (int)blockIdx.y;
  float tot[2][4][4];
  tc_wide_sums<2>(sm, x, [&](int i) { return list[s0 + i] / kk; }, nt, k, tc_expert(tab, e, 0), tc_expert(tab, e, 1),
                  j0, n, tot);
  tc_wide_out<2>(sm, tot, nt, j0, n, [&](int i, int j, float gv, float uv) {
    act[(u64)(s0 + i) * (u64)n + j] = silu_mul(gv, uv);
  });
}

extern "C" __global__ void __launch_bounds__(256) moe_down_tcw_bf16(const float* act, int k, int n, const u64* tab,
                                                                    const int* tiles, const int* ntiles,
                                                                    const int* list, float* y) {
  PDL_ENTRY();
  __shared__ TcSmem sm;
  int t = blockIdx.x;
  if (t >= *ntiles) return;
  int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = TCN * (int)blockIdx.y;
  const u16* w = tc_expert(tab, e, 2);
  float tot[2][4][4];
  tc_wide_sums<1>(sm, act, [&](int i) { return s0 + i; }, nt, k, w, w, j0, n, tot);
  tc_wide_out<1>(sm, tot, nt, j0, n, [&](int i, int j, float v, float) { y[(u64)list[s0 + i] * (u64)n + j] = v; });
}
