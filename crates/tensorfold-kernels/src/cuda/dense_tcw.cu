//! Tensor-core linears, the wide form (prefill and wide MoE tiles): 64 x 128 blocks from shared-memory stages, the narrow form's chain (dense_tc.cu) at every width, bf16 and MLX Q8 / Q4 weights.
// Appended to dense.cu's module after dense_tc.cu (cuda/device/sources.rs), whose pieces, chunk partials and
// segments it uses: a row's bits are the narrow and few-row forms'.

// Wide form (prefill): a block of 8 warps computes TCM rows by TCN columns from shared-memory stages of TCK_STAGE
// chunks; warp (wm, wn) = (warp / 4, warp % 4) the rows 32 wm .. +31 (two m16 tiles) and columns 32 wn .. +31 (four
// n8 tiles). A stage holds the tile's A fragments (pieces split once, by tc_split2) and B fragments in lane order,
// so each fragment is one 16-byte shared load. The next stage's activations wait in registers and its weights land
// by cp.async in the other of two B buffers while a stage is multiplied; two blocks share an SM.
#define TCM 64
#define TCN 128
#define TCK_STAGE 2
// Blocks an SM the wide forms are compiled for: registers capped at 65536 / (256 x this), 128 (the chunk loop stays
// rolled to fit without spills). Two fit an SM's shared memory on Hopper (228 KiB); parts with less run one. A block's dynamic shared memory is its TcSmem stage, then its segment totals
// (TCW_TOT floats, [element][thread]): TCW_SMEM bytes, tc.rs's WIDE_SMEM.
#define TCW_BLOCKS 2

struct alignas(16) TcSmem {
  uint4 a[TCK_STAGE][3][TCM / 16][2][32];  // [chunk][piece][m16 tile][half][lane]: {a0, a1, a2, a3}
  uint4 b[2][TCK_STAGE][TCN / 8][32];      // [buffer][chunk][n8 tile][lane]: 8 weights of column 8 tile + lane / 4
                                           // (Q8: the first 8 bytes, 8 codes; Q4: the first 4)
  float xs[TCK_STAGE][TCM];                // quantized: each tile row's sum of x over a chunk (tc_xsum's order)
  float sb[2][TCK_STAGE][2][TCN];          // quantized: [buffer][chunk][scale, bias][block column]
};
#define TCW_TOT (2 * 4 * 4 * 256)
#define TCW_SMEM (sizeof(TcSmem) + 4 * TCW_TOT)
static_assert(sizeof(TcSmem) % 16 == 0, "the totals start on 16 bytes");
static_assert(TCW_SMEM == 94720, "tc.rs's WIDE_SMEM");

// One stage's activation loads, held in registers while the stage before it is multiplied: 2 x 2 float4 (two A
// slots, rows g and g + 8 of each). The weights go straight to shared memory (tc_fetch_w).
struct TcLoad {
  float4 x[2][2];
};

// A slot of the stage's A fragments: sm.a[cc][piece][mt][h][4 g + t] holds elements 8 t + 4 h .. + 3 of chunk cc of
// tile rows 16 mt + g and 16 mt + g + 8, split. Slot s = tid + 256 i (i < 2) is the thread's: the low 5 bits of s
// run t (2 bits), then g's low bit, h, g's middle bit, so 8 threads in a row store 8 adjacent slots (no bank
// conflict) and a warp's loads of one row cover a chunk's 128 contiguous bytes; the high bits run g's top bit, mt,
// cc.
struct TcSlot {
  int cc, mt, h, g, t;
};
static_assert(TCK_STAGE == 2 && TCM == 64 && TCN == 128, "tc_slot's, tc_fetch_w's bit fields: 2 chunks, 4 m16 tiles");
__device__ __forceinline__ TcSlot tc_slot(int s) {
  TcSlot q;
  q.t = s & 3;
  q.h = (s >> 3) & 1;
  q.g = ((s >> 2) & 1) | (((s >> 4) & 1) << 1) | (((s >> 5) & 1) << 2);
  q.mt = (s >> 6) & 3;
  q.cc = (s >> 8) & 1;
  return q;
}

