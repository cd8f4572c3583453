// A kernel fault is CUDA's sticky error: cudaDeviceSynchronize reports the illegal address,
// cudaGetLastError returns it, and later calls keep failing with it (the context is lost), as
// with NVIDIA's runtime. Prints "fault ok" and exits 0 when that is what happens.
#include <cstdio>

__global__ void bad(int *p) { p[threadIdx.x] = 1; }

int main() {
  int *d = nullptr;
  if (cudaMalloc(&d, 64) != cudaSuccess) { printf("FAIL malloc before\n"); return 1; }
  bad<<<1, 32>>>((int *)0x10);
  cudaError_t sync = cudaDeviceSynchronize();
  cudaError_t last = cudaGetLastError();
  cudaError_t after = cudaMalloc(&d, 64);
  printf("sync=%s last=%s after=%s\n", cudaGetErrorName(sync), cudaGetErrorName(last), cudaGetErrorName(after));
  if (sync != cudaErrorIllegalAddress || last != cudaErrorIllegalAddress || after != cudaErrorIllegalAddress) return 1;
  printf("fault ok\n");
  return 0;
}
