// A null libcuda + libnvrtc for cudarc (tools/cuda/nullcuda/run.sh): every call succeeds and does no device work
// (kernels, copies and graph launches are counted, not run; reads to the host give zeros), so the host's own cost of
// a forward can be measured without a GPU.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <string>
#include <atomic>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static void* g_ctx = (void*)0x1234;
static void* g_cur = nullptr;
static std::atomic<unsigned long long> g_next{1ull << 40};
static unsigned long long g_launches = 0, g_graphs = 0;
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
API CUresult cuDeviceGetAttribute(int* v, int a, int) { *v = a == 75 ? 9 : a == 76 ? 0 : a == 115 ? 1 : a == 16 ? 132 : 0; return 0; }
API CUresult cuDeviceGetName(char* s, int len, int) { snprintf(s, len, "TensorFold null device"); return 0; }
API CUresult cuDeviceTotalMem_v2(size_t* b, int) { *b = 1ull << 37; return 0; }
API CUresult cuMemGetInfo_v2(size_t* f, size_t* t) { *f = 1ull << 37; *t = 1ull << 37; return 0; }
API CUresult cuStreamCreate(void** s, unsigned) { *s = (void*)0x5678; return 0; }
API CUresult cuStreamDestroy_v2(void*) { return 0; }
API CUresult cuStreamDestroy(void*) { return 0; }
API CUresult cuStreamSynchronize(void*) { return 0; }
API CUresult cuDeviceGetDefaultMemPool(void** p, int) { *p = (void*)0x9abc; return 0; }
API CUresult cuMemPoolSetAttribute(void*, int, void*) { return 0; }
API CUresult cuMemPoolGetAttribute(void*, int, void* v) { *(unsigned long long*)v = 0; return 0; }
static CUresult alloc(CUdeviceptr* p, size_t n) { *p = g_next.fetch_add((n + 511) / 512 * 512 + 512); return 0; }
API CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, void*) { return alloc(p, n); }
API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { return alloc(p, n); }
API CUresult cuMemFreeAsync(CUdeviceptr, void*) { return 0; }
API CUresult cuMemFree_v2(CUdeviceptr) { return 0; }
API CUresult cuMemHostAlloc(void** p, size_t n, unsigned) { *p = malloc(n); return *p ? 0 : 2; }
API CUresult cuMemAllocHost_v2(void** p, size_t n) { *p = malloc(n); return *p ? 0 : 2; }
API CUresult cuMemFreeHost(void* p) { free(p); return 0; }
static unsigned long long g_htod = 0, g_dtod = 0, g_memset = 0;
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void*, size_t, void*) { g_htod++; return 0; }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t) { return 0; }
API CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr, size_t n, void*) { memset(d, 0, n); return 0; }
API CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr, size_t n) { memset(d, 0, n); return 0; }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, void*) { g_dtod++; return 0; }
API CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, void*) { g_memset++; return 0; }
API CUresult cuModuleLoadData(void** m, const void*) { *m = new int(0); return 0; }
API CUresult cuModuleUnload(void*) { return 0; }
API CUresult cuModuleGetFunction(void** f, void*, const char*) { *f = new int(0); return 0; }
API CUresult cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**) { g_launches++; return 0; }
API CUresult cuFuncGetAttribute(int* v, int a, void*) { *v = a == 0 ? 1024 : a == 4 ? 32 : 0; return 0; }
API CUresult cuFuncSetAttribute(void*, int, int) { return 0; }
API CUresult cuGetErrorString(int, const char** s) { *s = "null error"; return 0; }
API CUresult cuGetErrorName(int, const char** s) { *s = "NULL_ERROR"; return 0; }
API CUresult cuStreamBeginCapture_v2(void*, int) { return 0; }
API CUresult cuStreamEndCapture(void*, void** g) { *g = new int(0); return 0; }
API CUresult cuGraphInstantiateWithFlags(void** e, void*, unsigned long long) { *e = new int(0); return 0; }
API CUresult cuGraphLaunch(void*, void*) { g_graphs++; return 0; }
API CUresult cuGraphExecDestroy(void*) { return 0; }
API CUresult cuGraphDestroy(void*) { return 0; }
API CUresult cuEventCreate(void** e, unsigned) { *e = new int(0); return 0; }
API CUresult cuEventRecord(void*, void*) { return 0; }
API CUresult cuEventSynchronize(void*) { return 0; }
API CUresult cuEventDestroy_v2(void*) { return 0; }
API CUresult cuEventElapsedTime(float* ms, void*, void*) { *ms = 0; return 0; }
API CUresult cuEventElapsedTime_v2(float* ms, void*, void*) { *ms = 0; return 0; }
API CUresult cuStreamWaitEvent(void*, void*, unsigned) { return 0; }
__attribute__((destructor)) static void report() { if (getenv("NULLCUDA_REPORT")) { fprintf(stderr, "nullcuda: %llu launches, %llu graph launches, %llu htod, %llu dtod, %llu memsets\n", g_launches, g_graphs, g_htod, g_dtod, g_memset); } }

// NVRTC
struct Prog { std::string image; };
API int nvrtcCreateProgram(void** p, const char*, const char* name, int, const char**, const char**) { *p = new Prog{std::string("NULL:") + (name ? name : "")}; return 0; }
API int nvrtcCompileProgram(void*, int, const char**) { return 0; }
API int nvrtcGetCUBINSize(void* p, size_t* n) { *n = ((Prog*)p)->image.size() + 1; return 0; }
API int nvrtcGetCUBIN(void* p, char* b) { memcpy(b, ((Prog*)p)->image.c_str(), ((Prog*)p)->image.size() + 1); return 0; }
API int nvrtcGetPTXSize(void* p, size_t* n) { return nvrtcGetCUBINSize(p, n); }
API int nvrtcGetPTX(void* p, char* b) { return nvrtcGetCUBIN(p, b); }
API int nvrtcGetProgramLogSize(void*, size_t* n) { *n = 1; return 0; }
API int nvrtcGetProgramLog(void*, char* b) { b[0] = 0; return 0; }
API int nvrtcDestroyProgram(void** p) { delete (Prog*)*p; return 0; }
API const char* nvrtcGetErrorString(int) { return "null nvrtc error"; }
API int nvrtcVersion(int* a, int* b) { *a = 13; *b = 0; return 0; }
API CUresult cuLaunchKernelEx(const void*, void*, void**, void**) { g_launches++; return 0; }
