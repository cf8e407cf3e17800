//! Tensor-core linears, the wide form (prefill and wide MoE tiles): 64 x 128 blocks of four warps, a warp 16 rows by every column, the narrow form's chain (dense_tc.cu) at every width, bf16 and MLX Q8 / Q4 weights.
// Appended to dense.cu's module after dense_tc.cu (cuda/device/sources.rs), whose pieces, chunk partials and
// segments it uses: a row's bits are the narrow and few-row forms'.

// Wide form (prefill): a block of TCW_THREADS / 32 = 4 warps computes TCM rows by TCN columns; warp w the rows
// 16 w .. +15 (one m16 tile) and every column (sixteen n8 tiles). A warp loads its own rows' activations and splits
// them in registers (tc_frag_split, the narrow form's), one chunk ahead of its mmas, so the activations never pass
// through shared memory; the weights do: B fragments in lane order (one 16-byte load a fragment), two buffers of
// TCK_STAGE chunks, each filled by cp.async a stage ahead, one barrier a stage. A chunk's 16 fragment loads feed 96
// mmas of a warp (a 32 x 32 warp tile fed from staged pieces read 16 for 48): shared memory bandwidth was the wide
// forms' bound beside the tensor pipe.
#define TCM 64
#define TCN 128
#define TCK_STAGE 2
#define TCW_THREADS 128
// Blocks an SM the wide forms are compiled for: two, so registers are not capped below the 255 a thread may hold
// (three would cap them at 170 and spill the accumulators: on an H100, three gave prefill 1.00x main's form and
// two 1.21x; docs/receipts/2026-12-08-gpu-wide-warp-rows.md). Three would fit an SM's shared memory. A block's
// dynamic shared memory is its TcSmem stage, then its segment totals (TCW_TOT floats, [element][thread]): TCW_SMEM
// bytes, tc.rs's WIDE_SMEM.
#define TCW_BLOCKS 2

struct alignas(16) TcSmem {
  uint4 b[2][TCK_STAGE][TCN / 8][32];  // [buffer][chunk][n8 tile][lane]: 8 weights of column 8 tile + lane / 4
                                       // (Q8: the first 8 bytes, 8 codes; Q4: the first 4)
  float sb[2][TCK_STAGE][2][TCN];      // quantized: [buffer][chunk][scale, bias][block column]
};
#define TCW_TOT ((TCN / 8) * 4 * TCW_THREADS)
#define TCW_SMEM (sizeof(TcSmem) + 4 * TCW_TOT)
static_assert(sizeof(TcSmem) % 16 == 0, "the totals start on 16 bytes");
static_assert(TCW_SMEM == 69632, "tc.rs's WIDE_SMEM");
static_assert(sizeof(TcSmem) >= 4 * TCM * TCN, "tc_wide_out's NW == 2 meeting place fits the stage");

// This lane's two rows of x: tile rows r0 + g and r0 + g + 8 (input rows in_row(r)), from element 8 t; null past nt.
// Taken once a block, so no chunk waits on the MoE plan's slot list.
template <class In>
__device__ __forceinline__ void tc_wide_rows(const float* x, In in_row, int nt, int k, int r0, const float* row[2]) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int up = 0; up < 2; up++) {
    int r = r0 + g + 8 * up;
#ifdef FAULT_TC_ROW_MIX
    if (r + 1 < nt) r++;  // planted: a row of the tile reads the next row's activations
#endif
    row[up] = r < nt ? x + (u64)in_row(r) * (u64)k + 8 * t : nullptr;
  }
}

