//! The keyed draw of logits rows on the device (host reference: sample.rs `draw`): greedy, or temperature, top-k, top-p, min-p, then Gumbel-max.
// One block of DRAW_THREADS threads a row; rows never meet, so a row's draw does not depend on the batch. Every
// f64 operation is the host reference's, in its order: the scaled logit (double)l * (1.0 / T), the weights
// exp(s - s_max), Z summed in the lane order of sample.rs `lane_sum`, the nucleus's running sum in key order, and
// the keyed Gumbel noise -log(-log(u)). Only exp and log come from CUDA's libdevice rather than the host's libm.

#define DRAW_THREADS 1024
// Top-p's candidates held sorted in shared memory; a nucleus longer than this is handed back to the host.
#define DRAW_WINDOW 2048
#define DRAW_OK 0u
#define DRAW_NONFINITE 1u
#define DRAW_HOST 2u
#define GAMMA 0x9e3779b97f4a7c15ull

// splitmix64's finaliser (sample.rs `mix64`).
__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Gumbel noise of `tok` under the position's key (sample.rs `gumbel`).
__device__ __forceinline__ double gumbel(u64 key, u32 tok) {
  u64 c = mix64(key ^ ((u64)tok + GAMMA * 3ull));
  double u = ((double)(c >> 12) + 0.5) * (1.0 / 4503599627370496.0);
#ifdef FAULT_DRAW_NOISE_ONE_LOG
  return -log(u);
#else
  return -log(-log(u));
#endif
}

// Ascending key = logit descending, then id ascending; -0.0 folds into +0.0 (sample.rs `order_key`).
__device__ __forceinline__ u64 order_key(float v, u32 id) {
  u32 b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0u;
  u32 asc = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((u64)(~asc) << 32) | (u64)id;
}

