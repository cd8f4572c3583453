// Probe: integer and bit intrinsics, read-only loads, fences, clocks, volatile
// warp-synchronous reductions (old programs), launch bounds.
extern "C" __global__ void __launch_bounds__(256) intrin(const unsigned *__restrict__ a,
        const unsigned long long *__restrict__ b, unsigned *out, unsigned long long *out64, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned x = __ldg(&a[i]);
    unsigned long long y = __ldg(&b[i]);
    out[i * 12 + 0] = __brev(x);
    out[i * 12 + 1] = __clz(x);
    out[i * 12 + 2] = __ffs(x);
    out[i * 12 + 3] = __popcll(y);
    out[i * 12 + 4] = __umulhi(x, 0x9e3779b9u);
    out[i * 12 + 5] = __mul24(x & 0xffffff, 12345);
    out[i * 12 + 6] = __sad(x & 0xffff, 777u, 5u);
    out[i * 12 + 7] = __byte_perm(x, 0x11223344u, 0x5140);
    out[i * 12 + 8] = __funnelshift_l(x, 0xdeadbeefu, i & 31);
    out[i * 12 + 9] = __funnelshift_r(x, 0xdeadbeefu, i & 31);
    out[i * 12 + 10] = __clzll(y) + __ffsll(y);
    out[i * 12 + 11] = __vadd2(x, 0x00010001u) ^ __vsub4(x, 0x01010101u);
    out64[i * 2 + 0] = __umul64hi(y, 0x9e3779b97f4a7c15ull);
    out64[i * 2 + 1] = __brevll(y) ^ (unsigned long long)__mul64hi((long long)y, -3LL);
    __threadfence();
    __threadfence_block();
}

extern "C" __global__ void warp_sync_reduce(const int *in, int *out)
{
    __shared__ volatile int s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    __syncthreads();
    if (t < 32) {
        s[t] += s[t + 32];
        __syncwarp();
        s[t] += s[t + 16];
        __syncwarp();
        s[t] += s[t + 8];
        __syncwarp();
        s[t] += s[t + 4];
        __syncwarp();
        s[t] += s[t + 2];
        __syncwarp();
        s[t] += s[t + 1];
    }
    if (t == 0) {
        out[0] = s[0];
        long long c0 = clock64();
        unsigned c1 = clock();
        out[1] = (clock64() >= c0) + (c1 != 0xffffffffu);
    }
}
