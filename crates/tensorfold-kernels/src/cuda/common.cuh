//! Shared CUDA helpers of every TensorFold kernel module: integer types, launch constants, bf16 widening, finite tests, the warp butterfly sum, the tensor-core primitives.
// This text is prepended to each module before NVRTC compiles it (cuda/device.rs), so every module sees the same
// definitions. Modules are compiled with --fmad=false: every multiply and add is rounded exactly as written, and a
// fused multiply-add happens only where the source says fmaf. The launch constants below are mirrored by the host
// launchers; change both together.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Warps per block of the warp-per-item kernels (linear, q/k norm, MoE routing) and of rmsnorm's block: 8 warps, 256
// threads.
#define WPB 8
// Rows a linear tile shares its weight loads over (a MoE expert tile holds at most RT rows too).
#define RT 8
// Output columns a warp of a tile kernel computes, sharing each input load over them (the one-row kernels take 1).
#define CT 4
// Keys one attention block covers: a FIXED chunk, so a row's chunks depend only on its own key count.
#define KEY_CHUNK 256

// Programmatic dependent launch (sm_90 on; the host launches with it unless TENSORFOLD_CUDA_PDL=0): every kernel's
// first statement. A block may be scheduled before the kernel ahead of it on the stream has finished; it waits here
// until that kernel has completed and its writes are visible, so nothing is read or written early and the bits are
// the same as a plain launch. Then it lets the next kernel be scheduled. Without the launch attribute both are
// no-ops. Every kernel must wait (a test checks each entry): a kernel that finished without waiting would let the
// next one run before the one before it had finished.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTRY()                                   \
  do {                                                \
    asm volatile("griddepcontrol.wait;" ::: "memory"); \
    asm volatile("griddepcontrol.launch_dependents;"); \
  } while (0)
#else
#define PDL_ENTRY() \
  do {              \
  } while (0)
#endif

#define DT_F32 0
#define DT_BF16 1
#define DT_Q8 2
#define DT_Q4 3  // MLX 4-bit affine: two codes a byte, element 2i in the low nibble of byte i

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ bool finite_f(float v) { return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u; }

__device__ __forceinline__ bool nan_f(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }

__device__ __forceinline__ float inf_f() { return __uint_as_float(0x7f800000u); }

__device__ __forceinline__ u64 min_u64(u64 a, u64 b) { return a < b ? a : b; }

// Sum over the 32 lanes by a butterfly (offsets 16, 8, 4, 2, 1). Lanes l and l^o add the same two values, and
// f32 addition is commutative, so every lane ends with the same bits: a fixed tree whatever the launch.
// Every lane of the warp must call it.
__device__ __forceinline__ float warp_sum(float v) {
  v = v + __shfl_xor_sync(0xffffffffu, v, 16);
  v = v + __shfl_xor_sync(0xffffffffu, v, 8);
  v = v + __shfl_xor_sync(0xffffffffu, v, 4);
  v = v + __shfl_xor_sync(0xffffffffu, v, 2);
  v = v + __shfl_xor_sync(0xffffffffu, v, 1);
  return v;
}

// Sum of squares of n values in the order of a 256-thread block: virtual thread t = 32 w + l accumulates with fmaf
// the squares of elements t, t+256, ... in increasing order; group w folds its 32 by warp_sum; the 8 group sums add
// in group order from 0. One warp computes it here (8 accumulators a lane, for the q/k head norm); rmsnorm spreads
// the same order over a block, so a head of q and a row of the same values give the same bits.
__device__ __forceinline__ float row_sumsq(const float* x, int n, int lane) {
  float total = 0.0f;
  for (int w = 0; w < WPB; w++) {
    float s = 0.0f;
    for (int i = 32 * w + lane; i < n; i += 32 * WPB) s = fmaf(x[i], x[i], s);
    total = total + warp_sum(s);
  }
  return total;
}

