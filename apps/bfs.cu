// Breadth-first search over a generated graph (CSR adjacency), level-synchronous as in Rodinia's
// bfs: a frontier mask, the next frontier, a visited mask and the level of every node; the host
// launches one level at a time until the frontier is empty (a flag copied back each level).
// The graph: a ring (so every node is reachable) plus random edges. Levels checked exactly.
#include "common.h"

#include <queue>
#include <vector>

__global__ void expand(const unsigned *row, const unsigned *col, unsigned char *frontier,
                       unsigned char *next, const unsigned char *visited, int *level, int n) {
  int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= n || !frontier[v]) return;
  frontier[v] = 0;
  for (unsigned e = row[v]; e < row[v + 1]; e++) {
    unsigned w = col[e];
    if (!visited[w]) {
      level[w] = level[v] + 1;  // every writer of w writes the same value
      next[w] = 1;
    }
  }
}

__global__ void advance(unsigned char *frontier, unsigned char *next, unsigned char *visited,
                        int n, int *changed) {
  int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= n || !next[v]) return;
  frontier[v] = 1;
  visited[v] = 1;
  next[v] = 0;
  *changed = 1;
}

int main(int argc, char **argv) {
  bool large = apps::large_size("bfs", argc, argv);
  int n = large ? 1 << 22 : 3000, deg = large ? 6 : 3;
  apps::params("nodes=%d degree=%d", n, deg + 1);
  // CSR: node v has an edge to v+1 (mod n) and deg random edges.
  std::vector<unsigned> row(n + 1), col((size_t)n * (deg + 1));
  apps::Rng rng(7);
  for (int v = 0; v < n; v++) {
    row[v] = (unsigned)((size_t)v * (deg + 1));
    col[row[v]] = (unsigned)((v + 1) % n);
    for (int k = 1; k <= deg; k++) col[row[v] + k] = rng.below(n);
  }
  row[n] = (unsigned)col.size();
  int source = 0;

  unsigned *drow, *dcol;
  unsigned char *dfront, *dnext, *dvis;
  int *dlevel, *dchanged;
  CK(cudaMalloc(&drow, row.size() * sizeof(unsigned)));
  CK(cudaMalloc(&dcol, col.size() * sizeof(unsigned)));
  CK(cudaMalloc(&dfront, n));
  CK(cudaMalloc(&dnext, n));
  CK(cudaMalloc(&dvis, n));
  CK(cudaMalloc(&dlevel, n * sizeof(int)));
  CK(cudaMalloc(&dchanged, sizeof(int)));
  CK(cudaMemcpy(drow, row.data(), row.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dcol, col.data(), col.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
  CK(cudaMemset(dfront, 0, n));
  CK(cudaMemset(dnext, 0, n));
  CK(cudaMemset(dvis, 0, n));
  CK(cudaMemset(dlevel, 0xff, n * sizeof(int)));  // -1: unreached
  unsigned char one = 1;
  int zero = 0;
  CK(cudaMemcpy(dfront + source, &one, 1, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dvis + source, &one, 1, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dlevel + source, &zero, sizeof zero, cudaMemcpyHostToDevice));

  int threads = 256, blocks = (n + threads - 1) / threads, levels = 0, changed = 1;
  apps::GpuTimer t;
  t.start();
  while (changed) {
    if (levels > n) apps::fail(1, "no end after %d levels", levels);
    CK(cudaMemset(dchanged, 0, sizeof(int)));
    expand<<<blocks, threads>>>(drow, dcol, dfront, dnext, dvis, dlevel, n);
    CK_LAUNCH("expand");
    advance<<<blocks, threads>>>(dfront, dnext, dvis, n, dchanged);
    CK_LAUNCH("advance");
    CK(cudaMemcpy(&changed, dchanged, sizeof(int), cudaMemcpyDeviceToHost));
    levels++;
  }
  t.stop();
  std::vector<int> got(n);
  CK(cudaMemcpy(got.data(), dlevel, n * sizeof(int), cudaMemcpyDeviceToHost));
  apps::tamper(got.data(), n * sizeof(int));

  std::vector<int> want(n, -1);
  std::queue<int> q;
  want[source] = 0;
  q.push(source);
  while (!q.empty()) {
    int v = q.front();
    q.pop();
    for (unsigned e = row[v]; e < row[v + 1]; e++)
      if (want[col[e]] < 0) {
        want[col[e]] = want[v] + 1;
        q.push((int)col[e]);
      }
  }
  int depth = 0;
  for (int v = 0; v < n; v++) {
    if (got[v] != want[v]) apps::fail(1, "level[%d]=%d want %d", v, got[v], want[v]);
    depth = want[v] > depth ? want[v] : depth;
  }
  if (levels != depth + 1) apps::fail(1, "%d level launches for depth %d", levels, depth);
  CK(cudaFree(drow));
  CK(cudaFree(dcol));
  CK(cudaFree(dfront));
  CK(cudaFree(dnext));
  CK(cudaFree(dvis));
  CK(cudaFree(dlevel));
  CK(cudaFree(dchanged));
  return apps::pass(apps::fnv(got.data(), n * sizeof(int)) ^ (uint64_t)depth, t.total_ms);
}
