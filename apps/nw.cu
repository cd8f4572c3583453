// Needleman-Wunsch global alignment of two random DNA sequences of length n (match +1,
// mismatch -1, gap -2): the (n+1) x (n+1) score matrix filled by anti-diagonals, one launch per
// diagonal (2n - 1 launches), each thread one cell. Every cell checked against the CPU's matrix.
#include "common.h"

#include <algorithm>
#include <vector>

constexpr int GAP = 2;

__global__ void diagonal(int *score, const char *a, const char *b, int n, int d) {
  // Cells (i, j) with i + j = d, 1 <= i, j <= n.
  int lo = d - n > 1 ? d - n : 1;
  int i = lo + blockIdx.x * blockDim.x + threadIdx.x;
  int j = d - i;
  if (i > n || j < 1) return;
  size_t w = (size_t)n + 1;
  int s = a[i - 1] == b[j - 1] ? 1 : -1;
  int best = score[(i - 1) * w + j - 1] + s;
  best = max(best, score[(i - 1) * w + j] - GAP);
  best = max(best, score[i * w + j - 1] - GAP);
  score[i * w + j] = best;
}

int main(int argc, char **argv) {
  bool large = apps::large_size("nw", argc, argv);
  int n = large ? 8192 : 160;
  apps::params("n=%d", n);
  size_t w = (size_t)n + 1, cells = w * w;
  std::vector<char> a(n), b(n);
  apps::Rng rng(9);
  const char acgt[] = "ACGT";
  for (auto &c : a) c = acgt[rng.below(4)];
  // b: a mutated copy of a (substitutions, insertions, deletions), so the alignment is real.
  for (int i = 0, j = 0; i < n; i++) {
    uint32_t r = rng.below(20);
    if (r == 0 && j + 1 < n) j++;         // deletion
    if (r == 1) b[i] = acgt[rng.below(4)];  // insertion
    else b[i] = r == 2 ? acgt[rng.below(4)] : a[std::min(j++, n - 1)];
  }
  // One matrix on the host (256 MiB at large): the borders uploaded, the GPU's result downloaded
  // into it, and the CPU's rows computed two at a time beside it.
  std::vector<int> got(cells, 0);
  for (size_t i = 0; i < w; i++) {
    got[i * w] = -(int)i * GAP;
    got[i] = -(int)i * GAP;
  }
  int *ds;
  char *da, *db;
  CK(cudaMalloc(&ds, cells * sizeof(int)));
  CK(cudaMalloc(&da, n));
  CK(cudaMalloc(&db, n));
  CK(cudaMemcpy(ds, got.data(), cells * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(da, a.data(), n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), n, cudaMemcpyHostToDevice));
  apps::GpuTimer t;
  t.start();
  for (int d = 2; d <= 2 * n; d++) {
    int len = std::min(d - 1, 2 * n - d + 1);
    diagonal<<<(len + 127) / 128, 128>>>(ds, da, db, n, d);
  }
  CK_LAUNCH("diagonal");
  t.stop();
  CK(cudaMemcpy(got.data(), ds, cells * sizeof(int), cudaMemcpyDeviceToHost));
  apps::tamper(got.data(), cells * sizeof(int));
  std::vector<int> prev(w), row(w);
  for (size_t j = 0; j < w; j++) prev[j] = -(int)j * GAP;
  for (size_t j = 0; j < w; j++)
    if (got[j] != prev[j]) apps::fail(1, "score[0][%zu]=%d want %d", j, got[j], prev[j]);
  for (size_t i = 1; i < w; i++) {
    row[0] = -(int)i * GAP;
    for (size_t j = 1; j < w; j++) {
      int s = a[i - 1] == b[j - 1] ? 1 : -1;
      row[j] = std::max({prev[j - 1] + s, prev[j] - GAP, row[j - 1] - GAP});
    }
    for (size_t j = 0; j < w; j++)
      if (got[i * w + j] != row[j]) apps::fail(1, "score[%zu][%zu]=%d want %d", i, j, got[i * w + j], row[j]);
    std::swap(prev, row);
  }
  CK(cudaFree(ds));
  CK(cudaFree(da));
  CK(cudaFree(db));
  apps::params("n=%d score=%d", n, got[cells - 1]);
  return apps::pass(apps::fnv(got.data(), cells * sizeof(int)), t.total_ms);
}
