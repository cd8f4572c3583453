// k-means clustering (Lloyd's iterations) of n points with D integer coordinates into K clusters,
// with integer centroids (the floor of the mean) so that the GPU and the CPU take the same path
// exactly: an assignment kernel (centroids staged in shared memory, squared distances in 64-bit
// integers, ties to the lower index) that accumulates per-cluster sums and counts with atomics
// (per block in shared memory, then 64-bit atomicAdd to global memory), and an update kernel.
// Stops when no point changes cluster (a count copied back) or after the iteration limit.
// Assignments and centroids checked exactly against the CPU's iterations.
#include "common.h"

#include <vector>

constexpr int D = 4, KMAX = 64;

__global__ void assign(const int *pts, int n, const int *cent, int k, int *label,
                       unsigned long long *sums, unsigned *counts, unsigned *changed) {
  __shared__ int c[KMAX * D];
  __shared__ unsigned long long ssum[KMAX * D];
  __shared__ unsigned scount[KMAX];
  for (int i = threadIdx.x; i < k * D; i += blockDim.x) {
    c[i] = cent[i];
    ssum[i] = 0;
  }
  for (int i = threadIdx.x; i < k; i += blockDim.x) scount[i] = 0;
  __syncthreads();
  int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < n) {
    long long best = -1;
    int arg = 0;
    for (int j = 0; j < k; j++) {
      long long dist = 0;
      for (int e = 0; e < D; e++) {
        long long diff = pts[(size_t)p * D + e] - c[j * D + e];
        dist += diff * diff;
      }
      if (best < 0 || dist < best) {
        best = dist;
        arg = j;
      }
    }
    if (label[p] != arg) {
      label[p] = arg;
      atomicAdd(changed, 1u);
    }
    for (int e = 0; e < D; e++) atomicAdd(&ssum[arg * D + e], (unsigned long long)pts[(size_t)p * D + e]);
    atomicAdd(&scount[arg], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < k * D; i += blockDim.x)
    if (ssum[i]) atomicAdd(&sums[i], ssum[i]);
  for (int i = threadIdx.x; i < k; i += blockDim.x)
    if (scount[i]) atomicAdd(&counts[i], scount[i]);
}

// An empty cluster keeps its centroid.
__global__ void update(int *cent, const unsigned long long *sums, const unsigned *counts, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < k * D && counts[i / D]) cent[i] = (int)(sums[i] / counts[i / D]);
}

int main(int argc, char **argv) {
  bool large = apps::large_size("kmeans", argc, argv);
  int n = large ? 1 << 20 : 3000, k = large ? 32 : 8, max_iters = large ? 20 : 8;
  apps::params("n=%d k=%d d=%d", n, k, D);
  apps::Rng rng(11);
  // Points around k hidden centres (spread 0..100000 per axis, clusters +-6000).
  std::vector<int> pts((size_t)n * D), centres(k * D), cent(k * D);
  for (auto &x : centres) x = 6000 + (int)rng.below(100000);  // all coordinates >= 0
  for (int p = 0; p < n; p++) {
    int c = (int)rng.below(k);
    for (int e = 0; e < D; e++) pts[(size_t)p * D + e] = centres[c * D + e] + (int)rng.below(12001) - 6000;
  }
  for (int j = 0; j < k; j++)  // the first centroids: k of the points
    for (int e = 0; e < D; e++) cent[j * D + e] = pts[(size_t)(j * (n / k)) * D + e];

  int *dpts, *dcent, *dlabel;
  unsigned long long *dsums;
  unsigned *dcounts, *dchanged;
  CK(cudaMalloc(&dpts, pts.size() * sizeof(int)));
  CK(cudaMalloc(&dcent, cent.size() * sizeof(int)));
  CK(cudaMalloc(&dlabel, n * sizeof(int)));
  CK(cudaMalloc(&dsums, k * D * sizeof(unsigned long long)));
  CK(cudaMalloc(&dcounts, k * sizeof(unsigned)));
  CK(cudaMalloc(&dchanged, sizeof(unsigned)));
  CK(cudaMemcpy(dpts, pts.data(), pts.size() * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dcent, cent.data(), cent.size() * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemset(dlabel, 0xff, n * sizeof(int)));
  apps::GpuTimer t;
  int iters = 0;
  unsigned changed = 1;
  t.start();
  while (changed && iters < max_iters) {
    CK(cudaMemset(dsums, 0, k * D * sizeof(unsigned long long)));
    CK(cudaMemset(dcounts, 0, k * sizeof(unsigned)));
    CK(cudaMemset(dchanged, 0, sizeof(unsigned)));
    assign<<<(n + 255) / 256, 256>>>(dpts, n, dcent, k, dlabel, dsums, dcounts, dchanged);
    CK_LAUNCH("assign");
    update<<<(k * D + 255) / 256, 256>>>(dcent, dsums, dcounts, k);
    CK_LAUNCH("update");
    CK(cudaMemcpy(&changed, dchanged, sizeof changed, cudaMemcpyDeviceToHost));
    iters++;
  }
  t.stop();
  std::vector<int> got_label(n), got_cent(k * D);
  CK(cudaMemcpy(got_label.data(), dlabel, n * sizeof(int), cudaMemcpyDeviceToHost));
  apps::tamper(got_label.data(), n * sizeof(int));
  CK(cudaMemcpy(got_cent.data(), dcent, k * D * sizeof(int), cudaMemcpyDeviceToHost));

  std::vector<int> label(n, -1);
  int cpu_iters = 0;
  for (bool moved = true; moved && cpu_iters < max_iters; cpu_iters++) {
    moved = false;
    std::vector<unsigned long long> sums(k * D, 0);
    std::vector<unsigned> counts(k, 0);
    for (int p = 0; p < n; p++) {
      long long best = -1;
      int arg = 0;
      for (int j = 0; j < k; j++) {
        long long dist = 0;
        for (int e = 0; e < D; e++) {
          long long diff = pts[(size_t)p * D + e] - cent[j * D + e];
          dist += diff * diff;
        }
        if (best < 0 || dist < best) {
          best = dist;
          arg = j;
        }
      }
      moved |= label[p] != arg;
      label[p] = arg;
      for (int e = 0; e < D; e++) sums[arg * D + e] += (unsigned long long)pts[(size_t)p * D + e];
      counts[arg]++;
    }
    for (int i = 0; i < k * D; i++)
      if (counts[i / D]) cent[i] = (int)(sums[i] / counts[i / D]);
  }
  if (iters != cpu_iters) apps::fail(1, "%d iterations, the CPU took %d", iters, cpu_iters);
  for (int p = 0; p < n; p++)
    if (got_label[p] != label[p]) apps::fail(1, "point %d in cluster %d want %d", p, got_label[p], label[p]);
  for (int i = 0; i < k * D; i++)
    if (got_cent[i] != cent[i]) apps::fail(1, "centroid coordinate %d = %d want %d", i, got_cent[i], cent[i]);
  for (void *p : {(void *)dpts, (void *)dcent, (void *)dlabel, (void *)dsums, (void *)dcounts, (void *)dchanged})
    CK(cudaFree(p));
  apps::params("n=%d k=%d d=%d iters=%d", n, k, D, iters);
  return apps::pass(apps::fnv(got_cent.data(), k * D * sizeof(int)), t.total_ms);
}
