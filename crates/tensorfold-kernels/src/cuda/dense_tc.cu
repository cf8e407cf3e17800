//! Tensor-core linears for bf16 and MLX Q8 / Q4 matrices with k % 32 == 0 (issue 22's first form): f32 activations as three bf16 pieces on mma.sync, one K order at every width.
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
//   holds element 8t + 4h + 2j + e of the chunk (t = lane % 4, j, e in {0, 1}): each lane loads 8 contiguous
//   weights of its column (16 bytes of bf16, 8 of Q8 codes, 4 of Q4; tc_frag_split, the few-row form's operands
//   and the wide tile's staging use the same map). A quantized chunk's value is below (tc_affine).
// - A segment adds its chunks' values in increasing order from +0 with f32 adds; the segments add in order:
//   ((seg0 + seg1) + seg2) + seg3.
// The tensor cores' internal sum of a partial is not IEEE round-to-nearest, which is why each 32-element chunk gets
// a fresh partial: an f32 add rounds each chunk in (the fold measured in tools/cuda/tc, 2.1e-7..2.5e-7 relative).
#define TC_SEGS 4
// Shared floats of a narrow or few-row block's segment sums (G * NW at most 4).
#define TC_SEG_FLOATS (TC_SEGS * 4 * 128)

// tc_pieces3 with the linears' planted control: the split is most of a narrow block's instructions.
__device__ __forceinline__ void tc_split2(float v0, float v1, u32 p[3]) {
  tc_pieces3(v0, v1, p);
#ifdef FAULT_TC_DROP_LO
  p[1] = 0u;  // planted: the activations rounded to one bf16 piece
  p[2] = 0u;
#endif
}

// One chunk's tensor-core partial p from +0 over a[piece][half] with the weights q, in piece then half order.
__device__ __forceinline__ void tc_partial(float p[4], const u32 a[3][2][4], uint4 q) {
  p[0] = p[1] = p[2] = p[3] = 0.0f;
#pragma unroll
  for (int pc = 0; pc < 3; pc++) {
    tc_mma(p, a[pc][0], q.x, q.y);
    tc_mma(p, a[pc][1], q.z, q.w);
  }
}

// One chunk into a segment's sums acc: a fresh partial over a[piece][half] with the weights q (this lane's 16 bytes
// of its column: q.x q.y the first half's B fragment, q.z q.w the second's), then one f32 add an element.
__device__ __forceinline__ void tc_chunk(float acc[4], const u32 a[3][2][4], uint4 q) {
  float p[4];
  tc_partial(p, a, q);
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

// A block's per-lane sums (G groups, NW matrices, 4 fragment elements) set to +0.
template <int NW, int G>
__device__ __forceinline__ void tc_zero(float (&a)[G][NW][4]) {
#pragma unroll
  for (int gi = 0; gi < G; gi++)
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) a[gi][m][i] = 0.0f;
}

// One chunk's partials into the segment's sums: one f32 add an element, the chunk order the caller's.
template <int NW, int G>
__device__ __forceinline__ void tc_add(float (&acc)[G][NW][4], const float (&part)[G][NW][4]) {
#pragma unroll
  for (int gi = 0; gi < G; gi++)
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[gi][m][i] = acc[gi][m][i] + part[gi][m][i];
}

// The end of a narrow or few-row block: warp s's segment sums acc (lane element i of group gi, matrix m) meet in seg
// (seg[((s * G + gi) * NW + m) * 128 + 4 lane + i]); warp gi < G adds group gi's segments in order and hands lane
// element i to put_at(gi, i, y0, y1) (y1 from matrix 1 when NW == 2). Every thread must call it (a barrier).
template <int NW, int G, class PutAt>
__device__ __forceinline__ void tc_fold(float* seg, const float (&acc)[G][NW][4], PutAt put_at) {
  static_assert(TC_SEGS * G * NW * 128 <= TC_SEG_FLOATS, "a block's segment sums fit seg");
  int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
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
    put_at(gi, i, v[0], v[NW - 1]);
  }
}

