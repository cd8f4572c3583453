// Tiled single-precision matrix multiply C = A * B with shared-memory tiles (16 x 16), checked
// against a double-precision CPU product (every entry at small size, 4096 sampled at large).
#include "common.h"

#include <vector>

constexpr int TILE = 16;

__global__ void matmul(const float *a, const float *b, float *c, int n) {
  __shared__ float ta[TILE][TILE];
  __shared__ float tb[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y;
  int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < n; t += TILE) {
    int ac = t + threadIdx.x, br = t + threadIdx.y;
    ta[threadIdx.y][threadIdx.x] = (row < n && ac < n) ? a[(size_t)row * n + ac] : 0.0f;
    tb[threadIdx.y][threadIdx.x] = (br < n && col < n) ? b[(size_t)br * n + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; k++) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
    __syncthreads();
  }
  if (row < n && col < n) c[(size_t)row * n + col] = acc;
}

int main(int argc, char **argv) {
  bool large = apps::large_size("matmul", argc, argv);
  // n not a multiple of the tile at small size: the edge tiles are exercised.
  int n = large ? 2048 : 72, reps = large ? 10 : 1;
  apps::params("n=%d reps=%d", n, reps);
  size_t elems = (size_t)n * n, bytes = elems * sizeof(float);
  std::vector<float> a(elems), b(elems), c(elems);
  apps::Rng rng(1);
  for (auto &x : a) x = rng.uniform(-1, 1);
  for (auto &x : b) x = rng.uniform(-1, 1);

  float *da, *db, *dc;
  CK(cudaMalloc(&da, bytes));
  CK(cudaMalloc(&db, bytes));
  CK(cudaMalloc(&dc, bytes));
  CK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemset(dc, 0xff, bytes));  // NaNs: an entry never written fails the check
  dim3 block(TILE, TILE), grid((n + TILE - 1) / TILE, (n + TILE - 1) / TILE);
  apps::GpuTimer t;
  t.start();
  for (int r = 0; r < reps; r++) matmul<<<grid, block>>>(da, db, dc, n);
  CK_LAUNCH("matmul");
  t.stop();
  CK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
  apps::tamper(c.data(), bytes);

  size_t checks = large ? 4096 : elems;
  apps::Rng pick(2);
  for (size_t s = 0; s < checks; s++) {
    size_t idx = large ? pick.next() % elems : s;
    int i = (int)(idx / n), j = (int)(idx % n);
    double want = 0, mag = 0;
    for (int k = 0; k < n; k++) {
      double p = (double)a[(size_t)i * n + k] * b[(size_t)k * n + j];
      want += p;
      mag += std::fabs(p);
    }
    if (!apps::approx(c[idx], want, 0, 1e-5 * mag + 1e-6))
      apps::fail(1, "C[%d][%d]=%.7g want %.7g", i, j, c[idx], want);
  }
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
  return apps::pass(apps::fnv(c.data(), bytes), t.total_ms);
}
