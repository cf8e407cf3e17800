//! LFM2 short conv kernels over a segment table: outputs from each stream's state and the call's B*x rows, the kept rollback window, then the advanced state (three launches, or one for short segments).
// Segment table, 4 words a segment: d[0] the stream's state (f32 [taps - 1, width], oldest row first), d[1] the
// window to fill (f32 [taps - 1 + rows, width]: the state's rows then the segment's B*x rows) or 0, d[2] the first
// call row, d[3] the rows. Each output element is one thread with the CPU's exact arithmetic order (taps in
// order, multiply then add, bias last, then the C gate), so a row's bits depend only on its own stream.

__device__ __forceinline__ float bx_at(const float* bcx, u64 row, int width, int c) {
  const float* r = bcx + row * 3 * (u64)width;
  return r[c] * r[2 * width + c];
}

// out[r, c] = C[r, c] * (sum_i w[c, i] * Bx[window row t + i, c] + bias[c]), t the row's index in its segment.
extern "C" __global__ void conv_out(const float* bcx, int width, int taps, const float* w, const float* bias,
                                    const u64* segs, const u32* row_seg, int rows, float* out) {
  PDL_ENTRY();
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * (u64)width) return;
  u64 r = i / (u64)width;
  int c = (int)(i % (u64)width);
  u64 si = row_seg[r];
#ifdef FAULT_CONV_FIRST_STREAM
  const float* st = (const float*)segs[0];
#else
  const float* st = (const float*)segs[4 * si];
#endif
  u64 first = segs[4 * si + 2];
  int t = (int)(r - first);
  int hist = taps - 1;
  float acc = 0.0f;
  for (int k = 0; k < taps; k++) {
    int wi = t + k;
    float b = wi < hist ? st[(u64)wi * (u64)width + c] : bx_at(bcx, first + (u64)(wi - hist), width, c);
    acc = acc + w[(u64)c * (u64)taps + k] * b;
  }
  if (bias) acc = acc + bias[c];
  out[i] = bcx[r * 3 * (u64)width + width + c] * acc;
}

// Fills each segment's window (when it has one): rows [0, hist) from its state, then its B*x rows. blockIdx.y is
// the segment. Runs after conv_out and before conv_state, so it reads the state before the state moves.
extern "C" __global__ void conv_window(const float* bcx, int width, int taps, const u64* segs) {
  PDL_ENTRY();
  const u64* s = segs + 4 * (u64)blockIdx.y;
  float* win = (float*)s[1];
  if (win == 0) return;
  const float* st = (const float*)s[0];
  u64 first = s[2];
  u64 rows = s[3];
  u64 hist = (u64)(taps - 1);
  u64 n = (hist + rows) * (u64)width;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    u64 wr = i / (u64)width;
    int c = (int)(i % (u64)width);
    win[i] = wr < hist ? st[i] : bx_at(bcx, first + wr - hist, width, c);
  }
}

// Advances each segment's state to its last hist rows of B*x: window rows [rows, rows + hist) when it has a window,
// else (rows >= hist, checked on the host) straight from the call's last hist rows.
extern "C" __global__ void conv_state(const float* bcx, int width, int taps, const u64* segs) {
  PDL_ENTRY();
  const u64* s = segs + 4 * (u64)blockIdx.y;
  float* st = (float*)s[0];
  const float* win = (const float*)s[1];
  u64 first = s[2];
  u64 rows = s[3];
  u64 hist = (u64)(taps - 1);
  u64 n = hist * (u64)width;
  bool advance = true;
#ifdef FAULT_CONV_NO_ADVANCE
  advance = false;
#endif
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; advance && i < n; i += (u64)gridDim.x * blockDim.x) {
    u64 j = i / (u64)width;
    int c = (int)(i % (u64)width);
    st[i] = win ? win[(rows + j) * (u64)width + c] : bx_at(bcx, first + rows - hist + j, width, c);
  }
}

// The three kernels above in one launch, for calls whose segments are short (decode and verify rounds; the host
// picks it): one thread a (segment, channel) computes that channel's outputs in row order with conv_out's exact
// arithmetic, fills its window column, then advances its state column, which no other thread touches (the same bits
// as the three launches). blockIdx.y is the segment.
extern "C" __global__ void conv_fused(const float* bcx, int width, int taps, const float* w, const float* bias,
                                      const u64* segs, float* out) {
  PDL_ENTRY();
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  const u64* s = segs + 4 * (u64)blockIdx.y;
  float* st = (float*)s[0];
  float* win = (float*)s[1];
  u64 first = s[2];
  u64 rows = s[3];
  int hist = taps - 1;
#ifdef FAULT_CONV_FIRST_STREAM
  // The planted fault races with the first stream's own advance: old or new rows, wrong either way.
  const float* rd = (const float*)segs[0];
#else
  const float* rd = st;
#endif
  for (u64 t = 0; t < rows; t++) {
    float acc = 0.0f;
    for (int k = 0; k < taps; k++) {
      int wi = (int)t + k;
      float b = wi < hist ? rd[(u64)wi * (u64)width + c] : bx_at(bcx, first + (u64)(wi - hist), width, c);
      acc = acc + w[(u64)c * (u64)taps + k] * b;
    }
    if (bias) acc = acc + bias[c];
    u64 r = first + t;
    out[r * (u64)width + c] = bcx[r * 3 * (u64)width + width + c] * acc;
  }
  // Row i of the sequence (state rows, then the segment's B*x rows).
  auto seq = [&](u64 i) { return i < (u64)hist ? st[i * (u64)width + c] : bx_at(bcx, first + i - hist, width, c); };
  if (win)
    for (u64 i = 0; i < (u64)hist + rows; i++) win[i * (u64)width + c] = seq(i);
#ifndef FAULT_CONV_NO_ADVANCE
  // In increasing j: row rows + j of the sequence is never a state row already overwritten (rows >= 1).
  for (int j = 0; j < hist; j++) st[(u64)j * (u64)width + c] = seq(rows + (u64)j);
#endif
}
