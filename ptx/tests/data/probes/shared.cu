// Probe: static and dynamic shared memory, __syncthreads, block reductions (templated over
// float/double/int), grid-stride loops, a shared-memory tiled transpose.
template <typename T>
__device__ T block_reduce(T v, T *scratch)
{
    int t = threadIdx.x;
    scratch[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) scratch[t] += scratch[t + s];
        __syncthreads();
    }
    return scratch[0];
}

template <typename T>
__global__ void reduce_sum(const T *in, T *out, long long n)
{
    extern __shared__ unsigned char smem[];
    T *scratch = reinterpret_cast<T *>(smem);
    T acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        acc += in[i];
    T r = block_reduce(acc, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = r;
}

template __global__ void reduce_sum<float>(const float *, float *, long long);
template __global__ void reduce_sum<double>(const double *, double *, long long);
template __global__ void reduce_sum<int>(const int *, int *, long long);

#define TILE 16
extern "C" __global__ void transpose(const float *in, float *out, int w, int h)
{
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
    if (x < w && y < h) tile[threadIdx.y][threadIdx.x] = in[(size_t)y * w + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;
    y = blockIdx.x * TILE + threadIdx.y;
    if (x < h && y < w) out[(size_t)y * h + x] = tile[threadIdx.x][threadIdx.y];
}

// Two dynamic shared arrays carved from one extern buffer, and __syncthreads_count.
extern "C" __global__ void dyn_two(const int *in, int *out, int n)
{
    extern __shared__ int buf[];
    int *a = buf, *b = buf + blockDim.x;
    int t = threadIdx.x;
    a[t] = in[blockIdx.x * blockDim.x + t];
    b[t] = a[t] * 2;
    int c = __syncthreads_count(a[t] > 10);
    out[blockIdx.x * blockDim.x + t] = a[(t + 1) % blockDim.x] + b[blockDim.x - 1 - t] + c;
}
