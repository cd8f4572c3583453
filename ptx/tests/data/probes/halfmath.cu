// Probe: __half and __half2 arithmetic and bfloat16 conversions (ML-style code).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void halfmath(const __half *a, const __half *b, __half *out, __half2 *out2,
                                    float *fout, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half x = a[i], y = b[i];
    out[i * 4 + 0] = __hadd(x, y);
    out[i * 4 + 1] = __hmul(x, y);
    out[i * 4 + 2] = __hfma(x, y, __float2half(1.0f));
    out[i * 4 + 3] = __hgt(x, y) ? x : y;
    __half2 p = __halves2half2(x, y);
    __half2 q = __hmul2(p, p);
    out2[i] = __hadd2(q, __hfma2(p, p, p));
    fout[i] = __half2float(hsqrt(__habs(x))) + (float)__hle(__hneg(x), y);
}

extern "C" __global__ void bf16conv(const float *in, __nv_bfloat16 *out, float *back, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __nv_bfloat16 b = __float2bfloat16(in[i]);
    __nv_bfloat16 z = __float2bfloat16_rz(in[i]);
    out[i] = b;
    back[i] = __bfloat162float(b) - __bfloat162float(z);
}
