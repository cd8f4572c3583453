// Probe: atomics as real programs use them, on global and shared memory.
// extern "C" keeps entry names readable. PTX: regen.sh (nvcc 13.0, compute_80 and compute_90).
extern "C" __global__ void atomics_global(int *ci, unsigned *cu, float *cf, double *cd,
                                          unsigned long long *cull, int *mx, int *mn,
                                          unsigned *bits, int *exch, int *cas, unsigned *wrap, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(ci, i);
        atomicAdd(cu, 1u);
        atomicAdd(cf, 0.5f);
        atomicAdd(cd, (double)i * 0.25);
        atomicAdd(cull, (unsigned long long)i << 32);
        atomicMax(mx, (i * 37) % 1001);
        atomicMin(mn, 500 - (i * 37) % 1001);
        atomicOr(bits, 1u << (i % 32));
        atomicAnd(bits + 1, ~(1u << (i % 31)));
        atomicXor(bits + 2, (unsigned)i);
        atomicMax(cu + 1, (unsigned)i * 3u);
        atomicMin(cu + 2, (unsigned)i + 7u);
        atomicExch(exch, i);
        // A CAS loop: atomic multiply-by-3 modulo 2^32 (any order gives the same product).
        int old = *cas, assumed;
        do {
            assumed = old;
            old = atomicCAS(cas, assumed, assumed * 3);
        } while (old != assumed);
        atomicInc(wrap, 9u);
        atomicDec(wrap + 1, 9u);
    }
}

extern "C" __global__ void atomics_shared(const int *in, int *out, float *outf, int n)
{
    __shared__ int hist[16];
    __shared__ float fsum;
    __shared__ unsigned mx;
    if (threadIdx.x < 16) hist[threadIdx.x] = 0;
    if (threadIdx.x == 0) { fsum = 0.0f; mx = 0; }
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&hist[in[i] & 15], 1);
        atomicAdd(&fsum, 1.0f);
        atomicMax(&mx, (unsigned)in[i]);
    }
    __syncthreads();
    if (threadIdx.x < 16) atomicAdd(&out[threadIdx.x], hist[threadIdx.x]);
    if (threadIdx.x == 0) {
        atomicAdd(outf, fsum);
        atomicMax((unsigned *)&out[16], mx);
    }
}

// Double atomicAdd written as the CAS loop of old CUDA programs (pre-sm_60 idiom).
__device__ double atomicAddCas(double *address, double val)
{
    unsigned long long *p = (unsigned long long *)address;
    unsigned long long old = *p, assumed;
    do {
        assumed = old;
        old = atomicCAS(p, assumed, __double_as_longlong(val + __longlong_as_double(assumed)));
    } while (assumed != old);
    return __longlong_as_double(old);
}

extern "C" __global__ void atomic_cas_double(double *sum, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAddCas(sum, 1.0);
}