// The MoE combine of row r at column c: the sum over rank, in rank order from +0, of wts[r, rank] * y[r * kk + rank,
// c] (the CPU's combine). moe_combine and the fused moe_combine_add_rmsnorm share it, so their bits agree.
__device__ __forceinline__ float moe_sum(const float* y, const float* wts, u64 r, int kk, u64 h, u64 c) {
  float acc = 0.0f;
  for (int rank = 0; rank < kk; rank++) {
    u64 a = r * (u64)kk + (u64)rank;
    acc = acc + wts[a] * y[a * h + c];
  }
  return acc;
}

// exp through double, rounded once to f32: the correctly rounded value for nearly every input, as the CPU's
// libm expf gives, so the device's sigmoid, silu and softmax weights track the CPU's closely.
__device__ __forceinline__ float exp_f(float x) { return (float)exp((double)x); }

// Tensor-core primitives shared by the tensor-core linears (dense_tc.cu) and attention (attention_mma.cu).

// The round-to-nearest-even bf16 bits of (lo, hi) packed in one word, lo in the low half: one cvt.rn.bf16x2.f32
// on the device (sm_80 and later; a NaN becomes the canonical 0x7fff, as below), its definition on the CPU.
__device__ __forceinline__ u32 tc_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#elif defined(__CUDA_ARCH__)
  __trap();  // before sm_80 the host never runs the tensor-core forms (the mode is refused); the module still builds
  return 0u;
#else
  auto one = [](float v) -> u32 {
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  };
  return one(lo) | (one(hi) << 16);
#endif
}

// The f32 values of a packed bf16 pair: its low half and its high half.
__device__ __forceinline__ float tc_lo(u32 p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float tc_hi(u32 p) { return __uint_as_float(p & 0xffff0000u); }

// 16 bytes from global `src` to shared `dst` in flight (cp.async.cg, sm_80 and later), zeros when !ok (src is not
// read); visible to this thread after tc_async_wait, to the block after a barrier past that. CPU: a plain copy.
__device__ __forceinline__ void tc_async16(void* dst, const void* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();  // sm_80 and later only, as tc_bf16x2
#else
  *reinterpret_cast<uint4*>(dst) = ok ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

// B (4 or 8) bytes from global `src` to shared `dst` in flight (cp.async.ca), zeros when !ok; as tc_async16.
template <int B>
__device__ __forceinline__ void tc_async_small(void* dst, const void* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(B), "r"(ok ? B : 0) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();  // sm_80 and later only, as tc_bf16x2
#else
  for (int i = 0; i < B; i++) static_cast<u8*>(dst)[i] = ok ? static_cast<const u8*>(src)[i] : (u8)0;
#endif
}

// Waits for every tc_async16 and tc_async_small this thread issued.
__device__ __forceinline__ void tc_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
#endif
}

// d += A B on the tensor cores for one m16n8k16 tile (a: this lane's A fragment, b0 b1: its B fragment).
__device__ __forceinline__ void tc_mma(float d[4], const u32 a[4], u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
  __trap();  // sm_80 and later only, as tc_bf16x2
#else
  tfemu_mma_16816(d, a, b0, b1);  // the CPU emulation's definition of the instruction (tools/cuda/emu/emu.h)
#endif
}

// The three pieces of the pair (v0, v1) as packed words (v0 in the low half): p[0] hi, p[1] lo, p[2] lo2, each the
// round-to-nearest-even bf16 of the residual before it (the residuals are exact in f32), so hi + lo + lo2 carries v
// to about 2^-24 of itself. Three conversions and four subtractions a pair.
__device__ __forceinline__ void tc_pieces3(float v0, float v1, u32 p[3]) {
  p[0] = tc_bf16x2(v0, v1);
  float r0 = v0 - tc_lo(p[0]), r1 = v1 - tc_hi(p[0]);
  p[1] = tc_bf16x2(r0, r1);
  p[2] = tc_bf16x2(r0 - tc_lo(p[1]), r1 - tc_hi(p[1]));
}
