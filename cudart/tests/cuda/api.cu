// The runtime API beyond launches: devices and properties, streams and events, asynchronous
// copies and sets from page-locked memory, kernel attributes and occupancy, error values and
// last-error semantics, refusal of unknown handles, an unimplemented function. Prints
// "api ok" and exits 0 when everything behaves as CUDA documents.
#include <cstdio>
#include <cstring>

__global__ void fill(int *p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("FAIL %s: %s (%s)\n", #x, cudaGetErrorName(e), cudaGetErrorString(e)); return 1; } } while (0)
#define EXPECT(x, want) do { cudaError_t e = (x); if (e != (want)) { \
  printf("FAIL %s: %s, expected %s\n", #x, cudaGetErrorName(e), cudaGetErrorName(want)); return 1; } } while (0)

int main() {
  int count = 0, dev = -1, rt = 0, drv = 0;
  CHECK(cudaGetDeviceCount(&count));
  CHECK(cudaSetDevice(0));
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaRuntimeGetVersion(&rt));
  CHECK(cudaDriverGetVersion(&drv));
  cudaDeviceProp prop;
  memset(&prop, 0xff, sizeof prop);
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int sms = 0, major = 0, warp = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CHECK(cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, 0));
  if (count < 1 || dev != 0 || rt != 13000 || prop.major != major || prop.multiProcessorCount != sms ||
      prop.warpSize != 32 || warp != 32 || prop.totalGlobalMem == 0 || prop.name[0] == 0 ||
      strnlen(prop.name, 256) == 256 || prop.maxThreadsPerBlock < 256) {
    printf("FAIL properties: count %d dev %d rt %d name '%.32s' cc %d.%d sms %d/%d warp %d mem %zu\n", count, dev, rt,
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, sms, prop.warpSize, prop.totalGlobalMem);
    return 1;
  }
  EXPECT(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT(cudaGetDeviceProperties(&prop, -1), cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError(), cudaSuccess);

  const int n = 1 << 16;
  int *h = nullptr, *d = nullptr;
  CHECK(cudaMallocHost(&h, n * sizeof(int)));
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  cudaStream_t s;
  cudaEvent_t start, stop;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreateWithFlags(&stop, cudaEventDefault));
  CHECK(cudaEventRecord(start, s));
  CHECK(cudaMemsetAsync(d, 0, n * sizeof(int), s));
  fill<<<n / 256, 256, 0, s>>>(d, n, 7);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaEventRecord(stop, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaEventSynchronize(stop));
  CHECK(cudaEventQuery(stop));
  CHECK(cudaStreamQuery(s));
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  for (int i = 0; i < n; i++)
    if (h[i] != 7 + i) { printf("FAIL h[%d]=%d\n", i, h[i]); return 1; }
  if (!(ms >= 0)) { printf("FAIL elapsed %f\n", ms); return 1; }

  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, fill));
  int blocks = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fill, 256, 0));
  if (fa.maxThreadsPerBlock < 256 || blocks < 1) { printf("FAIL func attrs %d occupancy %d\n", fa.maxThreadsPerBlock, blocks); return 1; }

  // What libraries use: stream-ordered allocation, callbacks, capture status, 2D copies, PCI id.
  int *da = nullptr, called = 0;
  CHECK(cudaMallocAsync((void **)&da, 4096, s));
  CHECK(cudaMemcpy2D(da, 64, h, 16, 16, 8, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy2DAsync(h + 1024, 32, da, 64, 16, 8, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamAddCallback(s, [](cudaStream_t, cudaError_t e, void *p) { *(int *)p = e == cudaSuccess ? 1 : -1; }, &called, 0));
  CHECK(cudaFreeAsync(da, s));
  CHECK(cudaStreamSynchronize(s));
  for (int r = 0; r < 8; r++)
    for (int i = 0; i < 4; i++)
      if (h[1024 + r * 8 + i] != h[r * 4 + i]) { printf("FAIL 2D copy row %d\n", r); return 1; }
  if (called != 1) { printf("FAIL callback %d\n", called); return 1; }
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
  CHECK(cudaStreamIsCapturing(s, &cs));
  char bus[32] = {0};
  CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
  if (cs != cudaStreamCaptureStatusNone || strlen(bus) < 7) { printf("FAIL capture %d bus '%s'\n", (int)cs, bus); return 1; }

  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (total_b == 0 || free_b > total_b) { printf("FAIL meminfo %zu/%zu\n", free_b, total_b); return 1; }

  // Errors: CUDA's values, recorded as the last error, not sticky.
  EXPECT(cudaMemcpy(h, d, 4, (cudaMemcpyKind)9), cudaErrorInvalidMemcpyDirection);
  EXPECT(cudaStreamSynchronize((cudaStream_t)0x1234), cudaErrorInvalidResourceHandle);
  EXPECT(cudaEventRecord((cudaEvent_t)0x5678, 0), cudaErrorInvalidResourceHandle);
  EXPECT(cudaPeekAtLastError(), cudaErrorInvalidResourceHandle);
  EXPECT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT(cudaGetLastError(), cudaSuccess);
  void *huge = nullptr;
  EXPECT(cudaMalloc(&huge, (size_t)1 << 60), cudaErrorMemoryAllocation);
  cudaGetLastError();
  fill<<<1, 0>>>(d, n, 1);
  EXPECT(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // An unimplemented function: cudaErrorNotSupported, named once on stderr.
  cudaGraph_t g;
  EXPECT(cudaGraphCreate(&g, 0), cudaErrorNotSupported);
  EXPECT(cudaGraphCreate(&g, 0), cudaErrorNotSupported);
  cudaGetLastError();
  if (strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument") ||
      strcmp(cudaGetErrorName(cudaErrorNotSupported), "cudaErrorNotSupported")) { printf("FAIL strings\n"); return 1; }

  CHECK(cudaEventDestroy(start)); CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(s));
  EXPECT(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  CHECK(cudaFreeHost(h)); CHECK(cudaFree(d));
  CHECK(cudaDeviceSynchronize());
  printf("api ok\n");
  return 0;
}
