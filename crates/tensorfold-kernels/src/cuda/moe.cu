//! MoE routing on the device: sigmoid scores, top-k by score + expert_bias, the weights, the expert plan (assignments grouped by expert into RT-slot tiles) and the rank-order combine.

// Rust's f32::total_cmp as an integer key: larger key, larger float (NaN above +inf).
__device__ __forceinline__ int total_key(float v) {
  int b = __float_as_int(v);
  return b ^ (int)(((u32)(b >> 31)) >> 1);
}

__device__ __forceinline__ float sigmoid_f(float l) { return 1.0f / (1.0f + exp_f(-l)); }

// One warp a row: kk times, the not yet chosen expert with the largest total_key(score + bias) (ties to the lower
// id) goes to sel[r * kk + rank] (as a float: exact, ids are below 1024) (lane l scans experts l, l+32, ...; a butterfly argmax picks the winner, which is
// the same expert whatever the fold order: keys are exact and ties go to the lower id); then weights as
// transformers' Lfm2MoeSparseMoeBlock: the chosen scores, divided by their rank-order sum + 1e-6 when norm, times
// rsf. At most 1024 experts (a lane's taken mask has 32 bits; the host checks).
__device__ __forceinline__ void route_row(const float* logits, int r, int ne, const float* ebias, int kk, int norm,
                                          float rsf, float* sel, float* wts) {
  int lane = threadIdx.x & 31;
  const float* l = logits + (u64)r * (u64)ne;
  float* se = sel + (u64)r * (u64)kk;
  float* we = wts + (u64)r * (u64)kk;
  u32 taken = 0;  // bit i: expert lane + 32 i was chosen
  float sum = 0.0f;
  for (int rank = 0; rank < kk; rank++) {
    int best = -1;
    int bk = 0;
    for (int e = lane, i = 0; e < ne; e += 32, i++) {
      if (taken & (1u << i)) continue;
      float s = sigmoid_f(l[e]);
#ifdef FAULT_MOE_NO_BIAS
      float key = s + 0.0f;
#else
      float key = s + (ebias ? ebias[e] : 0.0f);
#endif
      int tk = total_key(key);
      if (best < 0 || tk > bk) {
        best = e;
        bk = tk;
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
    if ((best & 31) == lane) taken |= 1u << (best >> 5);
    if (lane == 0) se[rank] = (float)best;
    sum = sum + sigmoid_f(l[best]);
  }
  if (lane != 0) return;
  for (int rank = 0; rank < kk; rank++) {
    int e = (int)se[rank];
    float s = sigmoid_f(l[e]);
    float w = norm ? s / (sum + 1e-6f) : s;
#ifdef FAULT_MOE_WEIGHT_BIAS
    if (ebias) w = w + ebias[e];
#endif
    we[rank] = w * rsf;
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
// of at most RT (tiles[3t..3t+3) = local expert, first slot, slots; *ntiles of them, at most `bound`), then fills
// list[slot] = assignment (row * kk + rank). Counts and offsets live in shared memory; only the running sums are
// serial. The order of slots inside an expert may vary from run to run (atomics), but no value depends on it:
// each slot's row is computed alone.
__device__ __forceinline__ void plan_block(const float* sel, int nassign, int first, int ne, int* list, int* tiles,
                                           int* ntiles, int bound) {
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
  if (t == 0) {
    int o = 0;
    int n = 0;
    for (int e = 0; e < ne; e++) {
      off[e] = o;
      tile0[e] = n;
      o += cnt[e];
      n += (cnt[e] + RT - 1) / RT;
    }
    *ntiles = n < bound ? n : bound;
  }
  __syncthreads();
  for (int e = t; e < ne; e += bs) {
    for (int s = 0; s < cnt[e]; s += RT) {
      int i = tile0[e] + s / RT;
      if (i < bound) {
        tiles[3 * i] = e;
        tiles[3 * i + 1] = off[e] + s;
        tiles[3 * i + 2] = cnt[e] - s < RT ? cnt[e] - s : RT;
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
                                    int* ntiles, int bound) {
  PDL_ENTRY();
  plan_block(sel, nassign, first, ne, list, tiles, ntiles, bound);
}

// Routing and the plan of every expert (first 0) in one launch, for calls of few rows (the host's ROUTE_PLAN_ROWS):
// one block, warp w routing rows w, w + 32, ... as moe_route, then, after a barrier that makes the block's writes
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
  plan_block(sel, rows * kk, 0, ne, list, tiles, ntiles, bound);
}

// out[r, c] = sum over rank, in rank order from 0, of wts[r, rank] * y[r * kk + rank, c] (the CPU's combine).
extern "C" __global__ void moe_combine(const float* y, const float* wts, int rows, int kk, int h, float* out) {
  PDL_ENTRY();
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * (u64)h) return;
  out[i] = moe_sum(y, wts, i / (u64)h, kk, (u64)h, i % (u64)h);
}
