// A two-layer perceptron trained by backpropagation: Y = relu(X W1 + b1) W2 + b2, mean squared
// error against targets from a random linear teacher, plain SGD for a few steps on one batch.
// Kernels: a general matrix product (either operand transposed, optional bias), ReLU and its
// gradient, column sums (bias gradients), the SGD update. Checked against the same training in
// double precision on the CPU: the loss of every step and all weights after the last.
#include "common.h"

#include <vector>

// C[M x N] = op(A)[M x K] * op(B)[K x N] (+ bias[N]); A is M x K (or K x M when ta), B is K x N
// (or N x K when tb), all row-major.
__global__ void gemm(const float *A, const float *B, float *C, const float *bias, int M, int N,
                     int K, int ta, int tb) {
  int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= M || j >= N) return;
  float acc = bias ? bias[j] : 0.0f;
  for (int k = 0; k < K; k++) {
    float a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
    float b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
    acc += a * b;
  }
  C[(size_t)i * N + j] = acc;
}

__global__ void relu(const float *z, float *a, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) a[i] = z[i] > 0.0f ? z[i] : 0.0f;
}

// dZ = dA where Z > 0, else 0 (in place on dA).
__global__ void relu_grad(float *da, const float *z, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n && z[i] <= 0.0f) da[i] = 0.0f;
}

// dY = (Y - T) / rows
__global__ void out_grad(const float *y, const float *t, float *dy, size_t n, int rows) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) dy[i] = (y[i] - t[i]) / (float)rows;
}

__global__ void colsum(const float *m, float *out, int rows, int cols) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (int i = 0; i < rows; i++) s += m[(size_t)i * cols + j];
  out[j] = s;
}

__global__ void sgd(float *w, const float *g, float lr, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) w[i] -= lr * g[i];
}

struct Dims { int B, I, H, O; };

// The same product in double: row i of C accumulated over k from rows of op(B), contiguous and
// vectorizable (a transposed B is transposed once first); each entry's sum is in the order of
// k, as the kernel's. The naive order with strided columns took 10 s at the large size.
static void cpu_gemm(const std::vector<double> &A, const std::vector<double> &Bm,
                     std::vector<double> &C, const std::vector<double> *bias, int M, int N, int K,
                     bool ta, bool tb) {
  std::vector<double> bt;
  const double *B = Bm.data();
  if (tb) {  // B is N x K: make it K x N
    bt.resize((size_t)K * N);
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++) bt[(size_t)k * N + j] = Bm[(size_t)j * K + k];
    B = bt.data();
  }
  for (int i = 0; i < M; i++) {
    double *c = &C[(size_t)i * N];
    for (int j = 0; j < N; j++) c[j] = bias ? (*bias)[j] : 0.0;
    for (int k = 0; k < K; k++) {
      double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
      const double *b = B + (size_t)k * N;
      for (int j = 0; j < N; j++) c[j] += a * b[j];
    }
  }
}

static float *dev(const std::vector<float> &h) {
  float *d;
  CK(cudaMalloc(&d, h.size() * sizeof(float)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}
static float *dev_zero(size_t n) {
  float *d;
  CK(cudaMalloc(&d, n * sizeof(float)));
  CK(cudaMemset(d, 0, n * sizeof(float)));
  return d;
}
static void launch_gemm(const float *A, const float *B, float *C, const float *bias, int M, int N,
                        int K, int ta, int tb) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  gemm<<<grid, block>>>(A, B, C, bias, M, N, K, ta, tb);
  CK_LAUNCH("gemm");
}
static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256); }

