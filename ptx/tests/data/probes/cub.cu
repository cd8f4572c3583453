// Probe: CUB block-level primitives (what Thrust/CUB-based programs run per block).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_load.cuh>
#include <cub/block/block_radix_sort.cuh>

extern "C" __global__ void cub_block(const int *in, int *sum, int *scan, int *sorted)
{
    typedef cub::BlockReduce<int, 128> Reduce;
    typedef cub::BlockScan<int, 128> Scan;
    typedef cub::BlockRadixSort<int, 128, 4> Sort;
    __shared__ union {
        typename Reduce::TempStorage r;
        typename Scan::TempStorage s;
        typename Sort::TempStorage o;
    } tmp;
    int t = threadIdx.x, base = blockIdx.x * 128;
    int v = in[base + t];
    int total = Reduce(tmp.r).Sum(v);
    if (t == 0) sum[blockIdx.x] = total;
    __syncthreads();
    int ex;
    Scan(tmp.s).ExclusiveSum(v, ex);
    scan[base + t] = ex;
    __syncthreads();
    int keys[4];
    for (int k = 0; k < 4; k++) keys[k] = in[blockIdx.x * 512 + t * 4 + k];
    Sort(tmp.o).Sort(keys);
    for (int k = 0; k < 4; k++) sorted[blockIdx.x * 512 + t * 4 + k] = keys[k];
}
