//! Per-head RMSNorm then rotary embedding of q and/or k rows (both in one launch), one warp a (row, head), at each row's position.

// x: [rows, heads * hd], in place; x2 (heads2 > 0): a second tensor [rows, heads2 * hd] with its own weight norm2,
// in the same launch (q and k of one attention layer): warp items past rows * heads are x2's heads. pos[r]: row r's
// absolute position (from the segment table, on the host). inv_freq[i]: pair i's inverse frequency as the CPU
// computes it in f32. Dynamic shared memory: WPB * hd floats. The head's norm uses row_sumsq's fixed order; the
// angle is the f32 product inv_freq * pos, and cos/sin are taken in double and rounded once, as the CPU does. A
// head's bits do not depend on which tensor or launch it is in.
extern "C" __global__ void __launch_bounds__(256) qk_norm_rope(float* x, int rows, int heads, int hd, const float* norm,
                                                               float eps, const u32* pos, const float* inv_freq,
                                                               int interleaved, float* x2, int heads2,
                                                               const float* norm2) {
  PDL_ENTRY();
  extern __shared__ float sh[];
  int warp = threadIdx.x >> 5;
  int lane = threadIdx.x & 31;
  u64 item = (u64)blockIdx.x * WPB + warp;
  u64 first = (u64)rows * (u64)heads;
  if (item >= first + (u64)rows * (u64)heads2) return;  // whole warps leave together
  u64 row = item < first ? item / (u64)heads : (item - first) / (u64)heads2;
  float* h = item < first ? x + item * (u64)hd : x2 + (item - first) * (u64)hd;
  bool second = item >= first;
#ifdef FAULT_ROPE_PAIR_NORM
  second = false;  // planted: x2's heads keep the first tensor's weight
#endif
  if (second) norm = norm2;
  float* nv = sh + warp * hd;
  float ss = row_sumsq(h, hd, lane);
  float scale = 1.0f / sqrtf(ss / (float)hd + eps);
  for (int d = lane; d < hd; d += 32) nv[d] = h[d] * scale * norm[d];
  __syncwarp();
  u32 p = pos[row];
#ifdef FAULT_ROPE_POS
  p = p + 1;
#endif
#ifdef FAULT_ROPE_PAIRS
  interleaved = !interleaved;
#endif
  int half = hd / 2;
  for (int i = lane; i < half; i += 32) {
    float ang = inv_freq[i] * (float)p;
    float c = (float)cos((double)ang);
    float s = (float)sin((double)ang);
    int ia = interleaved ? 2 * i : i;
    int ib = interleaved ? 2 * i + 1 : i + half;
    float a = nv[ia];
    float b = nv[ib];
    h[ia] = a * c - b * s;
    h[ib] = b * c + a * s;
  }
}