// Thread `tid`'s activation loads of stage `st` (chunks TCK_STAGE st ..), as its two slots say (tile row r is input
// row in_row(r) of x); rows past nt and chunks past C load zeros.
template <class In>
__device__ __forceinline__ void tc_fetch_x(const float* x, In in_row, int nt, int k, int st, int chunks, TcLoad& ld) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    TcSlot q = tc_slot(threadIdx.x + 256 * i);
    int c = TCK_STAGE * st + q.cc;
#pragma unroll
    for (int up = 0; up < 2; up++) {
      int r = 16 * q.mt + q.g + 8 * up;
#ifdef FAULT_TC_ROW_MIX
      if (r + 1 < nt) r++;  // planted: a row of the tile reads the next row's activations
#endif
      bool ok = r < nt && c < chunks;
      int e = 32 * c + 8 * q.t + 4 * q.h;
      ld.x[i][up] = ok ? __ldg(reinterpret_cast<const float4*>(x + (u64)in_row(r) * (u64)k + e))
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

// The matrix of block column bc and its column (w0's column j0 + bc, or with NW == 2 block columns 0 .. 63 from m0 and
// 64 .. 127 from m1, both at j0 + bc % 64; a column past n: the last one, never written).
template <int NW>
__device__ __forceinline__ const Mat& tc_block_col(const Mat& m0, const Mat& m1, int j0, int n, int bc, int* col) {
  int c = j0 + (NW == 2 ? bc % (TCN / 2) : bc);
  *col = c < n ? c : n - 1;
  return NW == 2 && bc >= TCN / 2 ? m1 : m0;
}

// Thread `tid`'s weight copies of stage `st` into buffer `buf`, in flight until tc_async_wait: unit u = tid + 256 i
// is b[buf][cc][tile][lane] with lane = u % 32, cc = (u / 32) % 2, tile = u / 64: block column 8 tile + lane / 4 at
// element 8 (lane % 4) of the chunk (tc_block_col's column); a quantized matrix's scales and biases of the stage's
// chunks go to sb (thread tid copies chunk i's (i < 2) scale, or its bias when tid is odd, of block column tid / 2).
// Chunks past C are zeros.
template <int DT, int NW>
__device__ __forceinline__ void tc_fetch_w(TcSmem& sm, int buf, int k, const Mat& m0, const Mat& m1, int j0, int n,
                                           int st, int chunks, int gs) {
  int tid = threadIdx.x;
#pragma unroll 1
  for (int i = 0; i < 4; i++) {
    int u = tid + 256 * i, lane = u & 31, cw = TCK_STAGE * st + ((u >> 5) & 1), bc = 8 * (u >> 6) + (lane >> 2), col;
    const Mat& m = tc_block_col<NW>(m0, m1, j0, n, bc, &col);
    bool ok = cw < chunks;
    const u8* src = tc_col<DT>(m, col, k, lane & 3).w + (ok ? (u64)cw * (4 * TC_LANE_BYTES(DT)) : 0);
    void* dst = &sm.b[buf][(u >> 5) & 1][u >> 6][lane];
    if (DT == DT_BF16) tc_async16(dst, src, ok);
    else tc_async_small<TC_LANE_BYTES(DT)>(dst, src, ok);
  }
  if (DT == DT_BF16) return;
#pragma unroll
  for (int i = 0; i < TCK_STAGE; i++) {
    int bc = tid >> 1, cw = TCK_STAGE * st + i, col;
    const Mat& m = tc_block_col<NW>(m0, m1, j0, n, bc, &col);
    bool ok = cw < chunks;
    const TcCol cl = tc_col<DT>(m, col, k, 0);
    const float* src = (tid & 1 ? cl.b : cl.s) + (ok ? cw >> gs : 0);
    tc_async_small<4>(&sm.sb[buf][i][tid & 1][bc], src, ok);
  }
}

// The held activation loads into the stage: each A slot's activations split into pieces, one 16-byte store a piece.
// QT (a quantized matrix): also each tile row's sum of x over each chunk into xs, in tc_xsum's order: the lane of half
// 0 sums its 4 elements in order, the lane of half 1 (lane ^ 8) goes on with its 4, then the butterfly over t.
template <bool QT>
__device__ __forceinline__ void tc_put(TcSmem& sm, const TcLoad& ld) {
  int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    TcSlot q = tc_slot(tid + 256 * i);
    if (QT) {
#pragma unroll
      for (int up = 0; up < 2; up++) {
        const float4& v = ld.x[i][up];
        float own = v.x + v.y;
        own = own + v.z;
        own = own + v.w;
        float s = __shfl_xor_sync(0xffffffffu, own, 8);  // half 1: half 0's sum of the first 4
        s = s + v.x;
        s = s + v.y;
        s = s + v.z;
        s = s + v.w;
        s = s + __shfl_xor_sync(0xffffffffu, s, 1);
        s = s + __shfl_xor_sync(0xffffffffu, s, 2);
        if (q.h == 1 && q.t == 0) sm.xs[q.cc][16 * q.mt + q.g + 8 * up] = s;
      }
    }
    u32 a0[3], a1[3], a2[3], a3[3];
    tc_split2(ld.x[i][0].x, ld.x[i][0].y, a0);  // row g, slots 2t, 2t + 1
    tc_split2(ld.x[i][1].x, ld.x[i][1].y, a1);  // row g + 8
    tc_split2(ld.x[i][0].z, ld.x[i][0].w, a2);  // row g, slots 2t + 8, 2t + 9
    tc_split2(ld.x[i][1].z, ld.x[i][1].w, a3);  // row g + 8
#pragma unroll
    for (int pc = 0; pc < 3; pc++)
      sm.a[q.cc][pc][q.mt][q.h][4 * q.g + q.t] = make_uint4(a0[pc], a1[pc], a2[pc], a3[pc]);
  }
}

