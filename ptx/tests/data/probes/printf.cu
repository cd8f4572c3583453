// Probe: printf in a kernel (a call of the runtime's vprintf with an argument buffer in local
// memory; the format strings are module-scope .global byte arrays).
#include <cstdio>
extern "C" __global__ void kprintf(const int *in, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) printf("thread %d value %d half %f\n", i, in[i], in[i] * 0.5);
    if (i == 0)
        printf("[%5d|%-4x|%08.3f|%e|%g|%s|%c|%lld|%u|%%|%p]\n", -42, 255u, 3.14159, 12345.678, 0.0001,
               "str", 'Z', -1234567890123LL, 4000000000u, (void *)0x1234);
}

// Conversions and flags real programs use, on values from memory (so nvcc cannot fold them).
extern "C" __global__ void kprintf_formats(const double *d, const int *k)
{
    printf("%g %g %g %g %g %G\n", d[0], d[1], d[2], d[3], d[4], d[5]);
    printf("%+d % d %.3d %#o %X %#x %.2s %5.1f %-8.2e| %f %f %c\n", k[0], k[1], k[2], k[3], k[4], k[5],
           "abcdef", d[6], d[7], d[8], d[9], k[6]);
    printf("%10.4f|%-10d|%010.2f|%lu|%ld|%hd|%5s|%-5s|%e\n", d[6], k[0], d[6], (unsigned long)d[10],
           (long)k[1], (short)k[4], "ab", "ab", d[11]);
}
