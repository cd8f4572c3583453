// Parse/run coverage: double-precision math (Payne-Hanek range reduction with carry chains),
// double atomics and shuffles, __half conversions, __reduce_add_sync, and a switch statement.
// PTX: nvcc -ptx -arch=sm_80 -O3 (CUDA 13.0) -> cov1.ptx.
#include <cuda_fp16.h>
extern "C" __global__ void dmath(const double *in, double *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double x = in[i];
    double r = sin(x) + cos(x) * exp(x * 0.01) + log(fabs(x) + 1.0) + pow(fabs(x), 0.3) + sqrt(fabs(x)) + tanh(x) + atan2(x, 2.0);
    r += __shfl_down_sync(0xffffffffu, r, 1);
    atomicAdd(&out[n], r);
    out[i] = r / (x + 3.0);
}
extern "C" __global__ void halfconv(const float *in, __half *out, float *back, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half h = __float2half(in[i]);
    out[i] = h;
    back[i] = __half2float(h) + (float)__reduce_add_sync(0xffffffffu, (unsigned)i);
}
extern "C" __global__ void sw(const int *in, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i], r;
    switch (v & 7) {
    case 0: r = v * 3; break;
    case 1: r = v ^ 0x55; break;
    case 2: r = v / 7; break;
    case 3: r = v % 11; break;
    case 4: r = __popc(v); break;
    case 5: r = __clz(v); break;
    case 6: r = v << 3; break;
    default: r = -v; break;
    }
    out[i] = r;
}
