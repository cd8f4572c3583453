// All-pairs gravitational n-body simulation (softened, float4 positions and masses): each block
// stages tiles of bodies in shared memory, accumulates accelerations with rsqrtf, then a second
// kernel integrates velocities and positions (leapfrog-style Euler). Every step is checked on
// the CPU in double precision from the GPU's state before it: the acceleration, velocity and
// position of every body at small size, of every 64th body at large (each one's acceleration
// still sums over all n bodies: O(n^2 / 64) per step on the CPU instead of O(n^2)).
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
  int n = large ? 65536 : 300, steps = large ? 3 : 2, every = large ? 64 : 1;
  apps::params("n=%d steps=%d checked=1/%d", n, steps, every);
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
  // The GPU's state after every step (index 0: the input).
  std::vector<std::vector<float4>> P(steps + 1, pos);
  std::vector<std::vector<float3>> V(steps + 1, vel), A(steps + 1, vel);
  apps::GpuTimer t;
  for (int s = 1; s <= steps; s++) {
    t.start();
    accelerations<<<blocks, TILE>>>(dpos, dacc, n);
    integrate<<<blocks, TILE>>>(dpos, dvel, dacc, n);
    CK_LAUNCH("nbody step");
    t.stop();
    CK(cudaMemcpy(P[s].data(), dpos, n * sizeof(float4), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(V[s].data(), dvel, n * sizeof(float3), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(A[s].data(), dacc, n * sizeof(float3), cudaMemcpyDeviceToHost));
  }
  apps::tamper(P[steps].data(), n * sizeof(float4));

  for (int s = 1; s <= steps; s++) {
    const std::vector<float4> &p0 = P[s - 1];
    for (int i = 0; i < n; i += every) {
      double a[3] = {0, 0, 0}, mag[3] = {0, 0, 0};  // the sum and the sum of |terms|
      for (int j = 0; j < n; j++) {
        double d[3] = {(double)p0[j].x - p0[i].x, (double)p0[j].y - p0[i].y, (double)p0[j].z - p0[i].z};
        double inv = 1.0 / std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + SOFT2);
        double f = p0[j].w * inv * inv * inv;
        for (int e = 0; e < 3; e++) a[e] += d[e] * f, mag[e] += std::fabs(d[e] * f);
      }
      const float ga[3] = {A[s][i].x, A[s][i].y, A[s][i].z}, gv[3] = {V[s][i].x, V[s][i].y, V[s][i].z},
                  gx[3] = {P[s][i].x, P[s][i].y, P[s][i].z};
      const float v0[3] = {V[s - 1][i].x, V[s - 1][i].y, V[s - 1][i].z}, x0[3] = {p0[i].x, p0[i].y, p0[i].z};
      for (int e = 0; e < 3; e++) {
        // Float sums of n terms (rsqrtf's error included): within 1e-4 of the sum of |terms|.
        if (!apps::approx(ga[e], a[e], 0, 1e-4 * mag[e] + 1e-7))
          apps::fail(1, "step %d body %d acceleration %d: %.7g want %.7g", s, i, e, ga[e], a[e]);
        double v = v0[e] + (double)ga[e] * DT, x = x0[e] + v * DT;
        if (!apps::approx(gv[e], v, 1e-6, 1e-7))
          apps::fail(1, "step %d body %d velocity %d: %.7g want %.7g", s, i, e, gv[e], v);
        if (!apps::approx(gx[e], x, 1e-6, 1e-7))
          apps::fail(1, "step %d body %d coordinate %d: %.7g want %.7g", s, i, e, gx[e], x);
      }
      if (P[s][i].w != p0[i].w) apps::fail(1, "step %d body %d: mass %.7g want %.7g", s, i, P[s][i].w, p0[i].w);
    }
  }
  CK(cudaFree(dpos));
  CK(cudaFree(dvel));
  CK(cudaFree(dacc));
  return apps::pass(apps::fnv(P[steps].data(), n * sizeof(float4)), t.total_ms);
}
