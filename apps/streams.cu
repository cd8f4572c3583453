// Streams overlapping copies and kernels: the input, in pinned host memory (cudaMallocHost, and
// cudaHostAlloc for the output), is cut into chunks; each chunk's copy in, kernel and copy out
// go on one of S streams (cudaMemcpyAsync), so one chunk's copies overlap another's kernel.
// The same work is first run serially on the default stream; events time both (their ratio is
// printed, not asserted: a software GPU need not overlap). Also: a stream created with
// cudaStreamNonBlocking, cudaEventQuery polling, cudaStreamWaitEvent, a pageable buffer
// registered with cudaHostRegister, cudaMemsetAsync, cudaProfilerStart/Stop. The kernel's
// integer hash rounds are checked exactly against the CPU.
#include "common.h"

#include <cuda_profiler_api.h>

#include <vector>

__host__ __device__ inline unsigned mix(unsigned x, int rounds) {
  for (int r = 0; r < rounds; r++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x = x * 2654435761u + (unsigned)r;
  }
  return x;
}

__global__ void work(const unsigned *in, unsigned *out, size_t n, int rounds) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = mix(in[i], rounds);
}

int main(int argc, char **argv) {
  bool large = apps::large_size("streams", argc, argv);
  const int S = 4;
  int chunks = large ? 32 : 4, rounds = large ? 16 : 4;  // large: the CPU check ~1 s
  size_t chunk = large ? (size_t)1 << 20 : 2048, n = chunk * chunks, bytes = n * sizeof(unsigned);
  apps::params("n=%zu chunks=%d streams=%d", n, chunks, S);
  unsigned *in, *out, *dev_in, *dev_out;
  CK(cudaMallocHost(&in, bytes));
  CK(cudaHostAlloc(&out, bytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev_in, bytes));
  CK(cudaMalloc(&dev_out, bytes));
  apps::Rng rng(14);
  for (size_t i = 0; i < n; i++) in[i] = (unsigned)rng.next();
  // A pageable buffer made pinned with cudaHostRegister: the last chunk's output goes there too.
  std::vector<unsigned> reg(chunk + 1024);
  CK(cudaHostRegister(reg.data(), reg.size() * sizeof(unsigned), cudaHostRegisterDefault));

  cudaStream_t streams[S];
  for (int s = 0; s < S; s++)
    CK(s == S - 1 ? cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking)
                  : cudaStreamCreate(&streams[s]));
  unsigned blocks = (unsigned)((chunk + 255) / 256);
  CK(cudaProfilerStart());

  // Serial: everything on the default stream.
  apps::GpuTimer serial;
  serial.start();
  CK(cudaMemcpy(dev_in, in, bytes, cudaMemcpyHostToDevice));
  work<<<(unsigned)((n + 255) / 256), 256>>>(dev_in, dev_out, n, rounds);
  CK_LAUNCH("work");
  CK(cudaMemcpy(out, dev_out, bytes, cudaMemcpyDeviceToHost));
  serial.stop();
  std::vector<unsigned> first(out, out + n);

  // Overlapped: chunk c on stream c % S.
  CK(cudaMemset(dev_out, 0, bytes));
  memset(out, 0, bytes);
  cudaEvent_t begin, end, done[S];
  CK(cudaEventCreate(&begin));
  CK(cudaEventCreate(&end));
  for (int s = 0; s < S; s++) CK(cudaEventCreateWithFlags(&done[s], cudaEventDisableTiming));
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(begin, streams[0]));
  for (int s = 1; s < S; s++) CK(cudaStreamWaitEvent(streams[s], begin, 0));
  for (int c = 0; c < chunks; c++) {
    cudaStream_t st = streams[c % S];
    size_t off = (size_t)c * chunk;
    CK(cudaMemsetAsync(dev_out + off, 0xff, chunk * sizeof(unsigned), st));
    CK(cudaMemcpyAsync(dev_in + off, in + off, chunk * sizeof(unsigned), cudaMemcpyHostToDevice, st));
    work<<<blocks, 256, 0, st>>>(dev_in + off, dev_out + off, chunk, rounds);
    CK_LAUNCH("work (stream)");
    CK(cudaMemcpyAsync(out + off, dev_out + off, chunk * sizeof(unsigned), cudaMemcpyDeviceToHost, st));
  }
  CK(cudaMemcpyAsync(reg.data(), dev_out + (chunks - 1) * chunk, chunk * sizeof(unsigned),
                     cudaMemcpyDeviceToHost, streams[(chunks - 1) % S]));
  for (int s = 0; s < S; s++) CK(cudaEventRecord(done[s], streams[s]));
  for (int s = 1; s < S; s++) CK(cudaStreamWaitEvent(streams[0], done[s], 0));
  CK(cudaEventRecord(end, streams[0]));
  // Poll the last event (what a program overlapping CPU work does), then synchronize.
  long polls = 0;
  for (cudaError_t q; (q = cudaEventQuery(end)) != cudaSuccess; polls++)
    if (q != cudaErrorNotReady) CK(q);
  CK(cudaEventSynchronize(end));
  float overlapped_ms = 0;
  CK(cudaEventElapsedTime(&overlapped_ms, begin, end));
  for (int s = 0; s < S; s++) CK(cudaStreamSynchronize(streams[s]));
  CK(cudaProfilerStop());
  apps::tamper(out, bytes);

  for (size_t i = 0; i < n; i++) {
    unsigned want = mix(in[i], rounds);
    if (first[i] != want) apps::fail(1, "serial out[%zu]=%08x want %08x", i, first[i], want);
    if (out[i] != want) apps::fail(1, "streamed out[%zu]=%08x want %08x", i, out[i], want);
  }
  for (size_t i = 0; i < chunk; i++)
    if (reg[i] != out[(chunks - 1) * chunk + i]) apps::fail(1, "registered buffer [%zu] differs", i);
  uint64_t sum = apps::fnv(out, bytes);
  for (int s = 0; s < S; s++) {
    CK(cudaEventDestroy(done[s]));
    CK(cudaStreamDestroy(streams[s]));
  }
  CK(cudaEventDestroy(begin));
  CK(cudaEventDestroy(end));
  CK(cudaHostUnregister(reg.data()));
  CK(cudaFreeHost(in));
  CK(cudaFreeHost(out));
  CK(cudaFree(dev_in));
  CK(cudaFree(dev_out));
  apps::params("n=%zu chunks=%d streams=%d serial_ms=%.3f overlapped_ms=%.3f", n, chunks, S,
               serial.total_ms, overlapped_ms);
  return apps::pass(sum, serial.total_ms + overlapped_ms);
}
