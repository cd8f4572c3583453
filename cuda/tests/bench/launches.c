/* Launch rate through libcuda.so.1: N launches of a one-warp vecadd (tests/kernels.ptx).
 * cc launches.c -o launches -Ltarget/release -l:libcuda.so.1
 * LD_LIBRARY_PATH=target/release VGPU_CUDA_STATS=s.json ./launches cuda/tests/kernels.ptx 20000 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int CUresult; typedef unsigned long long CUdeviceptr; typedef void *H;
CUresult cuInit(unsigned); CUresult cuCtxCreate_v4(H*, void*, unsigned, int);
CUresult cuModuleLoad(H*, const char*); CUresult cuModuleGetFunction(H*, H, const char*);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t); CUresult cuCtxSynchronize(void);
CUresult cuLaunchKernel(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H, void**, void**);
CUresult cuCtxDestroy_v2(H);
int main(int argc, char** argv) {
  H ctx, mod, f; CUdeviceptr d; unsigned n = 32; int iters = atoi(argv[2]);
  if (cuInit(0) || cuCtxCreate_v4(&ctx, 0, 0, 0) || cuModuleLoad(&mod, argv[1]) || cuModuleGetFunction(&f, mod, "vecadd") || cuMemAlloc_v2(&d, 4096)) return 1;
  void* args[] = { &d, &d, &d, &n };
  struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < iters; i++) if (cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, args, 0)) return 2;
  cuCtxSynchronize(); clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%d launches: %.2f us each (whole call, kernel included)\n", iters, ((b.tv_sec-a.tv_sec)*1e9 + (b.tv_nsec-a.tv_nsec))/1e3/iters);
  cuCtxDestroy_v2(ctx); return 0;
}
