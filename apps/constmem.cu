// `__constant__` and `__device__` variables: a 1D convolution whose 33 filter taps live in
// constant memory (set with cudaMemcpyToSymbol at an offset, in two parts), a constant table
// with a static initializer (placed and initialised from the module, never copied by the
// program), and a `__device__` counter read back with cudaMemcpyFromSymbol and through
// cudaGetSymbolAddress. Checked against the CPU (floats with a tolerance, the counter exactly).
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
  const float limit = 4.0f;
  apps::params("n=%d taps=%d reps=%d", n, TAPS, reps);
  std::vector<float> in(n), taps(TAPS), out(n);
  apps::Rng rng(15);
  for (auto &x : in) x = rng.uniform(0, 2);
  float norm = 0;
  for (int k = 0; k < TAPS; k++) norm += taps[k] = 1.0f + (float)(RADIUS - std::abs(k - RADIUS));
  for (auto &x : taps) x /= norm;
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
  for (int r = 0; r < reps; r++) convolve<<<(n + 255) / 256, 256>>>(din, dout, n, limit);
  CK_LAUNCH("convolve");
  t.stop();
  CK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
  apps::tamper(out.data(), n * sizeof(float));
  CK(cudaMemcpyFromSymbol(&clamped, d_clamped, sizeof clamped));
  unsigned long long via_address = 0;
  CK(cudaMemcpy(&via_address, counter, sizeof via_address, cudaMemcpyDeviceToHost));

  const int gain[4] = {1, 2, 3, 5};
  unsigned long long want_clamped = 0;
  for (int i = 0; i < n; i++) {
    double acc = 0;
    for (int k = -RADIUS; k <= RADIUS; k++) acc += (double)taps[k + RADIUS] * in[std::min(std::max(i + k, 0), n - 1)];
    acc *= gain[i & 3];
    if (acc > limit + 1e-4) {  // clearly clamped
      if (out[i] != limit) apps::fail(1, "out[%d]=%.7g want the limit %g", i, out[i], limit);
      want_clamped++;
    } else if (acc < limit - 1e-4) {  // clearly not
      if (!apps::approx(out[i], acc, 1e-5, 1e-6)) apps::fail(1, "out[%d]=%.7g want %.7g", i, out[i], acc);
    } else {  // within float rounding of the limit: either way, as the GPU counted it
      if (out[i] > limit || !apps::approx(out[i], std::min(acc, (double)limit), 1e-5, 1e-6))
        apps::fail(1, "out[%d]=%.7g want about %.7g", i, out[i], acc);
      want_clamped += out[i] == limit;
    }
  }
  want_clamped *= reps;
  if (clamped != want_clamped || via_address != clamped)
    apps::fail(1, "clamped %llu (through its address %llu) want %llu", clamped, via_address, want_clamped);
  CK(cudaFree(din));
  CK(cudaFree(dout));
  return apps::pass(apps::fnv(out.data(), n * sizeof(float)) ^ clamped, t.total_ms);
}
