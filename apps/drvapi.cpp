// A driver-API program, as NVIDIA's driver samples are written: cuInit, the device's name,
// memory and attributes, a context (cuCtxCreate), the kernels loaded from a fat binary file
// (drvapi.fatbin, built from drvapi.kernels.cu; found next to the executable, or at
// $APPS_FATBIN) with cuModuleLoadData, a module variable through cuModuleGetGlobal,
// cuOccupancyMaxPotentialBlockSize, launches with cuLaunchKernel and kernelParams (one with
// dynamic shared memory), driver events, cuMemcpyHtoD/DtoH. Plain C++ linked with -lcuda
// (libcuda.so.1) only, no runtime. Checked against the CPU with tolerances (saxpy repeated,
// the per-block sums of squares).
#include <cuda.h>

#define APPS_NO_RUNTIME
#include "common.h"

#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

static void cu_check(CUresult r, const char *what, int line) {
  if (r == CUDA_SUCCESS) return;
  const char *name = "?", *str = "?";
  cuGetErrorName(r, &name);
  cuGetErrorString(r, &str);
  apps::fail(2, "driver error %d %s (%s) in %s at line %d", (int)r, name, str, what, line);
}
#define CU(call) cu_check((call), #call, __LINE__)

static std::string fatbin_path() {
  if (const char *p = getenv("APPS_FATBIN")) return p;
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return "drvapi.fatbin";
  std::string dir(exe, (size_t)len);
  return dir.substr(0, dir.rfind('/') + 1) + "drvapi.fatbin";
}

int main(int argc, char **argv) {
  bool large = apps::large_size("drvapi", argc, argv);
  int n = large ? 1 << 25 : 30000, reps = large ? 40 : 2;  // large: 384 MiB of host memory
  const float a = 1.5f, scale = 2.0f;
  apps::params("n=%d reps=%d", n, reps);

  std::string path = fatbin_path();
  std::ifstream f(path, std::ios::binary);
  if (!f) apps::fail(2, "cannot read %s (set APPS_FATBIN)", path.c_str());
  std::vector<char> image((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());

  CU(cuInit(0));
  int count = 0, major = 0, sms = 0;
  CU(cuDeviceGetCount(&count));
  if (count < 1) apps::fail(2, "no CUDA device");
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  char name[256] = {0};
  size_t total = 0;
  CU(cuDeviceGetName(name, sizeof name, dev));
  CU(cuDeviceTotalMem(&total, dev));
  CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  if (name[0] == 0 || total == 0 || major < 1 || sms < 1)
    apps::fail(1, "device 0: name '%s' memory %zu cc %d sms %d", name, total, major, sms);
  CUcontext ctx;
  CU(cuCtxCreate(&ctx, nullptr, 0, dev));

  CUmodule mod;
  CU(cuModuleLoadData(&mod, image.data()));
  CUfunction saxpy, sum_squares;
  CU(cuModuleGetFunction(&saxpy, mod, "saxpy"));
  CU(cuModuleGetFunction(&sum_squares, mod, "sum_squares"));
  CUdeviceptr g_scale;
  size_t g_size = 0;
  CU(cuModuleGetGlobal(&g_scale, &g_size, mod, "g_scale"));
  float initial = 0;
  CU(cuMemcpyDtoH(&initial, g_scale, sizeof initial));
  if (g_size != sizeof(float) || initial != 1.0f)
    apps::fail(1, "g_scale: %zu bytes, value %g (want 4 bytes, 1)", g_size, initial);
  CU(cuMemcpyHtoD(g_scale, &scale, sizeof scale));

  int min_grid = 0, block = 0;
  CU(cuOccupancyMaxPotentialBlockSize(&min_grid, &block, saxpy, nullptr, 0, 0));
  if (block < 32 || block > 1024 || min_grid < 1)
    apps::fail(1, "occupancy: block %d grid %d", block, min_grid);
  const int rblock = 256;  // sum_squares needs a power of two
  int grid = (n + block - 1) / block, rgrid = (n + rblock - 1) / rblock;

  std::vector<float> x(n), y(n), got(n), partial(rgrid);
  apps::Rng rng(16);
  for (auto &v : x) v = rng.uniform(-1, 1);
  for (auto &v : y) v = rng.uniform(-1, 1);
  CUdeviceptr dx, dy, dpart;
  CU(cuMemAlloc(&dx, n * sizeof(float)));
  CU(cuMemAlloc(&dy, n * sizeof(float)));
  CU(cuMemAlloc(&dpart, rgrid * sizeof(float)));
  CU(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
  CU(cuMemcpyHtoD(dy, y.data(), n * sizeof(float)));

  CUevent start, stop;
  CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
  CU(cuEventCreate(&stop, CU_EVENT_DEFAULT));
  CU(cuEventRecord(start, nullptr));
  float av = a;
  for (int r = 0; r < reps; r++) {
    void *params[] = {&av, &dx, &dy, &n};
    CU(cuLaunchKernel(saxpy, grid, 1, 1, block, 1, 1, 0, nullptr, params, nullptr));
  }
  void *rparams[] = {&dy, &dpart, &n};
  CU(cuLaunchKernel(sum_squares, rgrid, 1, 1, rblock, 1, 1, rblock * sizeof(float), nullptr, rparams, nullptr));
  CU(cuEventRecord(stop, nullptr));
  CU(cuEventSynchronize(stop));
  float ms = 0;
  CU(cuEventElapsedTime(&ms, start, stop));
  CU(cuCtxSynchronize());
  CU(cuMemcpyDtoH(got.data(), dy, n * sizeof(float)));
  apps::tamper(got.data(), n * sizeof(float));
  CU(cuMemcpyDtoH(partial.data(), dpart, rgrid * sizeof(float)));

  for (int i = 0; i < n; i++) {
    double want = y[i];
    for (int r = 0; r < reps; r++) want += (double)a * scale * x[i];
    if (!apps::approx(got[i], want, 1e-5, 1e-5)) apps::fail(1, "y[%d]=%.7g want %.7g", i, got[i], want);
  }
  for (int b = 0; b < rgrid; b++) {
    double want = 0;
    for (int i = b * rblock; i < n && i < (b + 1) * rblock; i++) want += (double)got[i] * got[i];
    if (!apps::approx(partial[b], want, 1e-5, 1e-6))
      apps::fail(1, "partial[%d]=%.7g want %.7g", b, partial[b], want);
  }
  CU(cuEventDestroy(start));
  CU(cuEventDestroy(stop));
  CU(cuMemFree(dx));
  CU(cuMemFree(dy));
  CU(cuMemFree(dpart));
  CU(cuModuleUnload(mod));
  CU(cuCtxDestroy(ctx));
  apps::params("n=%d reps=%d block=%d", n, reps, block);
  return apps::pass(apps::fnv(got.data(), n * sizeof(float)), ms);
}
