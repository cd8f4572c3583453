// Probe: printf in a kernel (a call of the runtime's vprintf). Not supported by the
// interpreter yet: the test pins the clear error it gives.
#include <cstdio>
extern "C" __global__ void kprintf(const int *in, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) printf("thread %d value %d half %f\n", i, in[i], in[i] * 0.5);
}