// This lane's activations of chunk c from its rows (tc_wide_rows): v[0] v[1] elements 32 c + 8 t .. + 7 of the first
// row, v[2] v[3] those of the second (tc_frag_split's order); a row past nt, or a chunk past C, is zeros.
__device__ __forceinline__ void tc_wide_x(const float* const row[2], int c, int chunks, float4 v[4]) {
#pragma unroll
  for (int up = 0; up < 2; up++) {
    v[2 * up] = v[2 * up + 1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row[up] && c < chunks) {
      const float4* p = reinterpret_cast<const float4*>(row[up] + 32 * c);
      v[2 * up] = __ldg(p);
      v[2 * up + 1] = __ldg(p + 1);
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

// Thread `tid`'s weight copies of stage `st` into buffer `buf`, in flight until tc_async_wait: unit
// u = tid + TCW_THREADS i is b[buf][cc][tile][lane] with lane = u % 32, cc = (u / 32) % 2, tile = u / 64: block
// column 8 tile + lane / 4 at element 8 (lane % 4) of the chunk (tc_block_col's column); a quantized matrix's scales
// and biases of the stage's chunks go to sb (thread tid copies chunk i's scale, or its bias when tid is odd, of
// block columns tid / 2 and tid / 2 + 64). Chunks past C are zeros.
template <int DT, int NW>
__device__ __forceinline__ void tc_fetch_w(TcSmem& sm, int buf, int k, const Mat& m0, const Mat& m1, int j0, int n,
                                           int st, int chunks, int gs) {
  static_assert(TCK_STAGE == 2 && TCW_THREADS % 64 == 0, "tc_fetch_w's unit fields: 2 chunks, whole n8 tiles a pass");
  int tid = threadIdx.x;
#pragma unroll 2
  for (int i = 0; i < TCK_STAGE * TCN * 4 / TCW_THREADS; i++) {
    int u = tid + TCW_THREADS * i, lane = u & 31, cw = TCK_STAGE * st + ((u >> 5) & 1);
    int bc = 8 * (u >> 6) + (lane >> 2), col;
    const Mat& m = tc_block_col<NW>(m0, m1, j0, n, bc, &col);
    bool ok = cw < chunks;
    const u8* src = tc_col<DT>(m, col, k, lane & 3).w + (ok ? (u64)cw * (4 * TC_LANE_BYTES(DT)) : 0);
    void* dst = &sm.b[buf][(u >> 5) & 1][u >> 6][lane];
    if (DT == DT_BF16) tc_async16(dst, src, ok);
    else tc_async_small<TC_LANE_BYTES(DT)>(dst, src, ok);
  }
  if (DT == DT_BF16) return;
#pragma unroll
  for (int i = 0; i < TCK_STAGE; i++)
#pragma unroll
    for (int h = 0; h < TCN / (TCW_THREADS / 2); h++) {
      int bc = (tid >> 1) + (TCW_THREADS / 2) * h, cw = TCK_STAGE * st + i, col;
      const Mat& m = tc_block_col<NW>(m0, m1, j0, n, bc, &col);
      bool ok = cw < chunks;
      const TcCol cl = tc_col<DT>(m, col, k, 0);
      const float* src = (tid & 1 ? cl.b : cl.s) + (ok ? cw >> gs : 0);
      tc_async_small<4>(&sm.sb[buf][i][tid & 1][bc], src, ok);
    }
}

// Element (n8 tile b, fragment element i) of this thread's segment totals in the block's totals.
__device__ __forceinline__ float& tc_tot(float* tot, int b, int i) {
  return tot[(4 * b + i) * TCW_THREADS + threadIdx.x];
}

// One chunk of a warp's 16 rows into its sums acc over the stage's weights of chunk cc in buffer buf: a fresh
// partial a column tile over the split activations a (tc_chunk's order); quantized, each partial's affine value with
// the rows' sums of x over the chunk xr (tc_xsum's order).
template <int DT>
__device__ __forceinline__ void tc_wide_chunk(const TcSmem& sm, int buf, int cc, const u32 a[3][2][4],
                                              const float xr[2], float acc[TCN / 8][4]) {
  int lane = threadIdx.x & 31, t = lane & 3;
#pragma unroll
  for (int ni = 0; ni < TCN / 8; ni++) {
    if (DT == DT_BF16) {
      tc_chunk(acc[ni], a, sm.b[buf][cc][ni][lane]);
      continue;
    }
    Raw8 r = {};
    r.a = sm.b[buf][cc][ni][lane];
    float p[4];
    tc_partial(p, a, tc_wfrag<DT>(r));
    // Lane element i: warp row g (+ 8 for i >= 2), block column 8 ni + 2t + (i & 1).
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int bc = 8 * ni + 2 * t + (i & 1);
      acc[ni][i] = acc[ni][i] + tc_affine(p[i], sm.sb[buf][cc][0][bc], sm.sb[buf][cc][1][bc], xr[i >> 1]);
    }
  }
}

// The wide block's sums: tile rows 0 .. nt - 1 (nt <= TCM; row i reads input row in_row(i)), block columns as
// tc_fetch_w's, into this thread's totals tc_tot(tot, n8 tile, fragment element) in shared memory (read once a
// segment: registers for three blocks an SM). Every thread must call it (barriers).
template <int DT, int NW, class In>
__device__ __forceinline__ void tc_wide_sums(TcSmem& sm, const float* x, In in_row, int nt, int k, const Mat& w0,
                                             const Mat& w1, int j0, int n, float* tot) {
  int r0 = 16 * (int)(threadIdx.x >> 5);
  bool live = r0 < nt;  // a warp whose rows all lie past nt multiplies nothing: its rows are never written
  int gs = DT != DT_BF16 ? tc_group_shift(w0.group) : 0;
  int chunks = k / 32, stages = (chunks + TCK_STAGE - 1) / TCK_STAGE;
  float acc[TCN / 8][4];
#pragma unroll
  for (int b = 0; b < TCN / 8; b++)
#pragma unroll
    for (int i = 0; i < 4; i++) { acc[b][i] = 0.0f; tc_tot(tot, b, i) = 0.0f; }
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
      for (int b = 0; b < TCN / 8; b++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          tc_tot(tot, b, i) = seg == 0 ? acc[b][i] : tc_tot(tot, b, i) + acc[b][i];
          acc[b][i] = 0.0f;
        }
      seg++;
    }
  };
  const float* row[2];
  tc_wide_rows(x, in_row, nt, k, r0, row);
  float4 v[4];
  if (stages > 0) {
    tc_fetch_w<DT, NW>(sm, 0, k, w0, w1, j0, n, 0, chunks, gs);
    if (live) tc_wide_x(row, 0, chunks, v);
  }
  for (int st = 0; st < stages; st++) {
    tc_async_wait();  // this thread's copies of stage st have landed
    __syncthreads();  // and every thread's; every warp is done with stage st - 1, whose buffer the next copies fill
    if (st + 1 < stages) tc_fetch_w<DT, NW>(sm, (st + 1) & 1, k, w0, w1, j0, n, st + 1, chunks, gs);
#pragma unroll
    for (int cc = 0; cc < TCK_STAGE; cc++) {
      int c = TCK_STAGE * st + cc;
      if (c >= chunks) break;
      close_until(c);
      if (!live) continue;
      float4 vn[4];
      tc_wide_x(row, c + 1, chunks, vn);  // the next chunk's loads wait in registers
      u32 a[3][2][4];
      tc_frag_split(v, true, a);
      float xr[2] = {0.0f, 0.0f};
      if (DT != DT_BF16) {
        xr[0] = tc_xsum(v[0], v[1]);
        xr[1] = tc_xsum(v[2], v[3]);
      }
      tc_wide_chunk<DT>(sm, st & 1, cc, a, xr, acc);
#pragma unroll
      for (int q = 0; q < 4; q++) v[q] = vn[q];
    }
  }
  close_until(chunks);
}

