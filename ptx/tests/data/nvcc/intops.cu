// PTX: nvcc -ptx -arch=sm_80 -O3 (CUDA 13.0) -> intops.ptx; GPU results in gpu.txt (harness.cu).
// Integer-heavy code: 64-bit division and remainder by runtime values, 128-bit products,
// funnel shifts / rotates, __ffs/__clz/__popc/__brev, byte permutes and saturating converts.
extern "C" __global__ void intops(const unsigned long long *a, const unsigned long long *b,
                                  unsigned long long *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    unsigned long long x = a[i], y = b[i] | 1ull;
    long long sx = (long long)x, sy = (long long)(y >> 1) + 1;
    unsigned __int128 p = (unsigned __int128)x * y;
    unsigned int lo = (unsigned int)x, hi = (unsigned int)(x >> 32);
    out[i * 8 + 0] = x / y;
    out[i * 8 + 1] = (unsigned long long)(sx % sy);
    out[i * 8 + 2] = (unsigned long long)(p >> 64) ^ (unsigned long long)p;
    out[i * 8 + 3] = __funnelshift_l(lo, hi, (unsigned int)y) | ((unsigned long long)__funnelshift_rc(lo, hi, (unsigned int)(y >> 8)) << 32);
    out[i * 8 + 4] = (unsigned long long)__ffs(lo) | ((unsigned long long)__clzll(x) << 8) | ((unsigned long long)__popcll(y) << 16);
    out[i * 8 + 5] = __brevll(x) ^ __byte_perm(lo, hi, 0x5140);
    out[i * 8 + 6] = (unsigned long long)(unsigned char)min(max((int)(lo & 0x3ff) - 300, 0), 255);
    out[i * 8 + 7] = (x << (y & 63)) + (x >> ((y >> 6) & 63));
}
