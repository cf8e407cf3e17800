// A fake libcuda + libnvrtc for cudarc (tools/cuda/emu/run.sh): host memory as device memory, modules as the emulated
// kernel variants (gen.py), and stream capture recorded into graphs that replay their launches and copies (a copy
// node reads its host bytes when the graph runs, as the driver's does). Everything runs on the calling thread, in
// issue order. With TFEMU_NULL=1 it is a null device instead (host_cost.sh).
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <map>
#include <vector>
#include <cstdint>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
struct Mod { void* h; std::string tag; };
// smem_max: the dynamic shared memory the host opted the kernel in to (cuFuncSetAttribute), 48 KiB without.
struct Fn { void (*launch)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void**); std::string name; int arity; unsigned smem_max = 48 * 1024; };
// A recorded operation: a launch (its 8-byte parameter slots copied) or a copy / memset.
struct Node { int kind; Fn* fn; unsigned g[3], b[3], smem; std::vector<unsigned long long> slots; CUdeviceptr dst; const void* src; size_t n; unsigned char v; };
static std::vector<Node>* g_capture = nullptr;
static void* g_ctx = (void*)0x1234;
static void* g_cur = nullptr;
static int dbg() { static int d = getenv("TFEMU_DEBUG") ? 1 : 0; return d; }
// TFEMU_NULL=1: a null device (host_cost.sh). Addresses without memory; kernels, copies and graph replays counted,
// not run; reads to the host give zeros. What is left is the host's own cost.
static bool null_mode() { static bool n = getenv("TFEMU_NULL") != nullptr; return n; }
static unsigned long long g_launches = 0, g_graphs = 0, g_copies = 0, g_next = 1ull << 40;
__attribute__((destructor)) static void report() {
  if (null_mode()) fprintf(stderr, "tfemu null device: %llu launches, %llu graph launches, %llu copies and memsets\n", g_launches, g_graphs, g_copies);
}
#define API extern "C" __attribute__((visibility("default")))
API CUresult cuInit(unsigned) { return 0; }
API CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
API CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
API CUresult cuDeviceGet(int* d, int o) { if (o != 0) return 101; *d = 0; return 0; }
API CUresult cuDevicePrimaryCtxRetain(void** c, int) { *c = g_ctx; return 0; }
API CUresult cuDevicePrimaryCtxRelease(int) { return 0; }
API CUresult cuDevicePrimaryCtxRelease_v2(int) { return 0; }
API CUresult cuCtxSetCurrent(void* c) { g_cur = c; return 0; }
API CUresult cuCtxGetCurrent(void** c) { *c = g_cur; return 0; }
API CUresult cuCtxSynchronize() { return 0; }
API CUresult cuDeviceGetAttribute(int* v, int a, int) { *v = a == 75 ? 9 : a == 76 ? 0 : a == 115 ? 1 : a == 16 ? 4 : a == 97 ? 232448 : 0; return 0; }
API CUresult cuDeviceGetName(char* s, int len, int) { snprintf(s, len, "TensorFold CPU emulator"); return 0; }
API CUresult cuDeviceTotalMem_v2(size_t* b, int) { *b = 1ull << 34; return 0; }
API CUresult cuMemGetInfo_v2(size_t* f, size_t* t) { *f = 1ull << 33; *t = 1ull << 34; return 0; }  // 8 of 16 GiB free
API CUresult cuStreamCreate(void** s, unsigned) { *s = (void*)0x5678; return 0; }
API CUresult cuStreamDestroy_v2(void*) { return 0; }
API CUresult cuStreamDestroy(void*) { return 0; }
API CUresult cuStreamSynchronize(void*) { return 0; }
API CUresult cuDeviceGetDefaultMemPool(void** p, int) { *p = (void*)0x9abc; return 0; }
API CUresult cuMemPoolSetAttribute(void*, int, void*) { return 0; }
API CUresult cuMemPoolGetAttribute(void*, int, void* v) { *(unsigned long long*)v = 0; return 0; }
API CUresult cuMemHostAlloc(void** p, size_t n, unsigned) { *p = malloc(n); return *p ? 0 : 2; }
API CUresult cuMemFreeHost(void* p) { free(p); return 0; }
static CUresult alloc(CUdeviceptr* p, size_t n) {
  if (null_mode()) { *p = g_next; g_next += (n + 511) / 512 * 512 + 512; return 0; }
  void* m = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m) return 2;
  memset(m, 0xCD, (n + 255) / 256 * 256);  // garbage, as device memory is
  *p = (CUdeviceptr)m;
  return 0;
}
API CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, void*) { return alloc(p, n); }
API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { return alloc(p, n); }
API CUresult cuMemFreeAsync(CUdeviceptr p, void*) { if (!null_mode()) free((void*)p); return 0; }
API CUresult cuMemFree_v2(CUdeviceptr p) { if (!null_mode()) free((void*)p); return 0; }
// A copy or memset: recorded while capturing (true), else the caller runs it (false); on the null device, dropped.
static bool record(Node n) {
  if (null_mode()) { g_copies++; return true; }
  if (!g_capture) return false;
  g_capture->push_back(std::move(n));
  return true;
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void*) { if (!record(Node{1, nullptr, {}, {}, 0, {}, d, s, n, 0})) memcpy((void*)d, s, n); return 0; }
API CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, void*) { if (null_mode()) memset(d, 0, n); else memcpy(d, (void*)s, n); return 0; }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void*) { if (!record(Node{2, nullptr, {}, {}, 0, {}, d, (const void*)s, n, 0})) memmove((void*)d, (void*)s, n); return 0; }
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void*) { if (!record(Node{3, nullptr, {}, {}, 0, {}, d, nullptr, n, v})) memset((void*)d, v, n); return 0; }
API CUresult cuModuleLoadData(void** m, const void* image) {
  if (null_mode()) { *m = new Mod{nullptr, "null"}; return 0; }
  const char* s = (const char*)image;
  if (strncmp(s, "TFEMU:", 6) != 0) return 200;
  std::string tag(s + 6);
  std::string path = std::string(getenv("TFEMU_DIR") ? getenv("TFEMU_DIR") : "/tmp/tensorfold-emu/variants") + "/" + tag + ".so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "tfemu: %s\n", dlerror()); return 200; }
  *m = new Mod{h, tag};
  return 0;
}
API CUresult cuModuleUnload(void*) { return 0; }
API CUresult cuModuleGetFunction(void** f, void* m, const char* name) {
  if (null_mode()) { *f = new Fn{nullptr, name, 0}; return 0; }
  Mod* mod = (Mod*)m;
  void* p = dlsym(mod->h, (std::string("tfemu_launch_") + name).c_str());
  void* a = dlsym(mod->h, (std::string("tfemu_arity_") + name).c_str());
  if (!p || !a) return 500;
  *f = new Fn{(void (*)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void**))p, name, ((int (*)())a)()};
  return 0;
}
static CUresult run(Fn* fn, const unsigned* g, const unsigned* b, unsigned smem, void** params) {
  if (b[0] * b[1] * b[2] > 1024 || g[1] > 65535 || g[2] > 65535 || smem > fn->smem_max) { fprintf(stderr, "tfemu: bad launch of %s\n", fn->name.c_str()); return 1; }
  if (dbg()) fprintf(stderr, "tfemu: %s grid (%u,%u,%u) block %u smem %u\n", fn->name.c_str(), g[0], g[1], g[2], b[0], smem);
  fn->launch(g[0], g[1], g[2], b[0], b[1], b[2], smem, params);
  return 0;
}
// Every parameter of a TensorFold launch sits at the start of its own 8-byte slot (cuda/device.rs), so a capture
// keeps arity x 8 bytes.
static CUresult launch(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, void** params) {
  Fn* fn = (Fn*)f;
  if (null_mode()) { g_launches++; return 0; }
  unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  if (!g_capture) return run(fn, g, b, smem, params);
  Node n{0, fn, {gx, gy, gz}, {bx, by, bz}, smem, std::vector<unsigned long long>(fn->arity), 0, nullptr, 0, 0};
  for (int i = 0; i < fn->arity; i++) memcpy(&n.slots[i], params[i], 8);
  g_capture->push_back(std::move(n));
  return 0;
}
API CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, void*, void** params, void**) {
  return launch(f, gx, gy, gz, bx, by, bz, smem, params);
}
// CUlaunchConfig's leading fields: grid, block, shared memory (programmatic launch attributes change nothing here).
struct LaunchConfig { unsigned gx, gy, gz, bx, by, bz, smem; };
API CUresult cuLaunchKernelEx(const LaunchConfig* c, void* f, void** params, void**) {
  return launch(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, params);
}
API CUresult cuStreamBeginCapture_v2(void*, int) { if (g_capture) return 900; g_capture = new std::vector<Node>(); return 0; }
API CUresult cuStreamEndCapture(void*, void** graph) { if (!g_capture) return 901; *graph = g_capture; g_capture = nullptr; return 0; }
API CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) { *exec = new std::vector<Node>(*(std::vector<Node>*)graph); return 0; }
API CUresult cuGraphLaunch(void* exec, void*) {
  if (g_capture) return 900;
  g_graphs++;
  for (Node& n : *(std::vector<Node>*)exec) {
    if (n.kind == 0) {
      std::vector<void*> p(n.slots.size());
      for (size_t i = 0; i < p.size(); i++) p[i] = &n.slots[i];
      CUresult r = run(n.fn, n.g, n.b, n.smem, p.data());
      if (r) return r;
    } else if (n.kind == 1) memcpy((void*)n.dst, n.src, n.n);
    else if (n.kind == 2) memmove((void*)n.dst, n.src, n.n);
    else memset((void*)n.dst, n.v, n.n);
  }
  return 0;
}
API CUresult cuGraphExecDestroy(void* exec) { delete (std::vector<Node>*)exec; return 0; }
API CUresult cuGraphDestroy(void* graph) { delete (std::vector<Node>*)graph; return 0; }
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8), up to the device's opt-in limit (attribute 97 above).
API CUresult cuFuncSetAttribute(void* f, int a, int v) {
  if (a != 8) return 0;
  if (v < 0 || v > 232448) return 1;
  if (!null_mode()) ((Fn*)f)->smem_max = (unsigned)v;
  return 0;
}
API CUresult cuFuncGetAttribute(int* v, int a, void*) { *v = a == 0 ? 1024 : a == 4 ? 32 : 0; return 0; }
API CUresult cuGetErrorString(int, const char** s) { *s = "emulated error"; return 0; }
API CUresult cuGetErrorName(int, const char** s) { *s = "EMU_ERROR"; return 0; }

