// Parallel reduction: the sum (64-bit, exact) and the maximum of n unsigned integers. Each block
// reduces a grid-stride slice in shared memory down to one warp, finishes with warp shuffles
// (__shfl_down_sync) and adds its result with a 64-bit atomicAdd / atomicMax. Checked exactly.
#include "common.h"

#include <algorithm>
#include <vector>

constexpr int THREADS = 256;

__global__ void reduce(const unsigned *in, size_t n, unsigned long long *sum, unsigned *mx) {
  __shared__ unsigned long long ssum[THREADS];
  __shared__ unsigned smax[THREADS];
  unsigned long long s = 0;
  unsigned m = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned v = in[i];
    s += v;
    m = v > m ? v : m;
  }
  ssum[threadIdx.x] = s;
  smax[threadIdx.x] = m;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride >= 32; stride /= 2) {
    if (threadIdx.x < stride) {
      ssum[threadIdx.x] += ssum[threadIdx.x + stride];
      smax[threadIdx.x] = max(smax[threadIdx.x], smax[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  if (threadIdx.x < 32) {
    s = ssum[threadIdx.x];
    m = smax[threadIdx.x];
    for (int off = 16; off > 0; off /= 2) {
      s += __shfl_down_sync(0xffffffffu, s, off);
      m = max(m, __shfl_down_sync(0xffffffffu, m, off));
    }
    if (threadIdx.x == 0) {
      atomicAdd(sum, s);
      atomicMax(mx, m);
    }
  }
}

int main(int argc, char **argv) {
  bool large = apps::large_size("reduce", argc, argv);
  size_t n = large ? (size_t)1 << 26 : 50000;
  int blocks = large ? 1056 : 8, reps = large ? 80 : 2;
  apps::params("n=%zu blocks=%d reps=%d", n, blocks, reps);
  std::vector<unsigned> in(n);
  apps::Rng rng(3);
  for (auto &x : in) x = (unsigned)(rng.next() >> 36);  // 28-bit values
  unsigned long long want_sum = 0;
  unsigned want_max = 0;
  for (unsigned v : in) {
    want_sum += v;
    want_max = std::max(want_max, v);
  }

  unsigned *din, *dmax;
  unsigned long long *dsum;
  CK(cudaMalloc(&din, n * sizeof(unsigned)));
  CK(cudaMalloc(&dsum, sizeof *dsum));
  CK(cudaMalloc(&dmax, sizeof *dmax));
  CK(cudaMemcpy(din, in.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  apps::GpuTimer t;
  unsigned long long sum = 0;
  unsigned mx = 0;
  for (int r = 0; r < reps; r++) {
    CK(cudaMemset(dsum, 0, sizeof *dsum));
    CK(cudaMemset(dmax, 0, sizeof *dmax));
    t.start();
    reduce<<<blocks, THREADS>>>(din, n, dsum, dmax);
    CK_LAUNCH("reduce");
    t.stop();
    CK(cudaMemcpy(&sum, dsum, sizeof sum, cudaMemcpyDeviceToHost));
    apps::tamper(&sum, sizeof sum);
    CK(cudaMemcpy(&mx, dmax, sizeof mx, cudaMemcpyDeviceToHost));
    if (sum != want_sum || mx != want_max)
      apps::fail(1, "rep %d: sum=%llu max=%u want sum=%llu max=%u", r, sum, mx, want_sum, want_max);
  }
  CK(cudaFree(din));
  CK(cudaFree(dsum));
  CK(cudaFree(dmax));
  return apps::pass(sum ^ ((uint64_t)mx << 40), t.total_ms);
}