// Quantized matrices (MLX affine Q8 and Q4, group a power-of-two multiple of 32, so a chunk lies in one group) take
// the same chunks, segments and folds with one change to a chunk's value: its tensor-core partial is over the codes
// q (integers below 256, exact in bf16) from +0 as a bf16 partial is over the weights, P = sum q x, and the chunk's
// value is fmaf(s, P, b * X) with the group's scale s and bias b (f32) and X the chunk's sum of x (tc_xsum's order):
// issue 23's `scale * sum(q * x) + bias * sum(x)` per chunk, with no dequantized weight anywhere.

// A column's cursor in the few-row and narrow forms: this lane's 8 weights of chunk c (elements 32 c + 8 t ..) at
// w + c * 4 * TC_LANE_BYTES(DT); a quantized matrix's scales and biases of the column.
#define TC_LANE_BYTES(DT) ((DT) == DT_BF16 ? 16 : (DT) == DT_Q8 ? 8 : 4)
struct TcCol {
  const u8* w;
  const float* s;
  const float* b;
};

template <int DT>
__device__ __forceinline__ TcCol tc_col(const Mat& m, int col, int k, int t) {
  TcCol cl;
  const u64 lanes = (u64)(k / 8);  // 8-weight parts a column
  cl.w = static_cast<const u8*>(m.w) + ((u64)col * lanes + (u64)t) * TC_LANE_BYTES(DT);
  cl.s = cl.b = nullptr;
  if (DT != DT_BF16) {
    u64 g = (u64)col * (u64)(k / m.group);
    cl.s = m.scales + g;
    cl.b = m.biases + g;
  }
  return cl;
}

// Chunks a group, as a shift (the host's tc() admits groups of 32 << gs elements only).
__device__ __forceinline__ int tc_group_shift(int group) {
  int gs = 0;
  while ((32 << gs) < group && gs < 24) gs++;
  return gs;
}

// Chunk c of the column as Raw8 (bf16: a, 8 values; Q8: a.x a.y, 8 codes; Q4: a.x, 8 codes; s, o the scale and bias).
template <int DT>
__device__ __forceinline__ Raw8 tc_load(const TcCol& cl, int c, int gs) {
  Raw8 r;
  r.s = r.o = 0.0f;
  const u8* p = cl.w + (u64)c * (4 * TC_LANE_BYTES(DT));
  if (DT == DT_BF16) {
    r.a = __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    if (DT == DT_Q8) {
      uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
      r.a.x = a.x;
      r.a.y = a.y;
    } else {
      r.a.x = __ldg(reinterpret_cast<const u32*>(p));
    }
    r.s = __ldg(cl.s + (c >> gs));
    r.o = __ldg(cl.b + (c >> gs));
  }
  return r;
}

// Two codes as a packed bf16 pair (lo in the low half): a code below 256 is exact in bf16, the high half of its f32.
__device__ __forceinline__ u32 tc_code_pair(u32 lo, u32 hi) {
  return (__float_as_uint((float)lo) >> 16) | (__float_as_uint((float)hi) & 0xffff0000u);
}

// A loaded chunk's 8 weights as the mma's operand words in memory order (.x elements 0 and 1, ... .w 6 and 7): a bf16
// chunk as loaded, a quantized one's codes widened (Q4: element 2i in the low nibble of byte i, as MLX packs them).
template <int DT>
__device__ __forceinline__ uint4 tc_wfrag(const Raw8& r) {
  if (DT == DT_BF16) return r.a;
  u32 c[8];
#pragma unroll
  for (int e = 0; e < 8; e++) {
    if (DT == DT_Q4) c[e] = (r.a.x >> (4 * e)) & 0xfu;
    else c[e] = ((e < 4 ? r.a.x : r.a.y) >> (8 * (e & 3))) & 0xffu;
  }
  return make_uint4(tc_code_pair(c[0], c[1]), tc_code_pair(c[2], c[3]), tc_code_pair(c[4], c[5]),
                    tc_code_pair(c[6], c[7]));
}