// Is (v, i) a better greedy candidate than (bv, bi)? Larger wins, equal values go to the lower id.
__device__ __forceinline__ bool better_f(float v, int i, float bv, int bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

// Is score s of id i better than (bs, bi)? Larger wins, equal scores go to the lower id.
__device__ __forceinline__ bool better_d(double s, int i, double bs, int bi) {
  return bi < 0 || s > bs || (s == bs && i < bi);
}

struct DrawShared {
  u64 keys[DRAW_WINDOW];
  double w[DRAW_WINDOW];
  double red[DRAW_THREADS];
  int redi[DRAW_THREADS];
  int hist[256];
  int st[4];
};

// The block's best (score, id) by a tree; exact comparisons, so the winner does not depend on the order.
__device__ int block_argmax(DrawShared& sh, double s, int i) {
  int t = threadIdx.x;
  sh.red[t] = s;
  sh.redi[t] = i;
  __syncthreads();
  for (int k = DRAW_THREADS / 2; k > 0; k >>= 1) {
    if (t < k && sh.redi[t + k] >= 0 && better_d(sh.red[t + k], sh.redi[t + k], sh.red[t], sh.redi[t])) {
      sh.red[t] = sh.red[t + k];
      sh.redi[t] = sh.redi[t + k];
    }
    __syncthreads();
  }
  int best = sh.redi[0];
  __syncthreads();
  return best;
}

// Z: lane t adds its ids t, t + L, ... in turn, then lanes fold pairwise (sample.rs `lane_sum`).
__device__ double block_lane_sum(DrawShared& sh, double acc) {
  int t = threadIdx.x;
  sh.red[t] = acc;
  __syncthreads();
  for (int k = DRAW_THREADS / 2; k > 0; k >>= 1) {
    if (t < k) sh.red[t] = sh.red[t] + sh.red[t + k];
    __syncthreads();
  }
  double z = sh.red[0];
  __syncthreads();
  return z;
}

// The need-th smallest order key of the row (1-based), by radix select on 8-bit digits from the top. Counts are
// integers, so the shared histogram's atomics give the same counts in any order. Stops once a digit's bin holds
// exactly the keys still needed: the threshold is then that bin's largest possible key.
__device__ u64 select_key(DrawShared& sh, const float* l, int n, int need) {
  int t = threadIdx.x, lane = t & 31;
  u64 prefix = 0, mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    if (t < 256) sh.hist[t] = 0;
    __syncthreads();
    for (int i = t; i < n; i += DRAW_THREADS) {
      u64 k = order_key(l[i], (u32)i);
      if ((k & mask) == prefix) atomicAdd(&sh.hist[(int)((k >> shift) & 255ull)], 1);
    }
    __syncthreads();
    if (t < 32) {
      int c[8], s = 0;
      for (int j = 0; j < 8; j++) s += (c[j] = sh.hist[lane * 8 + j]);
      int inc = s;
      for (int off = 1; off < 32; off <<= 1) {
        int v = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off) inc += v;
      }
      int cum = inc - s;
      if (cum < need && need <= inc) {
        for (int j = 0; j < 8; j++) {
          if (cum + c[j] >= need) {
            sh.st[0] = lane * 8 + j;
            sh.st[1] = need - cum;
            sh.st[2] = c[j];
            break;
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    int bin = sh.st[0], cnt = sh.st[2];
    need = sh.st[1];
    prefix |= (u64)bin << shift;
    mask |= 255ull << shift;
    if (cnt == need) return prefix | ~mask;
  }
  return prefix;
}

// Sorts sh.keys[0..m) ascending (bitonic over the next power of two, padded with the largest key).
__device__ void sort_window(DrawShared& sh, int m) {
  int t = threadIdx.x, p = 1;
  while (p < m) p <<= 1;
  for (int i = m + t; i < p; i += DRAW_THREADS) sh.keys[i] = ~0ull;
  __syncthreads();
  for (int k = 2; k <= p; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = t; i < p; i += DRAW_THREADS) {
        int o = i ^ j;
        if (o > i) {
          u64 a = sh.keys[i], b = sh.keys[o];
          bool up = (i & k) == 0;
          if ((a > b) == up) {
            sh.keys[i] = b;
            sh.keys[o] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The nucleus: the smallest prefix of the key order whose running weight reaches top_p * Z. Returns its length,
// or -1 when it does not end inside the window of the m best keys (of `survivors`); sh.keys then holds them sorted.
__device__ int nucleus(DrawShared& sh, const float* l, int n, u64 kmax, int survivors, double inv_t, double s_max,
                       float top_p) {
  int t = threadIdx.x;
  double acc = 0.0;
  for (int i = t; i < n; i += DRAW_THREADS)
    if (order_key(l[i], (u32)i) <= kmax) acc = acc + exp((double)l[i] * inv_t - s_max);
  double z = block_lane_sum(sh, acc);
  int m = survivors < DRAW_WINDOW ? survivors : DRAW_WINDOW;
  u64 kwin = m == survivors ? kmax : select_key(sh, l, n, m);
  if (t == 0) sh.st[3] = 0;
  __syncthreads();
  for (int i = t; i < n; i += DRAW_THREADS) {
    u64 k = order_key(l[i], (u32)i);
    if (k <= kwin) sh.keys[atomicAdd(&sh.st[3], 1)] = k;
  }
  __syncthreads();
  sort_window(sh, m);
  for (int j = t; j < m; j += DRAW_THREADS) sh.w[j] = exp((double)l[(u32)sh.keys[j]] * inv_t - s_max);
  __syncthreads();
  if (t == 0) {
    double bound = (double)top_p * z, mass = 0.0;
    int keep = m == survivors ? m : -1;
    for (int j = 0; j < m; j++) {
      mass = mass + sh.w[j];
      if (mass >= bound) {
        keep = j + 1;
        break;
      }
    }
#ifdef FAULT_DRAW_NUCLEUS_SHORT
    if (keep > 1) keep -= 1;
#endif
#ifdef FAULT_DRAW_ALL_HOST
    keep = -1;
#endif
    sh.st[0] = keep;
  }
  __syncthreads();
  int keep = sh.st[0];
  __syncthreads();
  return keep;
}

// One row's draw. spec[4r..4r+4) = seed, position, temperature bits | top_k << 32, top_p bits | min_p bits << 32
// (top_k 0 = off; the host validated every parameter). out[3r..3r+3) = token, status (DRAW_OK, DRAW_NONFINITE,
// DRAW_HOST: the nucleus is longer than DRAW_WINDOW; the host draws the row, or a caller that keeps the words on
// the device takes the token, the greedy pick), first non-finite index.
extern "C" __global__ void __launch_bounds__(DRAW_THREADS) draw_rows(const float* logits, int vocab, const u64* spec,
                                                                      u32* out) {
  PDL_ENTRY();
  __shared__ DrawShared sh;
  int t = threadIdx.x, row = blockIdx.x;
  const float* l = logits + (u64)row * (u64)vocab;
  const u64* sp = spec + 4 * row;
  float temp = __uint_as_float((u32)sp[2]), top_p = __uint_as_float((u32)sp[3]);
  float min_p = __uint_as_float((u32)(sp[3] >> 32));
  int top_k = (int)(u32)(sp[2] >> 32);
  // The first non-finite index and the greedy pick, in one pass.
  int bad = vocab, bi = -1;
  float bv = 0.0f;
  for (int i = t; i < vocab; i += DRAW_THREADS) {
    float v = l[i];
    if (!finite_f(v)) bad = i < bad ? i : bad;
    else if (better_f(v, i, bv, bi)) bv = v, bi = i;
  }
  sh.redi[t] = bad;
  __syncthreads();
  for (int k = DRAW_THREADS / 2; k > 0; k >>= 1) {
    if (t < k && sh.redi[t + k] < sh.redi[t]) sh.redi[t] = sh.redi[t + k];
    __syncthreads();
  }
  bad = sh.redi[0];
  __syncthreads();
  int top = block_argmax(sh, bi < 0 ? 0.0 : (double)bv, bi);
  if (bad < vocab || temp == 0.0f) {
    if (t == 0) out[3 * row] = bad < vocab ? 0u : (u32)top, out[3 * row + 1] = bad < vocab ? DRAW_NONFINITE : DRAW_OK,
                out[3 * row + 2] = bad < vocab ? (u32)bad : 0u;
    return;
  }
  double inv_t = 1.0 / (double)temp, s_max = (double)l[top] * inv_t;
  bool k_on = top_k > 0 && top_k < vocab;
  u64 kmax = k_on ? select_key(sh, l, vocab, top_k) : ~0ull;
  int keep = 0;
  if (top_p < 1.0f) {
    keep = nucleus(sh, l, vocab, kmax, k_on ? top_k : vocab, inv_t, s_max, top_p);
    if (keep < 0) {
      if (t == 0) out[3 * row] = (u32)top, out[3 * row + 1] = DRAW_HOST, out[3 * row + 2] = 0u;
      return;
    }
  }
  u64 key = mix64(mix64(sp[0] + GAMMA) ^ (sp[1] + GAMMA * 2ull));
#ifdef FAULT_DRAW_WRONG_POSITION
  key = mix64(mix64(sp[0] + GAMMA) ^ (sp[1] + 1ull + GAMMA * 2ull));
#endif
  // Gumbel-max over the survivors: the nucleus's keys, or every id inside the top-k bound; min-p drops the rest.
  double bs = 0.0;
  int bid = -1;
  int count = top_p < 1.0f ? keep : vocab;
  for (int j = t; j < count; j += DRAW_THREADS) {
    u32 id = top_p < 1.0f ? (u32)sh.keys[j] : (u32)j;
    float v = l[id];
    bool in_k = order_key(v, id) <= kmax;
#ifdef FAULT_DRAW_TOPK_OFF
    in_k = true;
#endif
    if (top_p >= 1.0f && !in_k) continue;
    double s = (double)v * inv_t;
    if (min_p > 0.0f && exp(s - s_max) < (double)min_p) continue;
    double score = s + gumbel(key, id);
    if (better_d(score, (int)id, bs, bid)) bs = score, bid = (int)id;
  }
  int pick = block_argmax(sh, bs, bid);
  if (t == 0) out[3 * row] = (u32)pick, out[3 * row + 1] = DRAW_OK, out[3 * row + 2] = 0u;
}
