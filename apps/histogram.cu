// 256-bin histogram of n bytes with atomics: each block counts into its own shared-memory
// histogram (atomicAdd on shared memory), then adds it to the global one (atomicAdd on global
// memory). The data are skewed (a third of the bytes fall in 4 bins: heavy contention). Exact.
#include "common.h"

#include <vector>

constexpr int BINS = 256, THREADS = 256;

__global__ void histogram(const unsigned char *data, size_t n, unsigned *bins) {
  __shared__ unsigned local[BINS];
  for (int i = threadIdx.x; i < BINS; i += blockDim.x) local[i] = 0;
  __syncthreads();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    atomicAdd(&local[data[i]], 1u);
  __syncthreads();
  for (int i = threadIdx.x; i < BINS; i += blockDim.x)
    if (local[i]) atomicAdd(&bins[i], local[i]);
}

int main(int argc, char **argv) {
  bool large = apps::large_size("histogram", argc, argv);
  size_t n = large ? (size_t)1 << 28 : 60000;
  int blocks = large ? 1056 : 6, reps = large ? 30 : 1;
  apps::params("n=%zu blocks=%d reps=%d", n, blocks, reps);
  std::vector<unsigned char> data(n);
  apps::Rng rng(5);
  for (auto &x : data) {
    uint64_t r = rng.next();
    x = (r & 3) == 0 ? (unsigned char)(100 + ((r >> 8) & 3)) : (unsigned char)(r >> 16);
  }
  std::vector<unsigned> want(BINS, 0), got(BINS);
  for (unsigned char x : data) want[x]++;

  unsigned char *dd;
  unsigned *dbins;
  CK(cudaMalloc(&dd, n));
  CK(cudaMalloc(&dbins, BINS * sizeof(unsigned)));
  CK(cudaMemcpy(dd, data.data(), n, cudaMemcpyHostToDevice));
  apps::GpuTimer t;
  for (int r = 0; r < reps; r++) {
    CK(cudaMemset(dbins, 0, BINS * sizeof(unsigned)));
    t.start();
    histogram<<<blocks, THREADS>>>(dd, n, dbins);
    CK_LAUNCH("histogram");
    t.stop();
  }
  CK(cudaMemcpy(got.data(), dbins, BINS * sizeof(unsigned), cudaMemcpyDeviceToHost));
  apps::tamper(got.data(), BINS * sizeof(unsigned));
  for (int i = 0; i < BINS; i++)
    if (got[i] != want[i]) apps::fail(1, "bin %d: %u want %u", i, got[i], want[i]);
  CK(cudaFree(dd));
  CK(cudaFree(dbins));
  return apps::pass(apps::fnv(got.data(), BINS * sizeof(unsigned)), t.total_ms);
}