// X of a quantized chunk for the tile row whose 8 elements 8t .. 8t + 7 this lane holds (a, b), the row's four lanes
// t holding the chunk: each lane sums its 8 in order, then the butterfly gives (x0 + x1) + (x2 + x3) (IEEE adds
// commute, so the four lanes agree bit for bit). Every lane of the warp must call it.
__device__ __forceinline__ float tc_xsum(const float4& a, const float4& b) {
  float v = a.x + a.y;
  v = v + a.z;
  v = v + a.w;
  v = v + b.x;
  v = v + b.y;
  v = v + b.z;
  v = v + b.w;
  v = v + __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// A quantized chunk's value from its partial p = sum q x: s p + b X, as fmaf(s, p, b * X).
__device__ __forceinline__ float tc_affine(float p, float s, float b, float xs) {
#ifdef FAULT_TC_Q_BIAS
  return s * p;  // planted: the group's bias term dropped
#else
  return fmaf(s, p, b * xs);
#endif
}

// Narrow form (decode and verify rounds): a block of TC_SEGS warps (32 * TC_SEGS threads) computes G groups of 8
// columns from j0 (group gi: columns j0 + 8 gi ..) of matrix m0 (and of m1 when NW == 2) over a tile of nt <= 16
// rows; tile row i reads input row in_row(i) of x (f32, rows of k). Warp s computes segment s of every output from
// the f32 activations, split into pieces in registers once for the G groups (so a block of G groups splits an
// activation once for 8 G columns); the segments meet in seg (TC_SEGS * G * NW * 128 floats of shared memory) and
// warp gi adds group gi's in order and hands each output to put(i, j, y0, y1). G changes no bit of an output (each
// output's chain is the same), so the host picks it by the column count. DT: DT_BF16, DT_Q8 or DT_Q4.
template <int DT, int NW, int G, class In, class Put>
__device__ __forceinline__ void tc_narrow(float* seg, const float* x, int k, int n, const Mat& m0, const Mat& m1,
                                          int j0, int nt, In in_row, Put put) {
  constexpr int U = NW * G >= 4 ? 2 : 4;  // chunks in flight: U * G * NW weight loads a lane
  constexpr bool QT = DT != DT_BF16;
  int lane = threadIdx.x & 31, s = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  bool oka = g < nt, okb = g + 8 < nt, two = nt > 8;  // two is the block's: rows g + 8 are loaded and split
  int chunks = k / 32, c0 = tc_seg_start(s, chunks), c1 = tc_seg_start(s + 1, chunks);
  int gs = QT ? tc_group_shift(m0.group) : 0;
  TcCol p[G][NW];  // column j0 + 8 gi + g
#pragma unroll
  for (int gi = 0; gi < G; gi++) {
    int col = j0 + 8 * gi + g < n ? j0 + 8 * gi + g : n - 1;  // a column past n: the last one, never written
    p[gi][0] = tc_col<DT>(m0, col, k, t);
    p[gi][NW - 1] = tc_col<DT>(m1, col, k, t);
  }
  const float4* xa = reinterpret_cast<const float4*>(x + (u64)in_row(oka ? g : 0) * (u64)k + 8 * t);  // + 8c
  const float4* xb = reinterpret_cast<const float4*>(x + (u64)in_row(okb ? g + 8 : 0) * (u64)k + 8 * t);
  const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float acc[G][NW][4];
  tc_zero<NW, G>(acc);
  // U chunks at a time: every load issued first, then each chunk's pieces split and its partials (independent
  // chains from +0, each in piece then half order), then folded in chunk order: the bits of one chunk at a time.
  for (int c = c0; c < c1; c += U) {
    Raw8 q[U][G][NW];
    float4 v[U][4];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1) {
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
          for (int m = 0; m < NW; m++) q[u][gi][m] = tc_load<DT>(p[gi][m], c + u, gs);
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
      tc_zero<NW, G>(part[u]);
      uint4 wf[G][NW];
#pragma unroll
      for (int gi = 0; gi < G; gi++)
#pragma unroll
        for (int m = 0; m < NW; m++) wf[gi][m] = tc_wfrag<DT>(q[u][gi][m]);
#pragma unroll
      for (int pc = 0; pc < 3; pc++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int m = 0; m < NW; m++) {
              const uint4& w = wf[gi][m];
              tc_mma(part[u][gi][m], a[pc][h], h ? w.z : w.x, h ? w.w : w.y);
            }
      if (QT) {
        // Lane element i: tile row g (+ 8 for i >= 2), column 2t + (i & 1), whose scale and bias lane 4 (2t + e) loaded.
        const float xs[2] = {tc_xsum(v[u][0], v[u][1]), tc_xsum(v[u][2], v[u][3])};
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
          for (int m = 0; m < NW; m++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              float sc = __shfl_sync(0xffffffffu, q[u][gi][m].s, 4 * (2 * t + e));
              float bc = __shfl_sync(0xffffffffu, q[u][gi][m].o, 4 * (2 * t + e));
#pragma unroll
              for (int hi = 0; hi < 2; hi++)
                part[u][gi][m][2 * hi + e] = tc_affine(part[u][gi][m][2 * hi + e], sc, bc, xs[hi]);
            }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1) tc_add<NW, G>(acc, part[u]);
  }
  tc_fold<NW, G>(seg, acc, [&](int gi, int i, float y0, float y1) {
    int r = g + (i >= 2 ? 8 : 0), j = j0 + 8 * gi + 2 * t + (i & 1);
    if (r < nt && j < n) put(r, j, y0, y1);
  });
}

// Few-row form (tiles of at most 8 rows: decode of a few streams, the MoE plan's tiles of RT slots): the narrow
// form with the operands swapped. The weights are the mma's A operand (group gi's 16 columns j0 + 16 gi ..: lane
// rows g and g + 8) and the activations its B operand (8 tile rows: lane column g is tile row g), so a chunk splits
// 8 activations a lane where the narrow form splits 16, and one mma covers 16 columns where it covers 8. Each
// output's slots, pieces, chunks and segments are the narrow form's, so is its chain (the contract's invariance
// gates compare the forms bit for bit on the device; the CPU emulation's mma is symmetric by its definition).
template <int DT, int NW, int G, class In, class Put>
__device__ __forceinline__ void tc_few(float* seg, const float* x, int k, int n, const Mat& m0, const Mat& m1, int j0,
                                       int nt, In in_row, Put put) {
  constexpr int U = NW * G >= 4 ? 2 : 4;  // chunks in flight: 2 U G NW weight loads a lane
  constexpr bool QT = DT != DT_BF16;
  int lane = threadIdx.x & 31, s = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  bool ok = g < nt;
  int chunks = k / 32, c0 = tc_seg_start(s, chunks), c1 = tc_seg_start(s + 1, chunks);
  int gs = QT ? tc_group_shift(m0.group) : 0;
  TcCol p[G][NW][2];  // columns g and g + 8 of group gi
#pragma unroll
  for (int gi = 0; gi < G; gi++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      int col = j0 + 16 * gi + 8 * hh + g;
      col = col < n ? col : n - 1;  // a column past n: the last one, never written
      p[gi][0][hh] = tc_col<DT>(m0, col, k, t);
      p[gi][NW - 1][hh] = tc_col<DT>(m1, col, k, t);
    }
  const float4* xr = reinterpret_cast<const float4*>(x + (u64)in_row(ok ? g : 0) * (u64)k + 8 * t);  // + 8c
  const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float acc[G][NW][4];
  tc_zero<NW, G>(acc);
  for (int c = c0; c < c1; c += U) {
    Raw8 q[U][G][NW][2];
    float4 v[U][2];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1) {
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
          for (int m = 0; m < NW; m++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) q[u][gi][m][hh] = tc_load<DT>(p[gi][m][hh], c + u, gs);
        v[u][0] = ok ? __ldg(xr + 8 * (c + u)) : z;
        v[u][1] = ok ? __ldg(xr + 8 * (c + u) + 1) : z;
      }
    float part[U][G][NW][4];
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (c + u >= c1) continue;
      u32 b[3][2][2];  // [piece][half]: b0 slots 2t, 2t + 1 (elements 8t + 4h ..), b1 slots 2t + 8, 2t + 9
#pragma unroll
      for (int h = 0; h < 2; h++) {
        u32 p0[3], p1[3];
        tc_split2(v[u][h].x, v[u][h].y, p0);
        tc_split2(v[u][h].z, v[u][h].w, p1);
#pragma unroll
        for (int pc = 0; pc < 3; pc++) {
          b[pc][h][0] = p0[pc];
          b[pc][h][1] = p1[pc];
        }
      }
      tc_zero<NW, G>(part[u]);
      uint4 wf[G][NW][2];
#pragma unroll
      for (int gi = 0; gi < G; gi++)
#pragma unroll
        for (int m = 0; m < NW; m++)
#pragma unroll
          for (int hh = 0; hh < 2; hh++) wf[gi][m][hh] = tc_wfrag<DT>(q[u][gi][m][hh]);
#pragma unroll
      for (int pi = 0; pi < 3; pi++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int m = 0; m < NW; m++) {
#ifdef FAULT_TC_FEW_ORDER
              const int pc = 2 - pi;  // planted: the few-row form adds the pieces lo2, lo, hi (not the narrow order)
#else
              const int pc = pi;
#endif
              const uint4 &lo = wf[gi][m][0], &hi = wf[gi][m][1];  // columns g and g + 8
              const u32 a[4] = {h ? lo.z : lo.x, h ? hi.z : hi.x, h ? lo.w : lo.y, h ? hi.w : hi.y};
              tc_mma(part[u][gi][m], a, b[pc][h][0], b[pc][h][1]);
            }
      if (QT) {
        // Lane element i: column g (+ 8 for i >= 2, this lane's loads), tile row 2t + (i & 1), whose X lane 4 (2t + e) has.
        float xg = tc_xsum(v[u][0], v[u][1]);
        const float xs[2] = {__shfl_sync(0xffffffffu, xg, 8 * t), __shfl_sync(0xffffffffu, xg, 8 * t + 4)};
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
          for (int m = 0; m < NW; m++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
              const Raw8& r = q[u][gi][m][i >> 1];
              part[u][gi][m][i] = tc_affine(part[u][gi][m][i], r.s, r.o, xs[i & 1]);
            }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c + u < c1) tc_add<NW, G>(acc, part[u]);
  }
  // Lane element i: column g (+ 8 for i >= 2) of the group, tile row 2t + (i & 1).
  tc_fold<NW, G>(seg, acc, [&](int gi, int i, float y0, float y1) {
    int r = 2 * t + (i & 1), j = j0 + 16 * gi + g + (i >= 2 ? 8 : 0);
    if (r < nt && j < n) put(r, j, y0, y1);
  });
}

