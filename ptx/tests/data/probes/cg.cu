// Probe: cooperative groups as NVIDIA's samples use them (thread_block, tiled_partition,
// cg::reduce, shfl_down on a tile) — no grid sync.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

extern "C" __global__ void cg_reduce(const int *in, int *out, int n)
{
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i < n ? in[i] : 0;
    int s = cg::reduce(tile, v, cg::plus<int>());
    int m = cg::reduce(tile, v, cg::greater<int>());
    int d = v;
    for (int k = tile.size() / 2; k > 0; k /= 2) d += tile.shfl_down(d, k);
    __shared__ int partial[32];
    if (tile.thread_rank() == 0) partial[tile.meta_group_rank()] = s;
    block.sync();
    if (block.thread_rank() == 0) {
        int t = 0;
        for (int w = 0; w < (int)tile.meta_group_size(); w++) t += partial[w];
        atomicAdd(&out[0], t);
        atomicMax(&out[1], m);
    }
    if (tile.thread_rank() == 0) atomicAdd(&out[2], d);
    cg::thread_block_tile<4> quad = cg::tiled_partition<4>(block);
    int q = cg::reduce(quad, v, cg::plus<int>());
    if (i < n) out[3 + i] = q + (int)quad.any(v > 500) + 2 * (int)quad.all(v > 10);
}
