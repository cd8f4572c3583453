// Conversions and integer arithmetic: float->int in the four rounding modes (saturating),
// float->unsigned, int->float in the four rounding modes, __saturatef, IEEE division,
// mul.hi (32 and 64 bit), mad.wide, integer division and remainder.
// Each thread i reads one float f[i] and two ints a[i], b[i] (b[i] != 0, never INT_MIN / -1)
// and writes OUTS 32-bit words to out[i * OUTS ...].
#define OUTS 20

extern "C" __global__ void convert(const float *f, const int *a, const int *b, unsigned int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float x = f[i];
    int p = a[i];
    int q = b[i];
    unsigned int *o = out + (size_t)i * OUTS;
    o[0] = (unsigned int)__float2int_rn(x);
    o[1] = (unsigned int)__float2int_rz(x);
    o[2] = (unsigned int)__float2int_rd(x);
    o[3] = (unsigned int)__float2int_ru(x);
    o[4] = __float2uint_rn(x);
    o[5] = __float_as_uint(__int2float_rn(p));
    o[6] = __float_as_uint(__int2float_rz(p));
    o[7] = __float_as_uint(__int2float_rd(p));
    o[8] = __float_as_uint(__int2float_ru(p));
    o[9] = __float_as_uint(__uint2float_rn((unsigned int)p));
    o[10] = __float_as_uint(__saturatef(x));
    o[11] = __float_as_uint(x / (float)q);
    o[12] = (unsigned int)__mulhi(p, q);
    o[13] = __umulhi((unsigned int)p, (unsigned int)q);
    unsigned long long w = (unsigned long long)((long long)p * (long long)q + (long long)x);
    o[14] = (unsigned int)w;
    o[15] = (unsigned int)(w >> 32);
    unsigned long long h = __umul64hi((unsigned long long)p * 0x9e3779b97f4a7c15ull, (unsigned long long)q);
    o[16] = (unsigned int)(h ^ (h >> 32));
    o[17] = (unsigned int)(p / q);
    o[18] = (unsigned int)(p % q);
    o[19] = (unsigned int)p / (unsigned int)q + (unsigned int)p % (unsigned int)q;
}