// A narrow form of G groups of 8 columns a block (the column blocks along grid x).
template <int DT, int NW, int G, class In, class Put>
__device__ __forceinline__ void tc_narrow_g(float* seg, const float* x, int k, int n, const Mat& m0, const Mat& m1,
                                            int nt, In in_row, Put put) {
  tc_narrow<DT, NW, G>(seg, x, k, n, m0, m1, 8 * G * (int)blockIdx.x, nt, in_row, put);
}

// A few-row form of G groups of 16 columns a block (the column blocks along grid x).
template <int DT, int NW, int G, class In, class Put>
__device__ __forceinline__ void tc_few_g(float* seg, const float* x, int k, int n, const Mat& m0, const Mat& m1, int nt,
                                         In in_row, Put put) {
  tc_few<DT, NW, G>(seg, x, k, n, m0, m1, 16 * G * (int)blockIdx.x, nt, in_row, put);
}

// A matrix from its entry's arguments.
__device__ __forceinline__ Mat tc_mat(const void* w, const float* ws, const float* wb, int group) {
  Mat m;
  m.w = w;
  m.scales = ws;
  m.biases = wb;
  m.group = group;
  return m;
}

// Narrow (NAME_tcG_DT) and few-row (NAME_tcfG_DT) entry points, one for each group count G and weight dtype (bf16,
// q8, q4; a kernel's registers are its largest instantiation's, so each gets its own). Grid x: column blocks of 8 G
// (narrow) or 16 G (few-row); grid y: row tiles of TR (16 narrow, 8 few-row: linear, gateup) or the plan's tiles from
// tile0 (MoE, few-row only: tiles of at most RT = 8 slots). A bf16 matrix passes null scales and biases.
#define TC_LINEAR_ENTRY(NAME, FORM, TR, G, DT)                                                                     \
  extern "C" __global__ void __launch_bounds__(128)                                                               \
      NAME(const float* x, int rows, int k, int n, const void* w, const float* ws, const float* wb, int group,     \
           const float* bias, float* out) {                                                                       \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int r0 = TR * (int)blockIdx.y, nt = rows - r0 < TR ? rows - r0 : TR;                                          \
    auto put = [&](int i, int j, float v, float) { out[(u64)(r0 + i) * (u64)n + j] = bias ? v + bias[j] : v; };  \
    const Mat m = tc_mat(w, ws, wb, group);                                                                       \
    FORM<DT, 1, G>(seg, x, k, n, m, m, nt, [&](int i) { return r0 + i; }, put);                                   \
  }

