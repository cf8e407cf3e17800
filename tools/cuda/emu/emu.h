// CPU emulation of the CUDA device-code subset the TensorFold kernels use (tools/cuda/emu/run.sh): one block at a
// time, its threads as fibers scheduled in lockstep passes (each warp sync or block barrier is a yield).
#include <ucontext.h>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <functional>
#include <utility>

struct dim3_ { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };

namespace emu {
struct Fiber { ucontext_t ctx; dim3_ tid; bool done; unsigned phase; char* stack; };
inline dim3_ g_block, g_bdim, g_gdim;
inline Fiber* g_cur;
inline ucontext_t g_sched;
inline std::vector<Fiber> g_fibers;
inline std::vector<unsigned char> g_dyn;
inline int bar_count, bar_gen, bar_or, bar_result, live;
inline bool release_pending;
inline float wslots[32][2][32];
inline std::function<void()> g_fn;
constexpr size_t STACK = 256 * 1024;

inline void yield() { swapcontext(&g_cur->ctx, &g_sched); }
inline int sync_or(int p) {
  int gen = bar_gen;
  bar_or |= p;
  if (++bar_count == live) { bar_count = 0; bar_result = bar_or; bar_or = 0; release_pending = true; }
  do { yield(); } while (bar_gen == gen);
  return bar_result;
}
inline unsigned lin() { return g_cur->tid.x + g_bdim.x * (g_cur->tid.y + g_bdim.y * g_cur->tid.z); }
inline float shfl_xor(float v, int off) {
  unsigned l = lin(), w = l / 32, lane = l % 32, ph = g_cur->phase++ & 1;
  wslots[w][ph][lane] = v;
  yield();
  return wslots[w][ph][lane ^ (unsigned)off];
}
inline float shfl_from(float v, int src) {
  unsigned l = lin(), w = l / 32, lane = l % 32, ph = g_cur->phase++ & 1;
  wslots[w][ph][lane] = v;
  yield();
  return wslots[w][ph][(unsigned)src & 31u];
}
// mma.sync.m16n8k16.row.col f32.bf16.bf16.f32 by its definition: every lane posts its fragments, then computes its
// four outputs d[i] += sum over the 16 k slots in slot order (exact bf16 products, f32 adds). The device's internal
// order differs; the emulation checks the kernels' logic (which slot holds which element, invariance), not bits.
inline unsigned mslots[32][2][32][6];
inline float mma_half(unsigned v, int k) { unsigned b = (k & 1) ? (v >> 16) : (v & 0xffffu); float f; b <<= 16; memcpy(&f, &b, 4); return f; }
inline void mma_16816(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
  unsigned l = lin(), w = l / 32, lane = l % 32, ph = g_cur->phase++ & 1;
  for (int i = 0; i < 4; i++) mslots[w][ph][lane][i] = a[i];
  mslots[w][ph][lane][4] = b0;
  mslots[w][ph][lane][5] = b1;
  yield();
  unsigned (*s)[6] = mslots[w][ph];
  int g = (int)lane / 4, t = (int)lane % 4;
  for (int i = 0; i < 4; i++) {
    int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float acc = d[i];
    for (int k = 0; k < 16; k++) {
      float av = mma_half(s[4 * (row % 8) + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
      float bv = mma_half(s[4 * col + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)], k);
      float p = av * bv;
      acc = acc + p;
    }
    d[i] = acc;
  }
}
inline void syncwarp() { g_cur->phase++; yield(); }
inline void entry() { g_fn(); g_cur->done = true; live--; if (live > 0 && bar_count == live) { bar_count = 0; bar_result = bar_or; bar_or = 0; release_pending = true; } }

inline void run(dim3_ grid, dim3_ block, unsigned smem, std::function<void()> body) {
  unsigned n = block.x * block.y * block.z;
  g_gdim = grid; g_bdim = block; g_fn = std::move(body);
  g_dyn.assign(smem + 64, 0xAB);
  while (g_fibers.size() < n) { Fiber f{}; f.stack = (char*)malloc(STACK); g_fibers.push_back(f); }
  for (unsigned z = 0; z < grid.z; z++) for (unsigned y = 0; y < grid.y; y++) for (unsigned x = 0; x < grid.x; x++) {
    g_block = {x, y, z};
    live = (int)n; bar_count = 0; bar_or = 0; release_pending = false;
    for (unsigned i = 0; i < n; i++) {
      Fiber& f = g_fibers[i];
      f.tid = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
      f.done = false; f.phase = 0;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack; f.ctx.uc_stack.ss_size = STACK; f.ctx.uc_link = &g_sched;
      makecontext(&f.ctx, (void (*)())entry, 0);
    }
    bool any = true;
    while (any) {
      any = false;
      for (unsigned i = 0; i < n; i++) {
        Fiber& f = g_fibers[i];
        if (f.done) continue;
        g_cur = &f;
        swapcontext(&g_sched, &f.ctx);
        if (!f.done) any = true;
      }
      if (release_pending) { bar_gen++; release_pending = false; }
    }
  }
}
template <class... A, size_t... I>
void call(void (*f)(A...), void** p, std::index_sequence<I...>) { f(*static_cast<A*>(p[I])...); }
template <class... A>
int arity(void (*)(A...)) { return (int)sizeof...(A); }
template <class... A>
void launch(void (*f)(A...), unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, void** p) {
  run({gx, gy, gz}, {bx, by, bz}, smem, [&]() { call(f, p, std::index_sequence_for<A...>{}); });
}
}  // namespace emu

#define threadIdx (emu::g_cur->tid)
#define blockIdx (emu::g_block)
#define blockDim (emu::g_bdim)
#define gridDim (emu::g_gdim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
inline float __shfl_xor_sync(unsigned, float v, int off) { return emu::shfl_xor(v, off); }
// Integers travel as their bits (a conversion to float would round keys above 2^24).
inline int __shfl_xor_sync(unsigned m, int v, int off) {
  float f, g;
  memcpy(&f, &v, 4);
  g = __shfl_xor_sync(m, f, off);
  int r;
  memcpy(&r, &g, 4);
  return r;
}
inline float __shfl_sync(unsigned, float v, int src) { return emu::shfl_from(v, src); }
inline int __shfl_sync(unsigned, int v, int src) {
  float f;
  memcpy(&f, &v, 4);
  f = emu::shfl_from(f, src);
  int r;
  memcpy(&r, &f, 4);
  return r;
}
inline int __shfl_up_sync(unsigned m, int v, unsigned d) {
  unsigned lane = emu::lin() % 32;
  return __shfl_sync(m, v, (int)(lane >= d ? lane - d : lane));
}
inline void __syncthreads() { emu::sync_or(0); }
inline int __syncthreads_or(int p) { return emu::sync_or(p != 0); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::syncwarp(); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline void tfemu_mma_16816(float d[4], const unsigned a[4], unsigned b0, unsigned b1) { emu::mma_16816(d, a, b0, b1); }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
inline int atomicAdd(int* p, int v) { int o = *p; *p = o + v; return o; }
using std::exp; using std::cos; using std::sin;