// Element (m16 tile a, n8 tile b, fragment element i) of this thread's segment totals in the block's totals.
__device__ __forceinline__ float& tc_tot(float* tot, int a, int b, int i) {
  return tot[(16 * a + 4 * b + i) * 256 + threadIdx.x];
}

// The wide block's sums: tile rows 0 .. nt - 1 (nt <= TCM; row i reads input row in_row(i)), block columns as
// tc_fetch_w's, into this thread's totals tc_tot(tot, m16 tile, n8 tile, fragment element) in shared memory (read
// once a segment: registers for two blocks an SM). Every thread must call it (barriers).
template <int DT, int NW, class In>
__device__ __forceinline__ void tc_wide_sums(TcSmem& sm, const float* x, In in_row, int nt, int k, const Mat& w0,
                                             const Mat& w1, int j0, int n, float* tot) {
  constexpr bool QT = DT != DT_BF16;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 2, wn = warp & 3, g = lane >> 2, t = lane & 3;
  int gs = QT ? tc_group_shift(w0.group) : 0;
  int chunks = k / 32, stages = (chunks + TCK_STAGE - 1) / TCK_STAGE;
  float acc[2][4][4];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int b = 0; b < 4; b++)
#pragma unroll
      for (int i = 0; i < 4; i++) { acc[a][b][i] = 0.0f; tc_tot(tot, a, b, i) = 0.0f; }
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
            tc_tot(tot, a, b, i) = seg == 0 ? acc[a][b][i] : tc_tot(tot, a, b, i) + acc[a][b][i];
            acc[a][b][i] = 0.0f;
          }
      seg++;
    }
  };
  TcLoad ld;
  if (stages > 0) {
    tc_fetch_x(x, in_row, nt, k, 0, chunks, ld);
    tc_fetch_w<DT, NW>(sm, 0, k, w0, w1, j0, n, 0, chunks, gs);
  }
  for (int st = 0; st < stages; st++) {
    __syncthreads();  // the stage before is multiplied: A and the other weight buffer are free
    tc_put<QT>(sm, ld);
    tc_async_wait();  // this stage's weight copies have landed
    __syncthreads();
    if (st + 1 < stages) {
      tc_fetch_x(x, in_row, nt, k, st + 1, chunks, ld);
      tc_fetch_w<DT, NW>(sm, (st + 1) & 1, k, w0, w1, j0, n, st + 1, chunks, gs);
    }
#pragma unroll 1
    for (int cc = 0; cc < TCK_STAGE; cc++) {
      int c = TCK_STAGE * st + cc;
      if (c >= chunks) break;
      close_until(c);
      // One m16 tile's fragments at a time (24 registers, not 48: two blocks an SM fit 128 a thread); each
      // accumulator still takes the chunks in order.
#pragma unroll
      for (int mi = 0; mi < 2; mi++) {
        u32 a[3][2][4];
#pragma unroll
        for (int pc = 0; pc < 3; pc++)
#pragma unroll
          for (int h = 0; h < 2; h++) {
            uint4 v = sm.a[cc][pc][2 * wm + mi][h][lane];
            a[pc][h][0] = v.x; a[pc][h][1] = v.y; a[pc][h][2] = v.z; a[pc][h][3] = v.w;
          }
        if (!QT) {
#pragma unroll
          for (int ni = 0; ni < 4; ni++) tc_chunk(acc[mi][ni], a, sm.b[st & 1][cc][4 * wn + ni][lane]);
          continue;
        }
        // Lane element i: tile row 32 wm + 16 mi + g (+ 8 for i >= 2), block column 32 wn + 8 ni + 2t + (i & 1).
        const float xr[2] = {sm.xs[cc][32 * wm + 16 * mi + g], sm.xs[cc][32 * wm + 16 * mi + g + 8]};
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
          Raw8 r = {};
          r.a = sm.b[st & 1][cc][4 * wn + ni][lane];
          float p[4];
          tc_partial(p, a, tc_wfrag<DT>(r));
#pragma unroll
          for (int i = 0; i < 4; i++) {
            int bc = 32 * wn + 8 * ni + 2 * t + (i & 1);
            float v = tc_affine(p[i], sm.sb[st & 1][cc][0][bc], sm.sb[st & 1][cc][1][bc], xr[i >> 1]);
            acc[mi][ni][i] = acc[mi][ni][i] + v;
          }
        }
      }
    }
  }
  close_until(chunks);
}

