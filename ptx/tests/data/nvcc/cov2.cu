// Parse coverage: cooperative groups, float atomics through CAS loops, float4 __ldg,
// templated dynamic shared memory, volatile warp-synchronous reductions, fences, clock64,
// __nanosleep, __match_any_sync, atomicMin/Max/Inc/Dec/Exch, 3-D indexing.
// PTX: nvcc -ptx -arch=sm_80 -O3 (CUDA 13.0) -> cov2.ptx.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

__device__ float atomicMaxFloat(float *addr, float v)
{
    int *a = (int *)addr;
    int old = *a, assumed;
    do {
        assumed = old;
        if (__int_as_float(assumed) >= v) break;
        old = atomicCAS(a, assumed, __float_as_int(v));
    } while (assumed != old);
    return __int_as_float(old);
}

template <typename T>
__device__ void block_sum(T *out, T v)
{
    extern __shared__ unsigned char smem_raw[];
    T *s = reinterpret_cast<T *>(smem_raw);
    s[threadIdx.x] = v;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 32; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x < 32) {
        volatile T *vs = s;
        vs[threadIdx.x] += vs[threadIdx.x + 32];
        vs[threadIdx.x] += vs[threadIdx.x + 16];
        vs[threadIdx.x] += vs[threadIdx.x + 8];
        vs[threadIdx.x] += vs[threadIdx.x + 4];
        vs[threadIdx.x] += vs[threadIdx.x + 2];
        vs[threadIdx.x] += vs[threadIdx.x + 1];
    }
    if (threadIdx.x == 0) atomicAdd(out, s[0]);
}

extern "C" __global__ void cov2(const float4 *in, float *fmax, unsigned *u, double *dsum,
                                unsigned long long *t, int n)
{
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
    int i = blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * 7 + threadIdx.z;
    float4 v = (i < n) ? __ldg(&in[i]) : make_float4(0, 0, 0, 0);
    float s = v.x + v.y * v.z - v.w;
    float ts = cg::reduce(tile, s, cg::plus<float>());
    atomicMaxFloat(fmax, ts);
    unsigned m = __match_any_sync(0xffffffffu, (unsigned)(s > 0));
    atomicMin(&u[0], m);
    atomicMax(&u[1], (unsigned)i);
    atomicInc(&u[2], 1000u);
    atomicDec(&u[3], 1000u);
    atomicExch(&u[4], m);
    __threadfence();
    block_sum<double>(dsum, (double)s);
    if (threadIdx.x == 0) {
        unsigned long long c0 = clock64();
        __nanosleep(100);
        t[blockIdx.x] = clock64() - c0;
    }
    block.sync();
}