int main(int argc, char **argv) {
  bool large = apps::large_size("mlp", argc, argv);
  Dims d = large ? Dims{512, 512, 1024, 128} : Dims{24, 16, 32, 8};
  int steps = large ? 4 : 3;
  const float lr = 0.05f;
  apps::params("batch=%d in=%d hidden=%d out=%d steps=%d", d.B, d.I, d.H, d.O, steps);
  apps::Rng rng(10);
  std::vector<float> X((size_t)d.B * d.I), W1((size_t)d.I * d.H), b1(d.H), W2((size_t)d.H * d.O),
      b2(d.O), teacher((size_t)d.I * d.O), T((size_t)d.B * d.O, 0.0f);
  for (auto &x : X) x = rng.uniform(-1, 1);
  float s1 = 1.0f / std::sqrt((float)d.I), s2 = 1.0f / std::sqrt((float)d.H);
  for (auto &x : W1) x = rng.uniform(-s1, s1);
  for (auto &x : b1) x = rng.uniform(-0.1f, 0.1f);
  for (auto &x : W2) x = rng.uniform(-s2, s2);
  for (auto &x : b2) x = rng.uniform(-0.1f, 0.1f);
  for (auto &x : teacher) x = rng.uniform(-s1, s1);
  for (int i = 0; i < d.B; i++)
    for (int k = 0; k < d.I; k++)
      for (int j = 0; j < d.O; j++)
        T[(size_t)i * d.O + j] += X[(size_t)i * d.I + k] * teacher[(size_t)k * d.O + j];

  size_t nBH = (size_t)d.B * d.H, nBO = (size_t)d.B * d.O;
  float *dX = dev(X), *dT = dev(T), *dW1 = dev(W1), *db1 = dev(b1), *dW2 = dev(W2), *db2 = dev(b2);
  float *dZ1 = dev_zero(nBH), *dA1 = dev_zero(nBH), *dY = dev_zero(nBO), *ddY = dev_zero(nBO),
        *ddA1 = dev_zero(nBH), *dgW1 = dev_zero(W1.size()), *dgW2 = dev_zero(W2.size()),
        *dgb1 = dev_zero(d.H), *dgb2 = dev_zero(d.O);
  std::vector<double> losses;
  std::vector<float> Y(nBO);
  apps::GpuTimer t;
  for (int s = 0; s < steps; s++) {
    t.start();
    launch_gemm(dX, dW1, dZ1, db1, d.B, d.H, d.I, 0, 0);
    relu<<<blocks(nBH), 256>>>(dZ1, dA1, nBH);
    launch_gemm(dA1, dW2, dY, db2, d.B, d.O, d.H, 0, 0);
    out_grad<<<blocks(nBO), 256>>>(dY, dT, ddY, nBO, d.B);
    launch_gemm(dA1, ddY, dgW2, nullptr, d.H, d.O, d.B, 1, 0);   // A1^T dY
    colsum<<<blocks(d.O), 256>>>(ddY, dgb2, d.B, d.O);
    launch_gemm(ddY, dW2, ddA1, nullptr, d.B, d.H, d.O, 0, 1);   // dY W2^T
    relu_grad<<<blocks(nBH), 256>>>(ddA1, dZ1, nBH);
    launch_gemm(dX, ddA1, dgW1, nullptr, d.I, d.H, d.B, 1, 0);   // X^T dZ1
    colsum<<<blocks(d.H), 256>>>(ddA1, dgb1, d.B, d.H);
    sgd<<<blocks(W1.size()), 256>>>(dW1, dgW1, lr, W1.size());
    sgd<<<blocks(d.H), 256>>>(db1, dgb1, lr, d.H);
    sgd<<<blocks(W2.size()), 256>>>(dW2, dgW2, lr, W2.size());
    sgd<<<blocks(d.O), 256>>>(db2, dgb2, lr, d.O);
    CK_LAUNCH("training step");
    t.stop();
    CK(cudaMemcpy(Y.data(), dY, nBO * sizeof(float), cudaMemcpyDeviceToHost));
    double loss = 0;
    for (size_t i = 0; i < nBO; i++) loss += 0.5 * (Y[i] - T[i]) * (Y[i] - T[i]) / d.B;
    losses.push_back(loss);
  }
  std::vector<float> gW1(W1.size()), gW2(W2.size());
  CK(cudaMemcpy(gW1.data(), dW1, W1.size() * sizeof(float), cudaMemcpyDeviceToHost));
  apps::tamper(gW1.data(), W1.size() * sizeof(float));
  CK(cudaMemcpy(gW2.data(), dW2, W2.size() * sizeof(float), cudaMemcpyDeviceToHost));

  // The CPU: the same steps in double.
  std::vector<double> x(X.begin(), X.end()), tt(T.begin(), T.end()), w1(W1.begin(), W1.end()),
      c1(b1.begin(), b1.end()), w2(W2.begin(), W2.end()), c2(b2.begin(), b2.end());
  std::vector<double> z1(nBH), a1(nBH), y(nBO), dy(nBO), da1(nBH), gw1(w1.size()), gw2(w2.size());
  for (int s = 0; s < steps; s++) {
    cpu_gemm(x, w1, z1, &c1, d.B, d.H, d.I, false, false);
    for (size_t i = 0; i < nBH; i++) a1[i] = z1[i] > 0 ? z1[i] : 0;
    cpu_gemm(a1, w2, y, &c2, d.B, d.O, d.H, false, false);
    double loss = 0;
    for (size_t i = 0; i < nBO; i++) {
      loss += 0.5 * (y[i] - tt[i]) * (y[i] - tt[i]) / d.B;
      dy[i] = (y[i] - tt[i]) / d.B;
    }
    if (!apps::approx(losses[s], loss, 1e-3, 1e-7))
      apps::fail(1, "step %d: loss %.7g want %.7g", s, losses[s], loss);
    cpu_gemm(a1, dy, gw2, nullptr, d.H, d.O, d.B, true, false);
    cpu_gemm(dy, w2, da1, nullptr, d.B, d.H, d.O, false, true);
    for (size_t i = 0; i < nBH; i++)
      if (z1[i] <= 0) da1[i] = 0;
    cpu_gemm(x, da1, gw1, nullptr, d.I, d.H, d.B, true, false);
    for (int j = 0; j < d.O; j++) {
      double g = 0;
      for (int i = 0; i < d.B; i++) g += dy[(size_t)i * d.O + j];
      c2[j] -= lr * g;
    }
    for (int j = 0; j < d.H; j++) {
      double g = 0;
      for (int i = 0; i < d.B; i++) g += da1[(size_t)i * d.H + j];
      c1[j] -= lr * g;
    }
    for (size_t i = 0; i < w1.size(); i++) w1[i] -= lr * gw1[i];
    for (size_t i = 0; i < w2.size(); i++) w2[i] -= lr * gw2[i];
  }
  for (size_t i = 0; i < w1.size(); i++)
    if (!apps::approx(gW1[i], w1[i], 1e-3, 5e-5)) apps::fail(1, "W1[%zu]=%.7g want %.7g", i, gW1[i], w1[i]);
  for (size_t i = 0; i < w2.size(); i++)
    if (!apps::approx(gW2[i], w2[i], 1e-3, 5e-5)) apps::fail(1, "W2[%zu]=%.7g want %.7g", i, gW2[i], w2[i]);
  if (!(losses.back() < losses.front()))
    apps::fail(1, "the loss did not decrease: %.7g -> %.7g", losses.front(), losses.back());
  for (float *p : {dX, dT, dW1, db1, dW2, db2, dZ1, dA1, dY, ddY, ddA1, dgW1, dgW2, dgb1, dgb2})
    CK(cudaFree(p));
  apps::params("batch=%d in=%d hidden=%d out=%d steps=%d loss=%.5f->%.5f", d.B, d.I, d.H, d.O,
               steps, losses.front(), losses.back());
  return apps::pass(apps::fnv(gW2.data(), gW2.size() * sizeof(float)), t.total_ms);
}
