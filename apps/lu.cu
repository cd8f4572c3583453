// LU decomposition (Doolittle, no pivoting, in place) of a diagonally dominant n x n matrix:
// for every pivot k, one kernel scales the column below it (the multipliers of L) and one 2D
// kernel updates the trailing submatrix, 2n launches in all. Checked against the same
// factorization in double precision on the CPU (every entry, relative 1e-4).
#include "common.h"

#include <vector>

__global__ void scale_column(float *a, int n, int k) {
  int i = k + 1 + blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[(size_t)i * n + k] /= a[(size_t)k * n + k];
}

__global__ void update(float *a, int n, int k) {
  __shared__ float lcol[16], urow[16];
  int i = k + 1 + blockIdx.y * 16 + threadIdx.y;
  int j = k + 1 + blockIdx.x * 16 + threadIdx.x;
  if (threadIdx.x == 0 && i < n) lcol[threadIdx.y] = a[(size_t)i * n + k];
  if (threadIdx.y == 0 && j < n) urow[threadIdx.x] = a[(size_t)k * n + j];
  __syncthreads();
  if (i < n && j < n) a[(size_t)i * n + j] -= lcol[threadIdx.y] * urow[threadIdx.x];
}

int main(int argc, char **argv) {
  bool large = apps::large_size("lu", argc, argv);
  int n = large ? 1536 : 40;
  apps::params("n=%d", n);
  size_t elems = (size_t)n * n, bytes = elems * sizeof(float);
  std::vector<float> a(elems);
  apps::Rng rng(8);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      a[(size_t)i * n + j] = rng.uniform(-1, 1) + (i == j ? (float)n : 0.0f);
  float *da;
  CK(cudaMalloc(&da, bytes));
  CK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  apps::GpuTimer t;
  t.start();
  for (int k = 0; k < n - 1; k++) {
    int rest = n - k - 1;
    scale_column<<<(rest + 127) / 128, 128>>>(da, n, k);
    dim3 grid((rest + 15) / 16, (rest + 15) / 16);
    update<<<grid, dim3(16, 16)>>>(da, n, k);
  }
  CK_LAUNCH("lu");
  t.stop();
  std::vector<float> got(elems);
  CK(cudaMemcpy(got.data(), da, bytes, cudaMemcpyDeviceToHost));
  apps::tamper(got.data(), bytes);

  std::vector<double> w(a.begin(), a.end());
  for (int k = 0; k < n - 1; k++)
    for (int i = k + 1; i < n; i++) {
      double l = w[(size_t)i * n + k] /= w[(size_t)k * n + k];
      for (int j = k + 1; j < n; j++) w[(size_t)i * n + j] -= l * w[(size_t)k * n + j];
    }
  for (size_t idx = 0; idx < elems; idx++)
    if (!apps::approx(got[idx], w[idx], 1e-4, 1e-5))
      apps::fail(1, "LU[%zu][%zu]=%.7g want %.7g", idx / n, idx % n, got[idx], w[idx]);
  CK(cudaFree(da));
  return apps::pass(apps::fnv(got.data(), bytes), t.total_ms);
}
