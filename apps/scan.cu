// Exclusive prefix sum (scan) of n 32-bit integers (wrapping arithmetic, checked exactly): each
// block scans 1024 elements in shared memory (Blelloch up-sweep / down-sweep), the blocks' totals
// are scanned recursively, then added back to every block.
#include "common.h"

#include <vector>

constexpr int THREADS = 512, PER_BLOCK = 2 * THREADS;

// Scans in[] block by block into out[]; writes each block's total to sums (when not null).
__global__ void scan_blocks(const unsigned *in, unsigned *out, unsigned *sums, size_t n) {
  __shared__ unsigned s[PER_BLOCK];
  size_t base = (size_t)blockIdx.x * PER_BLOCK;
  int t = threadIdx.x;
  s[2 * t] = base + 2 * t < n ? in[base + 2 * t] : 0;
  s[2 * t + 1] = base + 2 * t + 1 < n ? in[base + 2 * t + 1] : 0;
  int offset = 1;
  for (int d = PER_BLOCK / 2; d > 0; d /= 2) {
    __syncthreads();
    if (t < d) {
      int ai = offset * (2 * t + 1) - 1, bi = offset * (2 * t + 2) - 1;
      s[bi] += s[ai];
    }
    offset *= 2;
  }
  if (t == 0) {
    if (sums) sums[blockIdx.x] = s[PER_BLOCK - 1];
    s[PER_BLOCK - 1] = 0;
  }
  for (int d = 1; d < PER_BLOCK; d *= 2) {
    offset /= 2;
    __syncthreads();
    if (t < d) {
      int ai = offset * (2 * t + 1) - 1, bi = offset * (2 * t + 2) - 1;
      unsigned x = s[ai];
      s[ai] = s[bi];
      s[bi] += x;
    }
  }
  __syncthreads();
  if (base + 2 * t < n) out[base + 2 * t] = s[2 * t];
  if (base + 2 * t + 1 < n) out[base + 2 * t + 1] = s[2 * t + 1];
}

__global__ void add_offsets(unsigned *out, const unsigned *offsets, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] += offsets[i / PER_BLOCK];
}

// Exclusive scan of d_in (n elements) into d_out, in place allowed; recursive over block sums.
static void scan(const unsigned *d_in, unsigned *d_out, size_t n) {
  size_t blocks = (n + PER_BLOCK - 1) / PER_BLOCK;
  unsigned *sums = nullptr;
  if (blocks > 1) CK(cudaMalloc(&sums, blocks * sizeof(unsigned)));
  scan_blocks<<<(unsigned)blocks, THREADS>>>(d_in, d_out, sums, n);
  CK_LAUNCH("scan_blocks");
  if (blocks > 1) {
    scan(sums, sums, blocks);
    add_offsets<<<(unsigned)((n + 255) / 256), 256>>>(d_out, sums, n);
    CK_LAUNCH("add_offsets");
    CK(cudaFree(sums));
  }
}

int main(int argc, char **argv) {
  bool large = apps::large_size("scan", argc, argv);
  size_t n = large ? ((size_t)1 << 25) + 12345 : 40000;  // not a multiple of a block
  int reps = large ? 20 : 1;
  apps::params("n=%zu reps=%d", n, reps);
  std::vector<unsigned> in(n), out(n);
  apps::Rng rng(4);
  for (auto &x : in) x = (unsigned)rng.next();
  unsigned *din, *dout;
  CK(cudaMalloc(&din, n * sizeof(unsigned)));
  CK(cudaMalloc(&dout, n * sizeof(unsigned)));
  CK(cudaMemcpy(din, in.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  apps::GpuTimer t;
  t.start();
  for (int r = 0; r < reps; r++) scan(din, dout, n);
  t.stop();
  CK(cudaMemcpy(out.data(), dout, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  apps::tamper(out.data(), n * sizeof(unsigned));
  unsigned acc = 0;
  for (size_t i = 0; i < n; i++) {
    if (out[i] != acc) apps::fail(1, "out[%zu]=%u want %u", i, out[i], acc);
    acc += in[i];
  }
  CK(cudaFree(din));
  CK(cudaFree(dout));
  return apps::pass(apps::fnv(out.data(), n * sizeof(unsigned)), t.total_ms);
}
