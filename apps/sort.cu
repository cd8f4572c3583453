// Bitonic sort of n = 2^m 32-bit keys carrying 32-bit values (key-value pairs): the merge steps
// whose partner is within a block run in shared memory (one launch for all of them), the wider
// ones as one launch per step over global memory. Checked against std::sort's keys and
// the multiset of pairs (each value is its original index).
#include "common.h"

#include <algorithm>
#include <vector>

constexpr int THREADS = 512, SHARED = 2 * THREADS;  // elements per block in shared memory

__device__ inline void cmp_swap(unsigned &ka, unsigned &va, unsigned &kb, unsigned &vb, bool up) {
  if ((ka > kb) == up) {
    unsigned k = ka; ka = kb; kb = k;
    unsigned v = va; va = vb; vb = v;
  }
}

// Steps of stage `size` with stride < SHARED, inside one block's 1024 elements. When size <=
// SHARED the whole sort up to that size happens here (start_size = 2).
__global__ void bitonic_shared(unsigned *keys, unsigned *vals, unsigned start_size, unsigned end_size,
                               unsigned first_stride) {
  __shared__ unsigned sk[SHARED], sv[SHARED];
  size_t base = (size_t)blockIdx.x * SHARED;
  for (int i = threadIdx.x; i < SHARED; i += blockDim.x) {
    sk[i] = keys[base + i];
    sv[i] = vals[base + i];
  }
  __syncthreads();
  for (unsigned size = start_size; size <= end_size; size *= 2) {
    for (unsigned stride = size == start_size ? first_stride : size / 2; stride > 0; stride /= 2) {
      unsigned t = threadIdx.x;
      unsigned lo = 2 * t - (t & (stride - 1));  // t's pair: lo and lo + stride
      size_t global = base + lo;
      bool up = (global & size) == 0;
      cmp_swap(sk[lo], sv[lo], sk[lo + stride], sv[lo + stride], up);
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < SHARED; i += blockDim.x) {
    keys[base + i] = sk[i];
    vals[base + i] = sv[i];
  }
}

// One step (size, stride >= SHARED) over global memory: thread t handles one pair.
__global__ void bitonic_global(unsigned *keys, unsigned *vals, size_t size, size_t stride, size_t n) {
  size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (t >= n / 2) return;
  size_t lo = 2 * t - (t & (stride - 1));
  bool up = (lo & size) == 0;
  unsigned ka = keys[lo], kb = keys[lo + stride], va = vals[lo], vb = vals[lo + stride];
  cmp_swap(ka, va, kb, vb, up);
  keys[lo] = ka, keys[lo + stride] = kb, vals[lo] = va, vals[lo + stride] = vb;
}

int main(int argc, char **argv) {
  bool large = apps::large_size("sort", argc, argv);
  size_t n = large ? (size_t)1 << 24 : (size_t)1 << 12;
  apps::params("n=%zu", n);
  std::vector<unsigned> keys(n), vals(n);
  apps::Rng rng(13);
  for (size_t i = 0; i < n; i++) {
    keys[i] = (unsigned)rng.next() % (unsigned)(n * 4);  // duplicates likely
    vals[i] = (unsigned)i;
  }
  unsigned *dk, *dv;
  CK(cudaMalloc(&dk, n * sizeof(unsigned)));
  CK(cudaMalloc(&dv, n * sizeof(unsigned)));
  CK(cudaMemcpy(dk, keys.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, vals.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  unsigned blocks = (unsigned)(n / SHARED), pair_blocks = (unsigned)((n / 2 + 255) / 256);
  apps::GpuTimer t;
  t.start();
  bitonic_shared<<<blocks, THREADS>>>(dk, dv, 2, SHARED, 1);
  CK_LAUNCH("bitonic_shared");
  for (size_t size = 2 * SHARED; size <= n; size *= 2) {
    for (size_t stride = size / 2; stride >= SHARED; stride /= 2) {
      bitonic_global<<<pair_blocks, 256>>>(dk, dv, size, stride, n);
      CK_LAUNCH("bitonic_global");
    }
    // The rest of this stage (strides SHARED/2 .. 1) in shared memory.
    bitonic_shared<<<blocks, THREADS>>>(dk, dv, (unsigned)size, (unsigned)size, SHARED / 2);
    CK_LAUNCH("bitonic_shared");
  }
  t.stop();
  std::vector<unsigned> gk(n), gv(n);
  CK(cudaMemcpy(gk.data(), dk, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  apps::tamper(gk.data(), n * sizeof(unsigned));
  CK(cudaMemcpy(gv.data(), dv, n * sizeof(unsigned), cudaMemcpyDeviceToHost));

  std::vector<unsigned> want = keys;
  std::sort(want.begin(), want.end());
  std::vector<char> seen(n, 0);
  for (size_t i = 0; i < n; i++) {
    if (gk[i] != want[i]) apps::fail(1, "key[%zu]=%u want %u", i, gk[i], want[i]);
    if (gv[i] >= n || seen[gv[i]] || keys[gv[i]] != gk[i])
      apps::fail(1, "pair %zu (%u, %u) is not one of the input's", i, gk[i], gv[i]);
    seen[gv[i]] = 1;
  }
  CK(cudaFree(dk));
  CK(cudaFree(dv));
  return apps::pass(apps::fnv(gk.data(), n * sizeof(unsigned)), t.total_ms);
}
