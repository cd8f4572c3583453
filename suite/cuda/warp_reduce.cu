// Warp-shuffle reduction: each warp sums its 32 ints with shfl.sync.down (lane 0 has the sum)
// and with shfl.sync.bfly (every lane has the sum). Integer data: exact, order-independent.
extern "C" __global__ void warp_reduce(const int *in, int *warp_sum, int *lane_sum, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = (i < n) ? in[i] : 0;
    int d = v;
    for (int off = 16; off > 0; off >>= 1)
        d += __shfl_down_sync(0xffffffffu, d, off);
    int b = v;
    for (int m = 1; m < 32; m <<= 1)
        b += __shfl_xor_sync(0xffffffffu, b, m);
    if ((threadIdx.x & 31) == 0)
        warp_sum[i >> 5] = d;
    if (i < n)
        lane_sum[i] = b;
}
