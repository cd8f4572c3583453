// Heat equation on an n x n plate (explicit 5-point stencil, Jacobi iterations, two buffers
// swapped every step): hot left edge, cold elsewhere, fixed boundaries. Each block stages its
// 16 x 16 tile plus halo in shared memory. Checked against the same iterations on the CPU.
#include "common.h"

#include <utility>
#include <vector>

constexpr int T = 16;

__global__ void step(const float *u, float *v, int n, float alpha) {
  __shared__ float s[T + 2][T + 2];
  int x = blockIdx.x * T + threadIdx.x, y = blockIdx.y * T + threadIdx.y;
  int lx = threadIdx.x + 1, ly = threadIdx.y + 1;
  bool in = x < n && y < n;
  if (in) {
    s[ly][lx] = u[(size_t)y * n + x];
    if (threadIdx.x == 0 && x > 0) s[ly][0] = u[(size_t)y * n + x - 1];
    if (threadIdx.x == T - 1 && x < n - 1) s[ly][T + 1] = u[(size_t)y * n + x + 1];
    if (threadIdx.y == 0 && y > 0) s[0][lx] = u[(size_t)(y - 1) * n + x];
    if (threadIdx.y == T - 1 && y < n - 1) s[T + 1][lx] = u[(size_t)(y + 1) * n + x];
  }
  __syncthreads();
  if (!in) return;
  if (x == 0 || y == 0 || x == n - 1 || y == n - 1) {
    v[(size_t)y * n + x] = s[ly][lx];
    return;
  }
  // Interior: all four neighbours are in the tile or its halo (loaded above).
  float c = s[ly][lx];
  v[(size_t)y * n + x] =
      c + alpha * (s[ly][lx - 1] + s[ly][lx + 1] + s[ly - 1][lx] + s[ly + 1][lx] - 4.0f * c);
}

int main(int argc, char **argv) {
  bool large = apps::large_size("heat", argc, argv);
  int n = large ? 2048 : 40, iters = large ? 500 : 30;
  const float alpha = 0.2f;
  apps::params("n=%d iters=%d", n, iters);
  size_t elems = (size_t)n * n, bytes = elems * sizeof(float);
  std::vector<float> u(elems, 0.0f);
  apps::Rng rng(6);
  for (int y = 0; y < n; y++) u[(size_t)y * n] = 100.0f;
  for (int y = 1; y < n - 1; y++)
    for (int x = 1; x < n - 1; x++) u[(size_t)y * n + x] = rng.uniform(0, 1);
  float *du, *dv;
  CK(cudaMalloc(&du, bytes));
  CK(cudaMalloc(&dv, bytes));
  CK(cudaMemcpy(du, u.data(), bytes, cudaMemcpyHostToDevice));
  dim3 block(T, T), grid((n + T - 1) / T, (n + T - 1) / T);
  apps::GpuTimer t;
  t.start();
  for (int i = 0; i < iters; i++) {
    step<<<grid, block>>>(du, dv, n, alpha);
    std::swap(du, dv);
  }
  CK_LAUNCH("step");
  t.stop();
  std::vector<float> got(elems);
  CK(cudaMemcpy(got.data(), du, bytes, cudaMemcpyDeviceToHost));
  apps::tamper(got.data(), bytes);

  // The same iterations, row by row: boundary rows and columns copied, the interior's loop
  // without branches (vectorized; each point's float arithmetic in the kernel's order).
  std::vector<float> v(elems);
  for (int i = 0; i < iters; i++) {
    memcpy(&v[0], &u[0], n * sizeof(float));
    memcpy(&v[(size_t)(n - 1) * n], &u[(size_t)(n - 1) * n], n * sizeof(float));
    for (int y = 1; y < n - 1; y++) {
      const float *p = &u[(size_t)y * n];
      float *q = &v[(size_t)y * n];
      q[0] = p[0];
      q[n - 1] = p[n - 1];
      for (int x = 1; x < n - 1; x++)
        q[x] = p[x] + alpha * (p[x - 1] + p[x + 1] + p[x - n] + p[x + n] - 4.0f * p[x]);
    }
    std::swap(u, v);
  }
  double total = 0;
  for (size_t k = 0; k < elems; k++) {
    if (!apps::approx(got[k], u[k], 1e-4, 1e-4))
      apps::fail(1, "u[%zu][%zu]=%.7g want %.7g", k / n, k % n, got[k], u[k]);
    total += got[k];
  }
  CK(cudaFree(du));
  CK(cudaFree(dv));
  return apps::pass(apps::fnv(got.data(), bytes) ^ (uint64_t)total, t.total_ms);
}
