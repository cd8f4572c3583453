// A vector add scaled by a __constant__ and counted in a __device__ variable: registration of
// kernels and variables, cudaMemcpyToSymbol/FromSymbol, symbol address/size, launches through
// nvcc's stubs. Prints "symbols ok" and exits 0 when every result matches the CPU's.
#include <cstdio>
#include <cstdlib>
#include <vector>

__constant__ float scale;
__device__ unsigned int launched;

__global__ void vadd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = (a[i] + b[i]) * scale;
  if (i == 0) atomicAdd(&launched, 1u);
}

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("FAIL %s: %s (%s)\n", #x, cudaGetErrorName(e), cudaGetErrorString(e)); return 1; } } while (0)

int main() {
  const int n = 1000;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; i++) { a[i] = i; b[i] = 2 * i + 1; }
  float *da, *db, *dc, s = 3.0f;
  CHECK(cudaMalloc(&da, n * 4)); CHECK(cudaMalloc(&db, n * 4)); CHECK(cudaMalloc(&dc, n * 4));
  CHECK(cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), n * 4, cudaMemcpyDefault));
  CHECK(cudaMemcpyToSymbol(scale, &s, sizeof s));
  unsigned int zero = 0, count = 0;
  CHECK(cudaMemcpyToSymbol(launched, &zero, sizeof zero));
  size_t size = 0; void *addr = nullptr;
  CHECK(cudaGetSymbolSize(&size, scale));
  CHECK(cudaGetSymbolAddress(&addr, launched));
  if (size != 4 || addr == nullptr) { printf("FAIL symbol size %zu addr %p\n", size, addr); return 1; }
  for (int r = 0; r < 3; r++) vadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(c.data(), dc, n * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpyFromSymbol(&count, launched, sizeof count));
  for (int i = 0; i < n; i++)
    if (c[i] != (a[i] + b[i]) * s) { printf("FAIL c[%d]=%f\n", i, c[i]); return 1; }
  if (count != 3) { printf("FAIL launched=%u\n", count); return 1; }
  // Out of the symbol's bounds: an error, nothing written.
  if (cudaMemcpyToSymbol(scale, &s, sizeof s, 4) != cudaErrorInvalidValue) { printf("FAIL bounds\n"); return 1; }
  if (cudaGetLastError() != cudaErrorInvalidValue || cudaGetLastError() != cudaSuccess) { printf("FAIL last error\n"); return 1; }
  CHECK(cudaFree(da)); CHECK(cudaFree(db)); CHECK(cudaFree(dc));
  printf("symbols ok\n");
  return 0;
}
