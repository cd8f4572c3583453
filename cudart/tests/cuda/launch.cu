// Launch cost: an empty kernel launched N times (default 100000) on the default stream, then one
// synchronisation; prints "launch n=N us_per_launch=X" (host-side cost of the runtime and the
// driver under it). Compare runtimes over the same driver: LD_LIBRARY_PATH=<runtime dir>.
#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void empty(int *p) { if (p) *p = 1; }

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  if (n < 1) n = 1;
  empty<<<1, 32>>>(nullptr);  // load the module, warm up
  if (cudaDeviceSynchronize() != cudaSuccess) { printf("FAIL warm-up: %s\n", cudaGetErrorString(cudaGetLastError())); return 1; }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) empty<<<1, 32>>>(nullptr);
  cudaError_t e = cudaDeviceSynchronize();
  auto t1 = std::chrono::steady_clock::now();
  if (e != cudaSuccess || cudaGetLastError() != cudaSuccess) { printf("FAIL: %s\n", cudaGetErrorString(e)); return 1; }
  printf("launch n=%d us_per_launch=%.3f\n", n, std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
  return 0;
}