// q/k/v-style linears of one input in one few-row launch (a call of at most 8 rows): the table is dense.cu's
// linear3 one (6 words a matrix: values, scales, biases, outputs, out, first block), blocks counted in 16 G columns;
// each matrix's outputs are its own linear_tcfG launch's, bit for bit (gate `multi`).
#define TC_LINEAR3_FEW_ENTRY(NAME, G, DT)                                                                          \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* x, int rows, int k, int group,              \
                                                         const u64* mats) {                                       \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int i;                                                                                                        \
    int bx = multi_block(mats, &i);                                                                               \
    const u64* d = mats + 6 * i;                                                                                  \
    int n = (int)d[3], nt = rows < 8 ? rows : 8;                                                                  \
    const Mat m = tc_mat((const void*)d[0], (const float*)d[1], (const float*)d[2], group);                       \
    float* out = reinterpret_cast<float*>(d[4]);                                                                  \
    auto put = [&](int r, int j, float v, float) { out[(u64)r * (u64)n + j] = v; };                               \
    tc_few<DT, 1, G>(seg, x, k, n, m, m, 16 * G * bx, nt, [&](int r) { return r; }, put);                         \
  }

#define TC_GATEUP_ENTRY(NAME, FORM, TR, G, DT)                                                                     \
  extern "C" __global__ void __launch_bounds__(128)                                                               \
      NAME(const float* x, int rows, int k, int n, const void* g, const float* gs, const float* gb, const void* u, \
           const float* us, const float* ub, int group, float* act) {                                             \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int r0 = TR * (int)blockIdx.y, nt = rows - r0 < TR ? rows - r0 : TR;                                          \
    auto put = [&](int i, int j, float gv, float uv) { act[(u64)(r0 + i) * (u64)n + j] = silu_mul(gv, uv); };    \
    FORM<DT, 2, G>(seg, x, k, n, tc_mat(g, gs, gb, group), tc_mat(u, us, ub, group), nt,                          \
                   [&](int i) { return r0 + i; }, put);                                                           \
  }

