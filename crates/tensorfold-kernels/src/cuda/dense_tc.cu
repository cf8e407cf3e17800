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
//   bytes of its weight column (tc_frag_a / the wide tile's staging use the same map).
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

// This lane's A fragments of one chunk from its two rows' 8 values (ra: row g, rb: row g + 8, elements 8t .. 8t+7
// of the chunk): a[piece][half] = {ra pair 0, rb pair 0, ra pair 1, rb pair 1} of that half.
__device__ __forceinline__ void tc_frag_a(const float ra[8], const float rb[8], u32 a[3][2][4]) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    u32 p[4][3];
    tc_split2(ra[4 * h], ra[4 * h + 1], p[0]);
    tc_split2(rb[4 * h], rb[4 * h + 1], p[1]);
    tc_split2(ra[4 * h + 2], ra[4 * h + 3], p[2]);
    tc_split2(rb[4 * h + 2], rb[4 * h + 3], p[3]);
#pragma unroll
    for (int pc = 0; pc < 3; pc++)
#pragma unroll
      for (int i = 0; i < 4; i++) a[pc][h][i] = p[i][pc];
  }
}

// First chunk of segment s of C chunks.
__device__ __forceinline__ int tc_seg_start(int s, int c) { return (int)(((long long)s * c) / TC_SEGS); }

__device__ __forceinline__ void tc_load8(const float* row, bool ok, float v[8]) {
  float4 a = ok ? __ldg(reinterpret_cast<const float4*>(row)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 b = ok ? __ldg(reinterpret_cast<const float4*>(row) + 1) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Chunks a lane of the narrow form has in flight.
#define TC_U 8

// Narrow form (decode and verify rounds): a block of TC_SEGS warps computes 8 columns (j0 = 8 blockIdx.x) of 16
// rows (r0 = 16 blockIdx.y); warp s computes segment s of every output of the tile, and the block adds the segments
// in order. out[r, j] = y (+ bias[j]). Launched with 32 * TC_SEGS threads.
extern "C" __global__ void __launch_bounds__(128) linear_tc_bf16(const float* x, int rows, int k, int n,
                                                                           const u16* w, const float* bias,
                                                                           float* out) {
  PDL_ENTRY();
  __shared__ float seg_sum[TC_SEGS][32][4];
  int lane = threadIdx.x & 31, s = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int j0 = 8 * (int)blockIdx.x, r0 = 16 * (int)blockIdx.y;
  int col = j0 + g < n ? j0 + g : n - 1;  // a column past n is computed from the last one and never written
  bool oka = r0 + g < rows, okb = r0 + g + 8 < rows;
  int chunks = k / 32, c0 = tc_seg_start(s, chunks), c1 = tc_seg_start(s + 1, chunks);
  const uint4* wp = reinterpret_cast<const uint4*>(w + (u64)col * (u64)k) + t;  // chunk c at + 4c
  const float* xa = x + (u64)(oka ? r0 + g : 0) * (u64)k + 8 * t;
  const float* xb = x + (u64)(okb ? r0 + g + 8 : 0) * (u64)k + 8 * t;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int c = c0; c < c1; c += TC_U) {
    uint4 q[TC_U];
#pragma unroll
    for (int u = 0; u < TC_U; u++)
      if (c + u < c1) q[u] = __ldg(wp + 4 * (c + u));
#pragma unroll
    for (int u = 0; u < TC_U; u++) {
      if (c + u < c1) {
        float ra[8], rb[8];
        tc_load8(xa + 32 * (c + u), oka, ra);
        tc_load8(xb + 32 * (c + u), okb, rb);
        u32 a[3][2][4];
        tc_frag_a(ra, rb, a);
        tc_chunk(acc, a, q[u]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; i++) seg_sum[s][lane][i] = acc[i];
  __syncthreads();
  if (s != 0) return;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float v = seg_sum[0][lane][i];
#pragma unroll
    for (int q = 1; q < TC_SEGS; q++) v = v + seg_sum[q][lane][i];
    int r = r0 + g + (i >= 2 ? 8 : 0), j = j0 + 2 * t + (i & 1);
    if (r < rows && j < n) out[(u64)r * (u64)n + j] = bias ? v + bias[j] : v;
  }
}

// Wide form (prefill): a block of 8 warps computes TCM rows by TCN columns from shared-memory stages of TCK_STAGE
// chunks; warp (wm, wn) = (warp / 4, warp % 4) the rows 32 wm .. +31 (two m16 tiles) and columns 32 wn .. +31 (four
// n8 tiles). A stage holds the tile's A fragments (pieces split once, as tc_frag_a) and B fragments in lane order,
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

// Thread `tid`'s loads of stage `st` (chunks TCK_STAGE st ..): activation float4 f = tid + 256 i is row f / 16 of
// the tile at element 4 (f % 16) of the stage; weight load u = tid + 256 i is column u / 8 at element 8 (u % 8).
// Rows past nt and chunks past C load zeros; columns past n load the last column (never written).
__device__ __forceinline__ void tc_fetch(const float* x, int r0, int nt, int k, const u16* w, int j0, int n, int st,
                                         int chunks, TcLoad& ld) {
  int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int f = tid + 256 * i, r = f / 16, e = 4 * (f % 16);
    int c = TCK_STAGE * st + e / 32;
#ifdef FAULT_TC_ROW_MIX
    if (r + 1 < nt) r++;  // planted: a row of the tile reads the next row's activations
#endif
    bool ok = r < nt && c < chunks;
    ld.x[i] = ok ? __ldg(reinterpret_cast<const float4*>(x + (u64)(r0 + r) * (u64)k + 32 * c + e % 32))
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int u = tid + 256 * i, col = j0 + u / 8, cw = TCK_STAGE * st + (u % 8) / 4;
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

// The wide block: out rows r0 .. r0 + nt - 1 (nt <= TCM), columns j0 .. j0 + TCN - 1 (those < n).
__device__ __forceinline__ void tc_wide_tile(TcSmem& sm, const float* x, int r0, int nt, int k, const u16* w, int j0,
                                             int n, const float* bias, float* out) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 2, wn = warp & 3;
  int chunks = k / 32, stages = (chunks + TCK_STAGE - 1) / TCK_STAGE;
  float acc[2][4][4], tot[2][4][4];
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
  if (stages > 0) tc_fetch(x, r0, nt, k, w, j0, n, 0, chunks, ld);
  for (int st = 0; st < stages; st++) {
    __syncthreads();  // the stage before is multiplied
    tc_put(sm, ld);
    __syncthreads();
    if (st + 1 < stages) tc_fetch(x, r0, nt, k, w, j0, n, st + 1, chunks, ld);
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
  int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int r = 32 * wm + 16 * mi + g + (i >= 2 ? 8 : 0), j = j0 + 32 * wn + 8 * ni + 2 * t + (i & 1);
        float v = tot[mi][ni][i];
        if (r < nt && j < n) out[(u64)(r0 + r) * (u64)n + j] = bias ? v + bias[j] : v;
      }
}

// Grid x: row tiles of TCM rows, grid y: column blocks of TCN.
extern "C" __global__ void __launch_bounds__(256) linear_tcw_bf16(const float* x, int rows, int k, int n,
                                                                  const u16* w, const float* bias, float* out) {
  PDL_ENTRY();
  __shared__ TcSmem sm;
  int r0 = TCM * (int)blockIdx.x, nt = rows - r0 < TCM ? rows - r0 : TCM;
  tc_wide_tile(sm, x, r0, nt, k, w, TCN * (int)blockIdx.y, n, bias, out);
}