// Hands the wide block's outputs to put(i, j, y0, y1) for tile rows i < nt and columns j < n. NW == 1: y0 is block
// column j - j0 (y1 unused); NW == 2: y0 from w0 and y1 from w1 at column j (block columns j - j0 and 64 + j - j0),
// which meet in shared memory. Every thread must call it (barriers).
template <int NW, class Put>
__device__ __forceinline__ void tc_wide_out(TcSmem& sm, float* tot, int nt, int j0, int n, Put put) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 2, wn = warp & 3, g = lane >> 2, t = lane & 3;
  float* o = reinterpret_cast<float*>(&sm);  // NW == 2: [TCM][TCN], 32 KiB of the stage's 60.5
  if (NW == 2) __syncthreads();             // the last stage is multiplied
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int r = 32 * wm + 16 * mi + g + (i >= 2 ? 8 : 0), bc = 32 * wn + 8 * ni + 2 * t + (i & 1);
        if (NW == 1) {
          if (r < nt && j0 + bc < n) put(r, j0 + bc, tc_tot(tot, mi, ni, i), 0.0f);
        } else {
          o[r * TCN + bc] = tc_tot(tot, mi, ni, i);
        }
      }
  if (NW == 1) return;
  __syncthreads();
  for (int idx = threadIdx.x; idx < TCM * (TCN / 2); idx += 256) {
    int r = idx / (TCN / 2), c = idx % (TCN / 2);
    if (r < nt && j0 + c < n) put(r, j0 + c, o[r * TCN + c], o[r * TCN + TCN / 2 + c]);
  }
}

