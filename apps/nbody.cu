// All-pairs gravitational n-body simulation (softened, float4 positions and masses): each block
// stages tiles of bodies in shared memory, accumulates accelerations with rsqrtf, then a second
// kernel integrates velocities and positions (leapfrog-style Euler). Checked against the same
// steps on the CPU in double precision (positions, relative to the system's size).
#include "common.h"

#include <vector>

constexpr int TILE = 128;
constexpr float SOFT2 = 1e-2f, DT = 1e-3f;

__global__ void accelerations(const float4 *pos, float3 *acc, int n) {
  __shared__ float4 tile[TILE];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float4 p = i < n ? pos[i] : make_float4(0, 0, 0, 0);
  float3 a = make_float3(0, 0, 0);
  for (int base = 0; base < n; base += TILE) {
    int j = base + threadIdx.x;
    tile[threadIdx.x] = j < n ? pos[j] : make_float4(0, 0, 0, 0);  // mass 0: no force
    __syncthreads();
    for (int k = 0; k < TILE; k++) {
      float4 q = tile[k];
      float dx = q.x - p.x, dy = q.y - p.y, dz = q.z - p.z;
      float inv = rsqrtf(dx * dx + dy * dy + dz * dz + SOFT2);
      float s = q.w * inv * inv * inv;
      a.x += dx * s;
      a.y += dy * s;
      a.z += dz * s;
    }
    __syncthreads();
  }
  if (i < n) acc[i] = a;
}

__global__ void integrate(float4 *pos, float3 *vel, const float3 *acc, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float3 v = vel[i];
  v.x += acc[i].x * DT;
  v.y += acc[i].y * DT;
  v.z += acc[i].z * DT;
  vel[i] = v;
  pos[i].x += v.x * DT;
  pos[i].y += v.y * DT;
  pos[i].z += v.z * DT;
}

int main(int argc, char **argv) {
  bool large = apps::large_size("nbody", argc, argv);
  int n = large ? 16384 : 300, steps = large ? 3 : 2;
  apps::params("n=%d steps=%d", n, steps);
  std::vector<float4> pos(n);
  std::vector<float3> vel(n);
  apps::Rng rng(12);
  for (auto &p : pos) p = make_float4(rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(0.5f, 1.5f) / n);
  for (auto &v : vel) v = make_float3(rng.uniform(-0.1f, 0.1f), rng.uniform(-0.1f, 0.1f), rng.uniform(-0.1f, 0.1f));
  float4 *dpos;
  float3 *dvel, *dacc;
  CK(cudaMalloc(&dpos, n * sizeof(float4)));
  CK(cudaMalloc(&dvel, n * sizeof(float3)));
  CK(cudaMalloc(&dacc, n * sizeof(float3)));
  CK(cudaMemcpy(dpos, pos.data(), n * sizeof(float4), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dvel, vel.data(), n * sizeof(float3), cudaMemcpyHostToDevice));
  int blocks = (n + TILE - 1) / TILE;
  apps::GpuTimer t;
  t.start();
  for (int s = 0; s < steps; s++) {
    accelerations<<<blocks, TILE>>>(dpos, dacc, n);
    integrate<<<blocks, TILE>>>(dpos, dvel, dacc, n);
  }
  CK_LAUNCH("nbody step");
  t.stop();
  std::vector<float4> got(n);
  CK(cudaMemcpy(got.data(), dpos, n * sizeof(float4), cudaMemcpyDeviceToHost));
  apps::tamper(got.data(), n * sizeof(float4));

  std::vector<double> x(4 * n), v(3 * n), a(3 * n);
  for (int i = 0; i < n; i++) {
    x[4 * i] = pos[i].x, x[4 * i + 1] = pos[i].y, x[4 * i + 2] = pos[i].z, x[4 * i + 3] = pos[i].w;
    v[3 * i] = vel[i].x, v[3 * i + 1] = vel[i].y, v[3 * i + 2] = vel[i].z;
  }
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < n; i++) {
      double ax = 0, ay = 0, az = 0;
      for (int j = 0; j < n; j++) {
        double dx = x[4 * j] - x[4 * i], dy = x[4 * j + 1] - x[4 * i + 1], dz = x[4 * j + 2] - x[4 * i + 2];
        double inv = 1.0 / std::sqrt(dx * dx + dy * dy + dz * dz + SOFT2);
        double f = x[4 * j + 3] * inv * inv * inv;
        ax += dx * f, ay += dy * f, az += dz * f;
      }
      a[3 * i] = ax, a[3 * i + 1] = ay, a[3 * i + 2] = az;
    }
    for (int i = 0; i < 3 * n; i++) v[i] += a[i] * DT;
    for (int i = 0; i < n; i++)
      for (int e = 0; e < 3; e++) x[4 * i + e] += v[3 * i + e] * DT;
  }
  for (int i = 0; i < n; i++) {
    const float g[3] = {got[i].x, got[i].y, got[i].z};
    for (int e = 0; e < 3; e++)
      if (!apps::approx(g[e], x[4 * i + e], 0, 1e-5))
        apps::fail(1, "body %d coordinate %d: %.7g want %.7g", i, e, g[e], x[4 * i + e]);
  }
  CK(cudaFree(dpos));
  CK(cudaFree(dvel));
  CK(cudaFree(dacc));
  return apps::pass(apps::fnv(got.data(), n * sizeof(float4)), t.total_ms);
}
