// What every program of the application suite shares: the size argument, checked CUDA calls,
// a seeded random generator, event timing and the one verdict line.
//
// A program is run as `PROG [small|large]` (or with APPS_SIZE=small|large in the environment;
// small is the default): small keeps the GPU work of a program well under a second on the
// project's PTX interpreter (CI on the software GPU), large gives an H100 tens of milliseconds to
// seconds of kernels. Every program prints exactly one verdict line on stdout,
//   NAME PARAMS: PASS checksum=0x... gpu_ms=...
// (or FAIL with the reason) and exits 0 only on PASS: 1 on a mismatch with its CPU reference,
// 2 on a CUDA error or a bad argument.
// A driver-API program (plain C++, no runtime) defines APPS_NO_RUNTIME before including this:
// it then gets everything but the runtime's checked calls and timer.
#pragma once

#ifndef APPS_NO_RUNTIME
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace apps {

inline const char *g_name = "app";
inline std::string g_params;

// Prints the FAIL verdict and exits with `code`.
[[noreturn]] inline void fail(int code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("%s %s: FAIL %s\n", g_name, g_params.c_str(), msg);
  fflush(stdout);
  exit(code);
}

#ifndef APPS_NO_RUNTIME
inline void check(cudaError_t e, const char *what, const char *file, int line) {
  if (e != cudaSuccess)
    fail(2, "cuda error %s (%s) in %s at %s:%d", cudaGetErrorName(e), cudaGetErrorString(e), what,
         file, line);
}
#endif

// The size chosen by argv[1] or APPS_SIZE: true for large. Sets the program's name.
inline bool large_size(const char *name, int argc, char **argv) {
  g_name = name;
  const char *s = argc > 1 ? argv[1] : getenv("APPS_SIZE");
  if (s == nullptr || *s == 0 || strcmp(s, "small") == 0) return false;
  if (strcmp(s, "large") == 0) return true;
  fprintf(stderr, "usage: %s [small|large]   (or APPS_SIZE=small|large)\n", name);
  fail(2, "unknown size '%s'", s);
}

// Sets the PARAMS part of the verdict line (e.g. "n=256").
inline void params(const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_params = buf;
}

// The PASS verdict; returns main's exit status.
inline int pass(uint64_t checksum, double gpu_ms) {
  printf("%s %s: PASS checksum=0x%016llx gpu_ms=%.3f\n", g_name, g_params.c_str(),
         (unsigned long long)checksum, gpu_ms);
  fflush(stdout);
  return 0;
}

// The suite's test of its own checks: with APPS_TAMPER=1 in the environment a program corrupts
// one value of its GPU result (a high bit of the 32-bit word in the middle of the buffer: an
// integer off by 2^30, a float's exponent changed) before comparing it with the CPU's, and must
// then print FAIL and exit 1. Without it, nothing happens.
inline void tamper(void *p, size_t bytes) {
  const char *t = getenv("APPS_TAMPER");
  if (t == nullptr || strcmp(t, "1") != 0 || bytes < 4) return;
  size_t word = (bytes / 2) & ~(size_t)3;
  ((unsigned char *)p)[word + 3] ^= 0x40;
}

// splitmix64: small, seeded, the same sequence everywhere.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((next() >> 40) * (1.0 / 16777216.0));
  }
};

// FNV-1a over bytes: the checksum of a result buffer.
inline uint64_t fnv(const void *p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

#ifndef APPS_NO_RUNTIME
// Elapsed GPU time between two events, accumulated over several intervals.
struct GpuTimer {
  cudaEvent_t a, b;
  double total_ms = 0;
  GpuTimer() {
    check(cudaEventCreate(&a), "cudaEventCreate", __FILE__, __LINE__);
    check(cudaEventCreate(&b), "cudaEventCreate", __FILE__, __LINE__);
  }
  void start(cudaStream_t s = 0) { check(cudaEventRecord(a, s), "cudaEventRecord", __FILE__, __LINE__); }
  void stop(cudaStream_t s = 0) {
    check(cudaEventRecord(b, s), "cudaEventRecord", __FILE__, __LINE__);
    check(cudaEventSynchronize(b), "cudaEventSynchronize", __FILE__, __LINE__);
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime", __FILE__, __LINE__);
    total_ms += ms;
  }
  ~GpuTimer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};
#endif

// |got - want| <= abs + rel * |want|
inline bool approx(double got, double want, double rel, double abs) {
  return std::isfinite(got) && std::fabs(got - want) <= abs + rel * std::fabs(want);
}

}  // namespace apps

#ifndef APPS_NO_RUNTIME
// Every CUDA call is checked: a failure prints the FAIL verdict with the call and exits 2.
#define CK(call) ::apps::check((call), #call, __FILE__, __LINE__)
// After a launch: the launch's own error (configuration) and, when sync, the kernel's.
#define CK_LAUNCH(what) ::apps::check(cudaGetLastError(), what, __FILE__, __LINE__)
#endif