// MoE gate-up over tile t of the plan: slot s reads input row list[s] / kk of x [rows, k].
#define TC_MOE_GATEUP_ENTRY(NAME, G, DT)                                                                           \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* x, int k, int n, const u64* tab, int group, \
                                                         const int* tiles, const int* ntiles, const int* list,    \
                                                         int kk, float* act, int tile0) {                         \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int t = tile0 + (int)blockIdx.y;                                                                              \
    if (t >= *ntiles) return;                                                                                     \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2];                                           \
    auto put = [&](int i, int j, float gv, float uv) { act[(u64)(s0 + i) * (u64)n + j] = silu_mul(gv, uv); };    \
    tc_few_g<DT, 2, G>(seg, x, k, n, expert_mat(tab, e, 0, group), expert_mat(tab, e, 1, group), nt,              \
                       [&](int i) { return list[s0 + i] / kk; }, put);                                            \
  }

// MoE down projection over tile t: slot s reads activation row s of act [slots, k] and writes y[list[s]].
#define TC_MOE_DOWN_ENTRY(NAME, G, DT)                                                                             \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* act, int k, int n, const u64* tab,          \
                                                         int group, const int* tiles, const int* ntiles,          \
                                                         const int* list, float* y, int tile0) {                  \
    PDL_ENTRY();                                                                                                  \
    __shared__ float seg[TC_SEG_FLOATS];                                                                          \
    int t = tile0 + (int)blockIdx.y;                                                                              \
    if (t >= *ntiles) return;                                                                                     \
    int e = tiles[3 * t], s0 = tiles[3 * t + 1], nt = tiles[3 * t + 2];                                           \
    auto put = [&](int i, int j, float v, float) { y[(u64)list[s0 + i] * (u64)n + j] = v; };                      \
    const Mat w = expert_mat(tab, e, 2, group);                                                                   \
    tc_few_g<DT, 1, G>(seg, act, k, n, w, w, nt, [&](int i) { return s0 + i; }, put);                             \
  }

