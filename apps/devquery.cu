// What programs ask the runtime about the device and its errors, as deviceQuery-style code and
// Rodinia's set-up do: cudaGetDeviceCount / SetDevice / GetDevice / SetDeviceFlags,
// cudaGetDeviceProperties checked against cudaDeviceGetAttribute, cudaMemGetInfo,
// cudaFuncGetAttributes (a kernel's static shared memory), cudaOccupancy...WithFlags; error
// handling: a launch with too many threads per block fails (cudaErrorInvalidValue from CUDA 13's
// runtime, cudaErrorInvalidConfiguration from older ones), reported once by cudaGetLastError (then cleared; cudaPeekAtLastError does not clear), an
// impossible cudaMalloc fails with cudaErrorMemoryAllocation without poisoning the context,
// cudaFree(nullptr) succeeds. Then a grid sized from the occupancy computes block sums that are
// checked exactly.
#include "common.h"

#include <vector>

constexpr int THREADS = 256;

__global__ void block_sums(const int *in, int *out, int n) {
  __shared__ int s[THREADS];  // 1024 bytes of static shared memory
  int sum = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) sum += in[i];
  s[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

static int attr(cudaDeviceAttr a, int dev) {
  int v = -1;
  CK(cudaDeviceGetAttribute(&v, a, dev));
  return v;
}

int main(int argc, char **argv) {
  bool large = apps::large_size("devquery", argc, argv);
  int n = large ? 1 << 26 : 20000;
  apps::params("n=%d", n);
  int count = 0, dev = -1;
  CK(cudaGetDeviceCount(&count));
  if (count < 1) apps::fail(1, "cudaGetDeviceCount: %d devices", count);
  // Flags first, before the device's context exists (what programs do).
  CK(cudaSetDeviceFlags(cudaDeviceScheduleAuto));
  CK(cudaSetDevice(0));
  CK(cudaGetDevice(&dev));
  if (dev != 0) apps::fail(1, "cudaGetDevice: %d after cudaSetDevice(0)", dev);

  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  int sms = attr(cudaDevAttrMultiProcessorCount, 0), major = attr(cudaDevAttrComputeCapabilityMajor, 0),
      minor = attr(cudaDevAttrComputeCapabilityMinor, 0), warp = attr(cudaDevAttrWarpSize, 0),
      maxt = attr(cudaDevAttrMaxThreadsPerBlock, 0), clock = attr(cudaDevAttrClockRate, 0),
      smem = attr(cudaDevAttrMaxSharedMemoryPerBlock, 0);
  if (p.name[0] == 0 || p.totalGlobalMem == 0) apps::fail(1, "properties: no name or no memory");
  if (p.multiProcessorCount != sms || p.major != major || p.minor != minor || p.warpSize != warp ||
      p.maxThreadsPerBlock != maxt || (int)p.sharedMemPerBlock != smem)
    apps::fail(1, "properties (sms %d cc %d.%d warp %d threads %d smem %zu) differ from attributes "
               "(%d %d.%d %d %d %d)", p.multiProcessorCount, p.major, p.minor, p.warpSize,
               p.maxThreadsPerBlock, p.sharedMemPerBlock, sms, major, minor, warp, maxt, smem);
  if (warp != 32 || maxt < 256 || sms < 1 || major < 1 || clock <= 0 || smem < 16384)
    apps::fail(1, "implausible device: warp %d threads %d sms %d cc %d clock %d kHz smem %d", warp,
               maxt, sms, major, clock, smem);
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  if (total_b == 0 || free_b > total_b) apps::fail(1, "cudaMemGetInfo: free %zu total %zu", free_b, total_b);

  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, block_sums));
  if (fa.sharedSizeBytes != THREADS * sizeof(int) || fa.maxThreadsPerBlock < THREADS)
    apps::fail(1, "cudaFuncGetAttributes: shared %zu bytes (want %zu), max threads %d",
               fa.sharedSizeBytes, THREADS * sizeof(int), fa.maxThreadsPerBlock);
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&per_sm, block_sums, THREADS, 0, cudaOccupancyDefault));
  if (per_sm < 1) apps::fail(1, "occupancy: %d blocks per SM", per_sm);

  // Errors a program handles.
  int *din, *dout;
  CK(cudaMalloc(&din, n * sizeof(int)));
  // NVIDIA's CUDA 13 runtime reports the driver's CUDA_ERROR_INVALID_VALUE for a block over the
  // limit (cudaErrorInvalidValue); older runtimes said cudaErrorInvalidConfiguration. Either is
  // right; what matters is that the launch fails, the error is reported once and then cleared,
  // and the next valid launch works.
  block_sums<<<1, 4096>>>(din, din, 0);
  cudaError_t e = cudaPeekAtLastError();
  if (e != cudaErrorInvalidValue && e != cudaErrorInvalidConfiguration)
    apps::fail(1, "a 4096-thread block: %s, want cudaErrorInvalidValue or cudaErrorInvalidConfiguration",
               cudaGetErrorName(e));
  const cudaError_t launch_error = e;
  if ((e = cudaGetLastError()) != launch_error)
    apps::fail(1, "cudaGetLastError after cudaPeekAtLastError: %s, want %s", cudaGetErrorName(e),
               cudaGetErrorName(launch_error));
  if ((e = cudaGetLastError()) != cudaSuccess) apps::fail(1, "the error was not cleared: %s", cudaGetErrorName(e));
  if ((e = cudaPeekAtLastError()) != cudaSuccess) apps::fail(1, "the error came back: %s", cudaGetErrorName(e));
  if (strcmp(cudaGetErrorName(launch_error), launch_error == cudaErrorInvalidValue
                                                 ? "cudaErrorInvalidValue"
                                                 : "cudaErrorInvalidConfiguration") != 0)
    apps::fail(1, "cudaGetErrorName: %s", cudaGetErrorName(launch_error));
  void *huge = nullptr;
  if ((e = cudaMalloc(&huge, (size_t)1 << 52)) != cudaErrorMemoryAllocation)
    apps::fail(1, "a 4 PiB cudaMalloc: %s, want cudaErrorMemoryAllocation", cudaGetErrorName(e));
  cudaGetLastError();  // the failed allocation's error, not sticky
  CK(cudaFree(nullptr));

  int blocks = per_sm * sms;
  apps::params("n=%d sms=%d cc=%d.%d blocks/sm=%d", n, sms, major, minor, per_sm);
  std::vector<int> in(n), out(blocks);
  apps::Rng rng(17);
  for (auto &x : in) x = (int)rng.below(2001) - 1000;
  CK(cudaMalloc(&dout, blocks * sizeof(int)));
  CK(cudaMemcpy(din, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  apps::GpuTimer t;
  t.start();
  block_sums<<<blocks, THREADS>>>(din, dout, n);
  CK_LAUNCH("block_sums");
  t.stop();
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(out.data(), dout, blocks * sizeof(int), cudaMemcpyDeviceToHost));
  apps::tamper(out.data(), blocks * sizeof(int));
  for (int b = 0; b < blocks; b++) {
    int want = 0;
    for (int t0 = b * THREADS; t0 < n; t0 += blocks * THREADS)
      for (int i = t0; i < t0 + THREADS && i < n; i++) want += in[i];
    if (out[b] != want) apps::fail(1, "block %d: sum %d want %d", b, out[b], want);
  }
  CK(cudaFree(din));
  CK(cudaFree(dout));
  return apps::pass(apps::fnv(out.data(), blocks * sizeof(int)), t.total_ms);
}
