// A test double of libcuda.so.1 for cudart/tests/programs.rs: just the driver calls the runtime
// makes for tests/cuda/symbols.cu, threads.cu and launch.cu, with host memory as device memory and
// symbols.cu's vadd kernel computed on the CPU from the launch's kernelParams. It checks the
// runtime's own plumbing (registration, lazy loading of the fat binary, kernel and symbol
// lookup by name, parameter passing, the call configuration) independently of any real driver;
// DOUBLE_NO_BINARY=1 makes module loads fail with CUDA_ERROR_NO_BINARY_FOR_GPU. Counters of
// what was called are printed at exit (DOUBLE_STATS=1).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;

static float g_scale;
static unsigned g_launched;
static int the_ctx, the_module, k_vadd, k_other;
// The context current on each thread: calls on a thread without it fail, as a real driver's do.
static __thread void *current;
#define NEED_CTX() do { if (current != &the_ctx) return 201; } while (0)
static unsigned long loads, launches;  // (launches from several threads: approximate)

static void stats(void) {
  if (getenv("DOUBLE_STATS")) fprintf(stderr, "double: loads=%lu launches=%lu\n", loads, launches);
}

CUresult cuInit(unsigned flags) { atexit(stats); return flags ? 1 : 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int dev) { if (dev) return 101; *c = &the_ctx; return 0; }
CUresult cuCtxSetCurrent(void *c) { if (c != &the_ctx) return 201; current = c; return 0; }
CUresult cuCtxSynchronize(void) { NEED_CTX(); return 0; }
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) { return 1; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  void *m = n <= ((size_t)1 << 32) ? malloc(n) : NULL;
  if (!m) return 2;
  *p = (CUdeviceptr)m;
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CTX(); free((void *)p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { NEED_CTX(); memcpy((void *)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { NEED_CTX(); memcpy(d, (void *)s, n); return 0; }
CUresult cuModuleLoadData(void **m, const void *image) {
  NEED_CTX();
  if (*(const uint32_t *)image != 0xBA55ED50u) return 200;  // CUDA_ERROR_INVALID_IMAGE
  if (getenv("DOUBLE_NO_BINARY")) return 209;
  loads++;
  *m = &the_module;
  return 0;
}
// With an error log (CU_JIT_ERROR_LOG_BUFFER 5, its size 6), as the runtime loads modules.
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *options, void **values) {
  CUresult r = cuModuleLoadData(m, image);
  for (unsigned i = 0; r && i < n; i++)
    if (options[i] == 5)
      for (unsigned j = 0; j < n; j++)
        if (options[j] == 6 && (size_t)values[j] > 0)
          snprintf((char *)values[i], (size_t)values[j], "double: refused %s", "the module\nsecond line");
  return r;
}
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *n, void *m, const char *name) {
  if (m != &the_module) return 400;
  if (!strcmp(name, "scale")) { *p = (CUdeviceptr)&g_scale; *n = sizeof g_scale; return 0; }
  if (!strcmp(name, "launched")) { *p = (CUdeviceptr)&g_launched; *n = sizeof g_launched; return 0; }
  return 500;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  if (m != &the_module) return 400;
  *f = !strcmp(name, "_Z4vaddPKfS0_Pfi") ? (void *)&k_vadd : (void *)&k_other;
  return 0;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
  NEED_CTX();
  launches++;
  if (f != &k_vadd) return f == &k_other ? 0 : 400;
  const float *a = *(const float **)params[0], *b = *(const float **)params[1];
  float *c = *(float **)params[2];
  int n = *(int *)params[3];
  for (unsigned long i = 0; i < (unsigned long)gx * bx; i++) {
    if ((long)i < n) c[i] = (a[i] + b[i]) * g_scale;
    if (i == 0) g_launched++;
  }
  return 0;
}