// Every narrow and few-row entry of one weight dtype (SFX: bf16, q8, q4).
#define TC_NARROW_ENTRIES(SFX, DT)                              \
  TC_LINEAR_ENTRY(linear_tc1_##SFX, tc_narrow_g, 16, 1, DT)     \
  TC_LINEAR_ENTRY(linear_tc2_##SFX, tc_narrow_g, 16, 2, DT)     \
  TC_LINEAR_ENTRY(linear_tc4_##SFX, tc_narrow_g, 16, 4, DT)     \
  TC_LINEAR_ENTRY(linear_tcf1_##SFX, tc_few_g, 8, 1, DT)        \
  TC_LINEAR_ENTRY(linear_tcf2_##SFX, tc_few_g, 8, 2, DT)        \
  TC_LINEAR_ENTRY(linear_tcf4_##SFX, tc_few_g, 8, 4, DT)        \
  TC_LINEAR3_FEW_ENTRY(linear3_tcf1_##SFX, 1, DT)               \
  TC_LINEAR3_FEW_ENTRY(linear3_tcf2_##SFX, 2, DT)               \
  TC_LINEAR3_FEW_ENTRY(linear3_tcf4_##SFX, 4, DT)               \
  TC_GATEUP_ENTRY(gateup_tc1_##SFX, tc_narrow_g, 16, 1, DT)     \
  TC_GATEUP_ENTRY(gateup_tc2_##SFX, tc_narrow_g, 16, 2, DT)     \
  TC_GATEUP_ENTRY(gateup_tcf1_##SFX, tc_few_g, 8, 1, DT)        \
  TC_GATEUP_ENTRY(gateup_tcf2_##SFX, tc_few_g, 8, 2, DT)        \
  TC_MOE_GATEUP_ENTRY(moe_gateup_tcf1_##SFX, 1, DT)             \
  TC_MOE_GATEUP_ENTRY(moe_gateup_tcf2_##SFX, 2, DT)             \
  TC_MOE_DOWN_ENTRY(moe_down_tcf1_##SFX, 1, DT)                 \
  TC_MOE_DOWN_ENTRY(moe_down_tcf2_##SFX, 2, DT)                 \
  TC_MOE_DOWN_ENTRY(moe_down_tcf4_##SFX, 4, DT)
TC_NARROW_ENTRIES(bf16, DT_BF16)
TC_NARROW_ENTRIES(q8, DT_Q8)
TC_NARROW_ENTRIES(q4, DT_Q4)
