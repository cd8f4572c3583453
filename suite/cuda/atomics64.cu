// 64-bit atomics: atomicAdd on unsigned long long, and an atomicCAS loop that keeps the
// maximum of a 64-bit hash (both results are independent of the order threads run in).
__device__ unsigned long long mix64(unsigned long long x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

extern "C" __global__ void atomics64(const unsigned long long *in, unsigned long long *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    unsigned long long v = in[i];
    atomicAdd(&out[0], v);
    unsigned long long h = mix64(v);
    unsigned long long old = out[1];
    while (old < h) {
        unsigned long long seen = atomicCAS(&out[1], old, h);
        if (seen == old)
            break;
        old = seen;
    }
    atomicAdd(&out[2], 1ull);
}
