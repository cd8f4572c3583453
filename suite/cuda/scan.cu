// Inclusive prefix sum of ints inside each CTA: shfl.sync.up inside each warp, warp totals
// through shared memory, then the CTA total. CTAs are independent.
extern "C" __global__ void scan(const int *in, int *out, int *block_sums, int n)
{
    __shared__ int warp_tot[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int v = (i < n) ? in[i] : 0;
    for (int off = 1; off < 32; off <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off)
            v += t;
    }
    if (lane == 31)
        warp_tot[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        int t = (lane < nw) ? warp_tot[lane] : 0;
        for (int off = 1; off < 32; off <<= 1) {
            int u = __shfl_up_sync(0xffffffffu, t, off);
            if (lane >= off)
                t += u;
        }
        if (lane < nw)
            warp_tot[lane] = t;
    }
    __syncthreads();
    if (warp > 0)
        v += warp_tot[warp - 1];
    if (i < n)
        out[i] = v;
    if (threadIdx.x == blockDim.x - 1)
        block_sums[blockIdx.x] = v;
}
