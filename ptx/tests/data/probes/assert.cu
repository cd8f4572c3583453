// Probe: assert() in a kernel (nvcc calls __assertfail when it fails).
#include <cassert>
extern "C" __global__ void checked(const int *in, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    assert(in[i] >= 0);
    out[i] = in[i] * 2;
}
