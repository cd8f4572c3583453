// Probe: integer division and modulo, 64-bit indexing, local arrays, structs by value,
// __constant__ arrays and scalars, __device__ globals, device functions, grid-stride loops.
struct Params {
    int a;
    float scale;
    double offset;
    char tag;
    long long big;
};

struct Vec3 { float x, y, z; };

__constant__ float coeffs[8];
__constant__ int cscale;
__device__ int counter;
__device__ float table[4] = {1.0f, 2.0f, 4.0f, 8.0f};

__device__ __noinline__ int divmod_mix(int a, int b) { return a / b + a % b; }

extern "C" __global__ void intdiv(const int *a, const int *b, const unsigned long long *c,
                                  long long *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = a[i], y = b[i];
    unsigned ux = (unsigned)x, uy = (unsigned)y | 1u;
    unsigned long long cx = c[i];
    long long sx = (long long)cx;
    out[i * 8 + 0] = x / y;
    out[i * 8 + 1] = x % y;
    out[i * 8 + 2] = ux / uy;
    out[i * 8 + 3] = ux % uy;
    out[i * 8 + 4] = (long long)(cx / (unsigned long long)(uy + 3u));
    out[i * 8 + 5] = sx % (long long)(y | 1);
    out[i * 8 + 6] = divmod_mix(x, y) + x / 7 + x % 13 + (int)(ux / 10u);
    out[i * 8 + 7] = sx / 1000003LL;
}

extern "C" __global__ void structs(Params p, Vec3 v, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = p.a * p.scale + (float)p.offset + p.tag + (float)(p.big >> 20) + v.x * i + v.y + v.z
             + coeffs[i & 7] * cscale + table[i & 3];
    if (i == 0) atomicAdd(&counter, 1);
}

extern "C" __global__ void local_array(const int *idx, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int arr[32];
    for (int k = 0; k < 32; k++) arr[k] = k * k + i;
    // Dynamic indexing forces the array into local memory.
    out[i] = arr[idx[i] & 31] + arr[(idx[i] >> 5) & 31];
}

extern "C" __global__ void big_index(float *buf, long long n, long long stride)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        buf[i * stride] = (float)(i % 1000) + 0.5f;
}

extern "C" __global__ void counters(int *out)
{
    out[0] = counter;
    table[1] = 3.0f;
    out[1] = (int)(table[0] + table[1] + table[2] + table[3]);
}
