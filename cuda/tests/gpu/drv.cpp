// A driver-API program (nvcc-compiled PTX loaded from a file): saxpy with a __constant__,
// a __device__ counter and a struct by value; checks itself. Built by bundle.sh.
#include <cuda.h>
#include <cstdio>
#include <vector>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorName(r, &s); printf("FAIL %s: %s\n", #x, s); return 1; } } while (0)
int main(int argc, char** argv) {
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuCtxCreate(&c, NULL, 0, d));
  CUmodule m; CK(cuModuleLoad(&m, argv[1])); CUfunction f; CK(cuModuleGetFunction(&f, m, "saxpy"));
  int n = 10000; std::vector<float> x(n), y(n);
  for (int i = 0; i < n; i++) { x[i] = i; y[i] = 1; }
  CUdeviceptr dx, dy; CK(cuMemAlloc(&dx, n*4)); CK(cuMemAlloc(&dy, n*4));
  CK(cuMemcpyHtoD(dx, x.data(), n*4)); CK(cuMemcpyHtoD(dy, y.data(), n*4));
  CUdeviceptr ds; size_t sz; CK(cuModuleGetGlobal(&ds, &sz, m, "scale")); float s = 2; CK(cuMemcpyHtoD(ds, &s, 4));
  struct { int n; float bias; } p = { n, 0.5f };
  void* args[] = { &p, &dx, &dy };
  CK(cuLaunchKernel(f, (n+255)/256, 1, 1, 256, 1, 1, 0, 0, args, NULL));
  CK(cuLaunchKernel(f, (n+255)/256, 1, 1, 256, 1, 1, 0, 0, args, NULL));
  CK(cuMemcpyDtoH(y.data(), dy, n*4));
  CUdeviceptr dcnt; CK(cuModuleGetGlobal(&dcnt, &sz, m, "counter")); int cnt; CK(cuMemcpyDtoH(&cnt, dcnt, 4));
  for (int i = 0; i < n; i++) if (y[i] != 1 + 2*(2*i + 0.5f)) { printf("FAIL y[%d]=%f\n", i, y[i]); return 1; }
  printf("PASS saxpy n=%d counter=%d\n", n, cnt);
  CK(cuCtxDestroy(c)); return 0;
}