// Hands the wide block's outputs to put(i, j, y0, y1) for tile rows i < nt and columns j < n. NW == 1: y0 is block
// column j - j0 (y1 unused); NW == 2: y0 from w0 and y1 from w1 at column j (block columns j - j0 and 64 + j - j0),
// which meet in shared memory. Every thread must call it (barriers).
template <int NW, class Put>
__device__ __forceinline__ void tc_wide_out(TcSmem& sm, float* tot, int nt, int j0, int n, Put put) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = 16 * (int)(threadIdx.x >> 5);
  float* o = reinterpret_cast<float*>(&sm);  // NW == 2: [TCM][TCN], 32 KiB of the stage's 36
  if (NW == 2) __syncthreads();             // every warp is done with the last stage's weights
#pragma unroll
  for (int ni = 0; ni < TCN / 8; ni++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int r = r0 + g + (i >= 2 ? 8 : 0), bc = 8 * ni + 2 * t + (i & 1);
      if (NW == 1) {
        if (r < nt && j0 + bc < n) put(r, j0 + bc, tc_tot(tot, ni, i), 0.0f);
      } else {
        o[r * TCN + bc] = tc_tot(tot, ni, i);
      }
    }
  if (NW == 1) return;
  __syncthreads();
  for (int idx = threadIdx.x; idx < TCM * (TCN / 2); idx += TCW_THREADS) {
    int r = idx / (TCN / 2), c = idx % (TCN / 2);
    if (r < nt && j0 + c < n) put(r, j0 + c, o[r * TCN + c], o[r * TCN + TCN / 2 + c]);
  }
}

