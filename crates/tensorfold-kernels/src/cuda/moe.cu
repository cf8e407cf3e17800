//! MoE routing on the device: sigmoid scores, top-k by score + expert_bias, the weights, the expert plan (assignments grouped by expert into tiles of RT slots, or WTM for the wide tiles) and the rank-order combine.

// Rust's f32::total_cmp as an integer key: larger key, larger float (NaN above +inf).
__device__ __forceinline__ int total_key(float v) {
  int b = __float_as_int(v);
  return b ^ (int)(((u32)(b >> 31)) >> 1);
}

__device__ __forceinline__ float sigmoid_f(float l) { return 1.0f / (1.0f + exp_f(-l)); }

// One warp a row, S slots a lane: lane l holds experts l + 32 i, i < S, and route_row picks the smallest S of 1, 2,
// 4, 8 and 32 that holds the layer's experts (at most 1024; the host checks). The loops over slots are unrolled so the scores stay
// in registers, and only the instantiation a layer's expert count picks runs (no instruction-cache cost from the
// others). Each expert's sigmoid score and selection key total_key(score + bias) are computed once, by the lane that
// holds it. Then kk times, the not yet chosen expert with the largest key (ties to the lower id) goes to
// sel[r * kk + rank] (as a float: exact, ids are below 1024): each lane's best by increasing id, then a butterfly
// argmax, which picks the same expert whatever the fold order (keys are exact and ties go to the lower id); its
// score comes from the lane that holds it. Then the weights as transformers' Lfm2MoeSparseMoeBlock: the chosen
// scores, divided by their rank-order sum + 1e-6 when norm, times rsf. The whole warp must call it.
template <int S>
__device__ __forceinline__ void route_slots(const float* logits, int r, int ne, const float* ebias, int kk, int norm,
                                            float rsf, float* sel, float* wts) {
  int lane = threadIdx.x & 31;
  const float* l = logits + (u64)r * (u64)ne;
  float* se = sel + (u64)r * (u64)kk;
  float* we = wts + (u64)r * (u64)kk;
  int slots = (ne + 31) / 32;  // the same for the whole warp
  float sc[S];
  int key[S];
#pragma unroll
  for (int i = 0; i < S; i++) {
    int e = lane + 32 * i;
    sc[i] = 0.0f;
    key[i] = 0;
    if (i < slots && e < ne) {
      float s = sigmoid_f(l[e]);
#ifdef FAULT_MOE_NO_BIAS
      float k = s + 0.0f;
#else
      float k = s + (ebias ? ebias[e] : 0.0f);
#endif
      sc[i] = s;
      key[i] = total_key(k);
    }
  }
  u32 taken = 0;  // bit i: expert lane + 32 i was chosen
  float sum = 0.0f;
  for (int rank = 0; rank < kk; rank++) {
    int best = -1;
    int bk = 0;
#pragma unroll
    for (int i = 0; i < S; i++) {
      int e = lane + 32 * i;
      if (i < slots && e < ne && !(taken & (1u << i)) && (best < 0 || key[i] > bk)) {
        best = e;
        bk = key[i];
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      int ob = __shfl_xor_sync(0xffffffffu, best, o);
      int ok = __shfl_xor_sync(0xffffffffu, bk, o);
      if (ob >= 0 && (best < 0 || ok > bk || (ok == bk && ob < best))) {
        best = ob;
        bk = ok;
      }
    }
    int bi = best >> 5;
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < S; i++) {
      if (i == bi) mine = sc[i];
    }
    float sb = __shfl_sync(0xffffffffu, mine, best & 31);
    if ((best & 31) == lane) taken |= 1u << bi;
    if (lane == 0) {
      se[rank] = (float)best;
      we[rank] = sb;  // the chosen score, until the weights below
    }
    sum = sum + sb;
  }
  if (lane != 0) return;
  for (int rank = 0; rank < kk; rank++) {
    float s = we[rank];
    float w = norm ? s / (sum + 1e-6f) : s;
#ifdef FAULT_MOE_WEIGHT_BIAS
    if (ebias) w = w + ebias[(int)se[rank]];
#endif
    we[rank] = w * rsf;
  }
}

__device__ __forceinline__ void route_row(const float* logits, int r, int ne, const float* ebias, int kk, int norm,
                                          float rsf, float* sel, float* wts) {
  if (ne <= 32) {
    route_slots<1>(logits, r, ne, ebias, kk, norm, rsf, sel, wts);
  } else if (ne <= 64) {
    route_slots<2>(logits, r, ne, ebias, kk, norm, rsf, sel, wts);
  } else if (ne <= 128) {
    route_slots<4>(logits, r, ne, ebias, kk, norm, rsf, sel, wts);
  } else if (ne <= 256) {
    route_slots<8>(logits, r, ne, ebias, kk, norm, rsf, sel, wts);
  } else {
    route_slots<32>(logits, r, ne, ebias, kk, norm, rsf, sel, wts);
  }
}

extern "C" __global__ void moe_route(const float* logits, int rows, int ne, const float* ebias, int kk, int norm,
                                     float rsf, float* sel, float* wts) {
  PDL_ENTRY();
  int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps leave together
  route_row(logits, r, ne, ebias, kk, norm, rsf, sel, wts);
}