// Wide entry points, one a weight dtype (NAME_tcw_bf16, _q8, _q4; the arguments of the narrow entries). Grid x: row
// tiles of TCM rows (MoE: the plan's tiles, planned at TCM slots); grid y: column blocks of TCN (TCN / 2 for the
// gate-up forms, which read two matrices).
#define TCW_ENTRIES(SFX, DT)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256, TCW_BLOCKS)                                                  \
      linear_tcw_##SFX(const float* x, int rows, int k, int n, const void* w, const float* ws, const float* wb,  \
                       int group, const float* bias, float* out) {                                               \
    PDL_ENTRY();                                                                                                 \
    extern __shared__ float tcw_dyn[];                                                                           \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                            \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                   \
    int r0 = TCM * (int)blockIdx.x, nt = rows - r0 < TCM ? rows - r0 : TCM, j0 = TCN * (int)blockIdx.y;          \
    const Mat m = tc_mat(w, ws, wb, group);                                                                      \
    tc_wide_sums<DT, 1>(sm, x, [&](int i) { return r0 + i; }, nt, k, m, m, j0, n, tot);                          \
    tc_wide_out<1>(sm, tot, nt, j0, n, [&](int i, int j, float v, float) {                                       \
      out[(u64)(r0 + i) * (u64)n + j] = bias ? v + bias[j] : v;                                                  \
    });                                                                                                          \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256, TCW_BLOCKS)                                                  \
      gateup_tcw_##SFX(const float* x, int rows, int k, int n, const void* g, const float* gs, const float* gb,  \
                       const void* u, const float* us, const float* ub, int group, float* act) {                 \
    PDL_ENTRY();                                                                                                 \
    extern __shared__ float tcw_dyn[];                                                                           \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                            \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                   \
    int r0 = TCM * (int)blockIdx.x, nt = rows - r0 < TCM ? rows - r0 : TCM, j0 = (TCN / 2) * (int)blockIdx.y;    \
    tc_wide_sums<DT, 2>(sm, x, [&](int i) { return r0 + i; }, nt, k, tc_mat(g, gs, gb, group),                   \
                        tc_mat(u, us, ub, group), j0, n, tot);                                                   \
    tc_wide_out<2>(sm, tot, nt, j0, n, [&](int i, int j, float gv, float uv) {                                   \
      act[(u64)(r0 + i) * (u64)n + j] = silu_mul(gv, uv);                                                        \
    });                                                                                                          \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256, TCW_BLOCKS)                                                  \
      moe_gateup_tcw_##SFX(const float* x, int k, int n, const u64* tab, int group, const int* tiles,            \
                           const int* ntiles, const int* list, int kk, float* act) {                             \
    PDL_ENTRY();                                                                                                 \
    extern __shared__ float tcw_dyn[];                                                                           \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                            \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                   \
    int t = blockIdx.x;                                                                                          \
    if (t >= *ntiles) return;                                                                                    \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = (TCN / 2) * (int)blockIdx.y;        \
    tc_wide_sums<DT, 2>(sm, x, [&](int i) { return list[s0 + i] / kk; }, nt, k, expert_mat(tab, e, 0, group),    \
                        expert_mat(tab, e, 1, group), j0, n, tot);                                               \
    tc_wide_out<2>(sm, tot, nt, j0, n, [&](int i, int j, float gv, float uv) {                                   \
      act[(u64)(s0 + i) * (u64)n + j] = silu_mul(gv, uv);                                                        \
    });                                                                                                          \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256, TCW_BLOCKS)                                                  \
      moe_down_tcw_##SFX(const float* act, int k, int n, const u64* tab, int group, const int* tiles,            \
                         const int* ntiles, const int* list, float* y) {                                         \
    PDL_ENTRY();                                                                                                 \
    extern __shared__ float tcw_dyn[];                                                                           \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                            \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                   \
    int t = blockIdx.x;                                                                                          \
    if (t >= *ntiles) return;                                                                                    \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = TCN * (int)blockIdx.y;              \
    const Mat w = expert_mat(tab, e, 2, group);                                                                  \
    tc_wide_sums<DT, 1>(sm, act, [&](int i) { return s0 + i; }, nt, k, w, w, j0, n, tot);                        \
    tc_wide_out<1>(sm, tot, nt, j0, n,                                                                           \
                   [&](int i, int j, float v, float) { y[(u64)list[s0 + i] * (u64)n + j] = v; });                \
  }
TCW_ENTRIES(bf16, DT_BF16)
TCW_ENTRIES(q8, DT_Q8)
TCW_ENTRIES(q4, DT_Q4)
