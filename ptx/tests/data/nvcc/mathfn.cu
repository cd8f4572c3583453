// PTX: nvcc -ptx -arch=sm_80 -O3 (CUDA 13.0) -> mathfn.ptx; GPU results in gpu.txt (harness.cu).
// Math library functions (nvcc expands them inline: range reduction, ex2/lg2, fma chains,
// local-memory Payne-Hanek for large sinf arguments), a __constant__ table, a __device__
// counter, a non-inlined device function and __syncthreads_count.
__constant__ float coef[4] = {0.5f, -1.25f, 2.0f, 3.5f};
__device__ unsigned int calls;

__device__ __noinline__ float poly(float x)
{
    atomicAdd(&calls, 1u);
    return ((coef[3] * x + coef[2]) * x + coef[1]) * x + coef[0];
}

extern "C" __global__ void mathfn(const float *in, float *out, int *counts, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float x = (i < n) ? in[i] : 0.0f;
    float r[8];
    r[0] = sinf(x);
    r[1] = cosf(x);
    r[2] = expf(x * 0.01f);
    r[3] = logf(fabsf(x) + 1.0f);
    r[4] = powf(fabsf(x) + 0.5f, 1.7f);
    r[5] = sqrtf(fabsf(x));
    r[6] = tanhf(x * 0.001f);
    r[7] = poly(x * 1e-3f);
    int big = __syncthreads_count(x > 100.0f);
    if (i < n) {
        for (int k = 0; k < 8; k++)
            out[i * 8 + k] = r[k];
        counts[i] = big;
    }
}