// Experts the plan's shared tables hold (the host checks; routing takes at most 1024 too).
#define PLAN_MAX 1024

// One block, over the owned experts first .. first + ne (local id e = sel - first; other assignments are skipped):
// counts assignments per expert, lays the experts' slots out in expert order, cuts each expert's slots into tiles
// of at most rt (tiles[3t..3t+3) = local expert, first slot, slots; *ntiles of them, at most `bound`; rt is RT for
// the warp kernels, WTM for the wide tiles), then fills
// list[slot] = assignment (row * kk + rank). Counts and offsets live in shared memory; only the running sums are
// serial. The order of slots inside an expert may vary from run to run (atomics), but no value depends on it:
// each slot's row is computed alone.
__device__ __forceinline__ void plan_block(const float* sel, int nassign, int first, int ne, int* list, int* tiles,
                                           int* ntiles, int bound, int rt) {
  __shared__ int cnt[PLAN_MAX];
  __shared__ int off[PLAN_MAX];
  __shared__ int tile0[PLAN_MAX];
  __shared__ int fill[PLAN_MAX];
  int t = threadIdx.x;
  int bs = blockDim.x;
  for (int e = t; e < ne; e += bs) {
    cnt[e] = 0;
    fill[e] = 0;
  }
  __syncthreads();
  for (int a = t; a < nassign; a += bs) {
    int e = (int)sel[a] - first;
#ifdef FAULT_MOE_PLAN_ALL
    e = e < 0 ? 0 : (e >= ne ? ne - 1 : e);
#endif
    if (e >= 0 && e < ne) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (t < 32) {
    // Exclusive prefix sums of the counts and of the tiles, 32 experts at a time by warp scans (exact integers).
    int o = 0;
    int n = 0;
    for (int e0 = 0; e0 < ne; e0 += 32) {
      int e = e0 + t;
      int c = e < ne ? cnt[e] : 0;
      int tl = (c + rt - 1) / rt;
      int ic = c;
      int it = tl;
      for (int d = 1; d < 32; d <<= 1) {
        int a = __shfl_up_sync(0xffffffffu, ic, d);
        int b = __shfl_up_sync(0xffffffffu, it, d);
        if (t >= d) {
          ic += a;
          it += b;
        }
      }
      if (e < ne) {
        off[e] = o + ic - c;
        tile0[e] = n + it - tl;
      }
      o += __shfl_sync(0xffffffffu, ic, 31);
      n += __shfl_sync(0xffffffffu, it, 31);
    }
    if (t == 0) *ntiles = n < bound ? n : bound;
  }
  __syncthreads();
  for (int e = t; e < ne; e += bs) {
    for (int s = 0; s < cnt[e]; s += rt) {
      int i = tile0[e] + s / rt;
      if (i < bound) {
        tiles[3 * i] = e;
        tiles[3 * i + 1] = off[e] + s;
        tiles[3 * i + 2] = cnt[e] - s < rt ? cnt[e] - s : rt;
      }
    }
  }
  for (int a = t; a < nassign; a += bs) {
    int e = (int)sel[a] - first;
#ifdef FAULT_MOE_PLAN_ALL
    e = e < 0 ? 0 : (e >= ne ? ne - 1 : e);
#endif
    if (e < 0 || e >= ne) continue;
    int p = atomicAdd(&fill[e], 1);
    list[off[e] + p] = a;
  }
}

extern "C" __global__ void moe_plan(const float* sel, int nassign, int first, int ne, int* list, int* tiles,
                                    int* ntiles, int bound, int rt) {
  PDL_ENTRY();
  plan_block(sel, nassign, first, ne, list, tiles, ntiles, bound, rt);
}

// Routing and the plan of every expert (first 0) in one launch, for calls of few rows (the host's ROUTE_PLAN_ROWS):
// one block, warp w routing rows w, w + warps, ... as moe_route, then, after a barrier that makes the block's writes
// of sel visible to all its threads, plan_block as moe_plan. The same arithmetic, so the same sel, wts and tiles.
extern "C" __global__ void moe_route_plan(const float* logits, int rows, int ne, const float* ebias, int kk, int norm,
                                          float rsf, float* sel, float* wts, int* list, int* tiles, int* ntiles,
                                          int bound) {
  PDL_ENTRY();
  for (int r = threadIdx.x >> 5; r < rows; r += blockDim.x >> 5) {
    route_row(logits, r, ne, ebias, kk, norm, rsf, sel, wts);
    __syncwarp();  // lane 0 finishes the row's weights before the warp's next row
  }
  __syncthreads();
  plan_block(sel, rows * kk, 0, ne, list, tiles, ntiles, bound, RT);
}

// out[r, c] = sum over rank, in rank order from 0, of wts[r, rank] * y[r * kk + rank, c] (the CPU's combine).
extern "C" __global__ void moe_combine(const float* y, const float* wts, int rows, int kk, int h, float* out) {
  PDL_ENTRY();
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * (u64)h) return;
  out[i] = moe_sum(y, wts, i / (u64)h, kk, (u64)h, i % (u64)h);
}
