// The kernels of the driver-API program (drvapi.cu), built by apps/build.sh into drvapi.fatbin
// (`nvcc -fatbin`, compressed PTX for compute_80 and compute_90), which the program loads with
// cuModuleLoadData. extern "C": the program looks them up by these plain names.

// y = a * x + y, a scaled by the module's g_scale (a __device__ variable with an initializer,
// which the program reads and overwrites through cuModuleGetGlobal).
__device__ float g_scale = 1.0f;

extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * g_scale * x[i] + y[i];
}

// Per-block sums of squares of y into partial[blockIdx.x], in dynamic shared memory (the
// launch's sharedMemBytes: blockDim.x floats).
extern "C" __global__ void sum_squares(const float *y, float *partial, int n) {
  extern __shared__ float s[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? y[i] * y[i] : 0.0f;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}
