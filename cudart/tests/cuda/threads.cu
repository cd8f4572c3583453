// Several host threads using the runtime at once, each with its own buffers, launches and
// copies (the runtime makes its context current on each thread); a __constant__ set by the
// main thread is seen by all. Prints "threads ok" and exits 0 when every result is right.
#include <cstdio>
#include <thread>
#include <vector>

__constant__ float scale;

__global__ void vadd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = (a[i] + b[i]) * scale;
}

static int work(int t) {
  const int n = 4096 + t * 100;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; i++) { a[i] = t + i; b[i] = 1; }
  float *d[3];
  for (auto &p : d) if (cudaMalloc(&p, n * 4) != cudaSuccess) return 1;
  if (cudaMemcpy(d[0], a.data(), n * 4, cudaMemcpyHostToDevice) != cudaSuccess) return 2;
  if (cudaMemcpy(d[1], b.data(), n * 4, cudaMemcpyHostToDevice) != cudaSuccess) return 3;
  for (int r = 0; r < 10; r++) vadd<<<(n + 127) / 128, 128>>>(d[0], d[1], d[2], n);
  if (cudaGetLastError() != cudaSuccess) return 4;
  if (cudaMemcpy(c.data(), d[2], n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return 5;
  for (int i = 0; i < n; i++) if (c[i] != (a[i] + 1) * 2) return 6;
  for (auto p : d) if (cudaFree(p) != cudaSuccess) return 7;
  return 0;
}

int main() {
  float s = 2;
  if (cudaMemcpyToSymbol(scale, &s, 4) != cudaSuccess) { printf("FAIL symbol\n"); return 1; }
  const int T = 4;
  int rc[T] = {0};
  std::vector<std::thread> th;
  for (int t = 0; t < T; t++) th.emplace_back([t, &rc] { rc[t] = work(t); });
  for (auto &x : th) x.join();
  for (int t = 0; t < T; t++) if (rc[t]) { printf("FAIL thread %d step %d\n", t, rc[t]); return 1; }
  printf("threads ok\n");
  return 0;
}
