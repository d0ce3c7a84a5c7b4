/* A stand-in for the CUDA driver (libcuda.so.1) with the entry points kiln's triton launcher
 * binds (python/kiln/runtime/triton_module.py), for benchmarks/triton_overhead.py --host-only:
 * it times the launcher's Python path and its ctypes calls on a machine with no GPU. Every call
 * succeeds; one context (0x1000, device 0's primary, current in every thread), compute
 * capability 9.0; cuLaunchKernel reads the first kernel parameter and launches nothing. Built as
 * libcuda.so.1 (its soname), so the launcher's ctypes.CDLL("libcuda.so.1") finds it once loaded. */
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
static void* const kContext = (void*)0x1000;
volatile uint64_t kiln_stub_sink;

CUresult cuInit(unsigned flags) {
  return 0;
}
CUresult cuDeviceGet(int* dev, int ordinal) {
  *dev = ordinal;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  *ctx = kContext;
  return 0;
}
CUresult cuCtxGetCurrent(void** ctx) {
  *ctx = kContext;
  return 0;
}
CUresult cuCtxGetDevice(int* dev) {
  *dev = 0;
  return 0;
}
CUresult cuCtxPushCurrent_v2(void* ctx) {
  return 0;
}
CUresult cuCtxPopCurrent_v2(void** ctx) {
  *ctx = kContext;
  return 0;
}
CUresult cuDeviceGetAttribute(int* value, int attr, int dev) {
  *value = attr == 75 ? 9 : 0;
  return 0;
}
CUresult cuModuleLoadData(void** mod, const void* image) {
  *mod = (void*)0x77;
  return 0;
}
CUresult cuModuleGetFunction(void** fn, void* mod, const char* name) {
  *fn = (void*)0xF000;
  return 0;
}
CUresult cuFuncSetAttribute(void* fn, int attr, int value) {
  return 0;
}
CUresult cuGetErrorName(CUresult rc, const char** name) {
  *name = "CUDA_ERROR_STUB";
  return 0;
}
CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void* stream, void** params, void** extra) {
  if (fn == NULL || params == NULL || gx == 0 || gy == 0 || gz == 0) return 1; /* INVALID_VALUE */
  kiln_stub_sink += *(const uint64_t*)params[0];
  return 0;
}