// NVRTC
struct Prog { std::string name, src, image; };
API int nvrtcCreateProgram(void** p, const char* src, const char* name, int, const char**, const char**) { *p = new Prog{name ? name : "", src, ""}; return 0; }
API int nvrtcCompileProgram(void* p, int n, const char** opts) {
  Prog* pr = (Prog*)p;
  std::string mod = pr->name.substr(0, pr->name.size() - 3), def = "none";
  for (int i = 0; i < n; i++) if (strncmp(opts[i], "-D", 2) == 0) def = opts[i] + 2;
  pr->image = "TFEMU:" + mod + "-" + def;
  return 0;
}
API int nvrtcGetCUBINSize(void* p, size_t* n) { *n = ((Prog*)p)->image.size() + 1; return 0; }
API int nvrtcGetCUBIN(void* p, char* b) { memcpy(b, ((Prog*)p)->image.c_str(), ((Prog*)p)->image.size() + 1); return 0; }
API int nvrtcGetProgramLogSize(void*, size_t* n) { *n = 1; return 0; }
API int nvrtcGetProgramLog(void*, char* b) { b[0] = 0; return 0; }
API int nvrtcDestroyProgram(void** p) { delete (Prog*)*p; return 0; }
API const char* nvrtcGetErrorString(int) { return "emulated nvrtc error"; }
API int nvrtcVersion(int* a, int* b) { *a = 13; *b = 0; return 0; }