// Wide entry points, one a weight dtype (NAME_tcw_bf16, _q8, _q4; the arguments of the narrow entries). Grid x: row
// tiles of TCM rows (MoE: the plan's tiles, planned at TCM slots); grid y: column blocks of TCN (TCN / 2 for the
// gate-up forms, which read two matrices).
#define TCW_ENTRIES(SFX, DT)                                                                                         \
  extern "C" __global__ void __launch_bounds__(TCW_THREADS, TCW_BLOCKS)                                              \
      linear_tcw_##SFX(const float* x, int rows, int k, int n, const void* w, const float* ws, const float* wb,      \
                       int group, const float* bias, float* out) {                                                   \
    PDL_ENTRY();                                                                                                     \
    extern __shared__ float tcw_dyn[];                                                                               \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                                \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                       \
    int r0 = TCM * (int)blockIdx.x, nt = rows - r0 < TCM ? rows - r0 : TCM, j0 = TCN * (int)blockIdx.y;              \
    const Mat m = tc_mat(w, ws, wb, group);                                                                          \
    tc_wide_sums<DT, 1>(sm, x, [&](int i) { return r0 + i; }, nt, k, m, m, j0, n, tot);                              \
    tc_wide_out<1>(sm, tot, nt, j0, n, [&](int i, int j, float v, float) {                                           \
      out[(u64)(r0 + i) * (u64)n + j] = bias ? v + bias[j] : v;                                                      \
    });                                                                                                              \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(TCW_THREADS, TCW_BLOCKS)                                              \
      gateup_tcw_##SFX(const float* x, int rows, int k, int n, const void* g, const float* gs, const float* gb,      \
                       const void* u, const float* us, const float* ub, int group, float* act) {                     \
    PDL_ENTRY();                                                                                                     \
    extern __shared__ float tcw_dyn[];                                                                               \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                                \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                       \
    int r0 = TCM * (int)blockIdx.x, nt = rows - r0 < TCM ? rows - r0 : TCM, j0 = (TCN / 2) * (int)blockIdx.y;        \
    tc_wide_sums<DT, 2>(sm, x, [&](int i) { return r0 + i; }, nt, k, tc_mat(g, gs, gb, group),                       \
                        tc_mat(u, us, ub, group), j0, n, tot);                                                       \
    tc_wide_out<2>(sm, tot, nt, j0, n, [&](int i, int j, float gv, float uv) {                                       \
      act[(u64)(r0 + i) * (u64)n + j] = silu_mul(gv, uv);                                                            \
    });                                                                                                              \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(TCW_THREADS, TCW_BLOCKS)                                              \
      moe_gateup_tcw_##SFX(const float* x, int k, int n, const u64* tab, int group, const int* tiles,                \
                           const int* ntiles, const int* list, int kk, float* act) {                                 \
    PDL_ENTRY();                                                                                                     \
    extern __shared__ float tcw_dyn[];                                                                               \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                                \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                       \
    int t = blockIdx.x;                                                                                              \
    if (t >= *ntiles) return;                                                                                        \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = (TCN / 2) * (int)blockIdx.y;            \
    tc_wide_sums<DT, 2>(sm, x, [&](int i) { return list[s0 + i] / kk; }, nt, k, expert_mat(tab, e, 0, group),        \
                        expert_mat(tab, e, 1, group), j0, n, tot);                                                   \
    tc_wide_out<2>(sm, tot, nt, j0, n, [&](int i, int j, float gv, float uv) {                                       \
      act[(u64)(s0 + i) * (u64)n + j] = silu_mul(gv, uv);                                                            \
    });                                                                                                              \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(TCW_THREADS, TCW_BLOCKS)                                              \
      moe_down_tcw_##SFX(const float* act, int k, int n, const u64* tab, int group, const int* tiles,                \
                         const int* ntiles, const int* list, float* y) {                                             \
    PDL_ENTRY();                                                                                                     \
    extern __shared__ float tcw_dyn[];                                                                               \
    TcSmem& sm = *reinterpret_cast<TcSmem*>(tcw_dyn);                                                                \
    float* tot = tcw_dyn + sizeof(TcSmem) / 4;                                                                       \
    int t = blockIdx.x;                                                                                              \
    if (t >= *ntiles) return;                                                                                        \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2], j0 = TCN * (int)blockIdx.y;                  \
    const Mat w = expert_mat(tab, e, 2, group);                                                                      \
    tc_wide_sums<DT, 1>(sm, act, [&](int i) { return s0 + i; }, nt, k, w, w, j0, n, tot);                            \
    tc_wide_out<1>(sm, tot, nt, j0, n,                                                                               \
                   [&](int i, int j, float v, float) { y[(u64)list[s0 + i] * (u64)n + j] = v; });                    \
  }
TCW_ENTRIES(bf16, DT_BF16)
TCW_ENTRIES(q8, DT_Q8)
TCW_ENTRIES(q4, DT_Q4)
