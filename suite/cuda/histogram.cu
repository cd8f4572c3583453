// Histogram of bytes into 256 bins: shared-memory atomics per CTA, then global atomics.
// Counts are exact whatever the order the CTAs run in.
extern "C" __global__ void histogram(const unsigned char *data, unsigned int *bins, int n)
{
    __shared__ unsigned int local[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        if (local[b] != 0)
            atomicAdd(&bins[b], local[b]);
}
