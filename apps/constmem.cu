// `__constant__` and `__device__` variables: a 1D convolution whose 33 filter taps live in
// constant memory (set with cudaMemcpyToSymbol at an offset, in two parts), a constant table
// with a static initializer (placed and initialised from the module, never copied by the
// program), and a `__device__` counter read back with cudaMemcpyFromSymbol and through
// cudaGetSymbolAddress. The data and taps are small integers held in floats, so every partial
// sum is an integer below 2^24 and the float arithmetic is exact in any order (with or without
// FMA): the GPU's outputs and clamp count are checked for equality with the CPU's integer
// arithmetic at every size (a tolerance would leave outputs at the clamp limit undecided).
#include "common.h"

#include <vector>

constexpr int RADIUS = 16, TAPS = 2 * RADIUS + 1;

__constant__ float c_taps[TAPS];
__constant__ int c_gain[4] = {1, 2, 3, 5};  // initialised by the module itself
__device__ unsigned long long d_clamped;    // how many outputs the kernel clamped

__global__ void convolve(const float *in, float *out, int n, float limit) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.0f;
  for (int k = -RADIUS; k <= RADIUS; k++) {
    int j = min(max(i + k, 0), n - 1);
    acc += c_taps[k + RADIUS] * in[j];
  }
  acc *= (float)c_gain[i & 3];
  if (acc > limit) {
    acc = limit;
    atomicAdd(&d_clamped, 1ull);
  }
  out[i] = acc;
}

int main(int argc, char **argv) {
  bool large = apps::large_size("constmem", argc, argv);
  int n = large ? 1 << 25 : 20000, reps = large ? 20 : 1;
  // Inputs 0..1023, taps 1..17 (sum 289), gains up to 5: |acc| <= 289 * 1023 * 5 < 2^24.
  const int limit = 600000;  // clamps most outputs of gain 5, few of gain 3
  apps::params("n=%d taps=%d reps=%d", n, TAPS, reps);
  std::vector<float> in(n), taps(TAPS), out(n);
  apps::Rng rng(15);
  for (auto &x : in) x = (float)rng.below(1024);
  for (int k = 0; k < TAPS; k++) taps[k] = (float)(RADIUS + 1 - std::abs(k - RADIUS));
  // In two parts: the second at an offset into the symbol.
  CK(cudaMemcpyToSymbol(c_taps, taps.data(), RADIUS * sizeof(float)));
  CK(cudaMemcpyToSymbol(c_taps, taps.data() + RADIUS, (TAPS - RADIUS) * sizeof(float),
                        RADIUS * sizeof(float)));
  unsigned long long zero = 0, clamped = 0, *counter = nullptr;
  CK(cudaMemcpyToSymbol(d_clamped, &zero, sizeof zero));
  CK(cudaGetSymbolAddress((void **)&counter, d_clamped));

  float *din, *dout;
  CK(cudaMalloc(&din, n * sizeof(float)));
  CK(cudaMalloc(&dout, n * sizeof(float)));
  CK(cudaMemcpy(din, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  apps::GpuTimer t;
  t.start();
  for (int r = 0; r < reps; r++) convolve<<<(n + 255) / 256, 256>>>(din, dout, n, (float)limit);
  CK_LAUNCH("convolve");
  t.stop();
  CK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
  apps::tamper(out.data(), n * sizeof(float));
  CK(cudaMemcpyFromSymbol(&clamped, d_clamped, sizeof clamped));
  unsigned long long via_address = 0;
  CK(cudaMemcpy(&via_address, counter, sizeof via_address, cudaMemcpyDeviceToHost));

  // The same sums in integers (exact).
  const int gain[4] = {1, 2, 3, 5};
  std::vector<int> itaps(TAPS);
  for (int k = 0; k < TAPS; k++) itaps[k] = (int)taps[k];
  unsigned long long want_clamped = 0;
  for (int i = 0; i < n; i++) {
    int acc = 0;
    if (i >= RADIUS && i < n - RADIUS) {
      for (int k = 0; k < TAPS; k++) acc += itaps[k] * (int)in[i - RADIUS + k];
    } else {
      for (int k = -RADIUS; k <= RADIUS; k++) acc += itaps[k + RADIUS] * (int)in[std::min(std::max(i + k, 0), n - 1)];
    }
    acc *= gain[i & 3];
    if (acc > limit) {
      acc = limit;
      want_clamped++;
    }
    if (out[i] != (float)acc) apps::fail(1, "out[%d]=%.9g want %d", i, out[i], acc);
  }
  want_clamped *= reps;
  if (clamped != want_clamped || via_address != clamped)
    apps::fail(1, "clamped %llu (through its address %llu) want %llu", clamped, via_address, want_clamped);
  CK(cudaFree(din));
  CK(cudaFree(dout));
  return apps::pass(apps::fnv(out.data(), n * sizeof(float)) ^ clamped, t.total_ms);
}
