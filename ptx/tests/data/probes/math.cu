// Probe: the math library in single and double precision, fast intrinsics, half conversions.
#include <cuda_fp16.h>
extern "C" __global__ void mathf(const float *in, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i], ax = fabsf(x) + 0.5f;
    float *o = out + (size_t)i * 20;
    o[0] = sqrtf(ax);
    o[1] = expf(x * 0.05f);
    o[2] = logf(ax);
    o[3] = sinf(x);
    o[4] = cosf(x);
    o[5] = powf(ax, 1.7f);
    o[6] = fminf(x, 1.0f) + fmaxf(x, -1.0f);
    o[7] = rsqrtf(ax);
    o[8] = __fdividef(x, ax);
    o[9] = erff(x * 0.1f);
    o[10] = tanhf(x * 0.1f);
    o[11] = __expf(x * 0.05f) + __logf(ax) + __sinf(x) + __cosf(x);
    o[12] = __half2float(__float2half(x));
    o[13] = floorf(x) + ceilf(x) + truncf(x) + roundf(x) + rintf(x);
    o[14] = fmodf(x, 3.0f);
    o[15] = atan2f(x, 2.0f) + atanf(x) + asinf(x * 0.001f) + acosf(x * 0.001f);
    o[16] = exp2f(x * 0.1f) + log2f(ax) + log10f(ax) + expm1f(x * 0.01f) + log1pf(ax);
    o[17] = cbrtf(x) + hypotf(x, 3.0f);
    o[18] = x / ax;
    o[19] = (float)(int)x + (float)(unsigned)(ax * 3.0f);
}

extern "C" __global__ void mathd(const double *in, double *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double x = in[i], ax = fabs(x) + 0.5;
    double *o = out + (size_t)i * 10;
    o[0] = sqrt(ax);
    o[1] = exp(x * 0.05);
    o[2] = log(ax);
    o[3] = sin(x) + cos(x);
    o[4] = pow(ax, 1.7);
    o[5] = x / ax;
    o[6] = fmin(x, 1.0) + fmax(x, -1.0) + floor(x) + ceil(x);
    o[7] = erf(x * 0.1) + tanh(x * 0.1);
    o[8] = rsqrt(ax) + 1.0 / ax;
    o[9] = (double)(long long)x + (double)(float)x;
}

extern "C" __global__ void halfs(const float *in, __half *h, float *back, __half2 *h2, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half a = __float2half(in[i]);
    __half b = __float2half_rz(in[i] * 0.5f);
    h[i] = a;
    back[i] = __half2float(a) + __half2float(b);
    h2[i] = __floats2half2_rn(in[i], -in[i]);
}
