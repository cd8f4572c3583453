// Ground truth for the interpreter tests: runs mathfn.cu and intops.cu kernels on the GPU with
// fixed inputs and prints every output word in hex (one per line). Build and run:
//   nvcc -O2 -arch=sm_90 -o harness harness.cu && ./harness > gpu.txt
#include <cstdio>
#include <cstdint>
#include <cstring>

#include "mathfn.cu"
#include "intops.cu"

static unsigned long long mix(unsigned long long x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

float math_input(int i)
{
    if (i % 50 == 0)
        return 1.0e6f + (float)i;
    return (float)(i - 128) * 0.37f + (float)(i % 7) * 13.1f;
}

int main()
{
    const int n = 256;
    float hin[n];
    for (int i = 0; i < n; i++)
        hin[i] = math_input(i);
    float *din, *dout;
    int *dcounts;
    cudaMalloc(&din, n * 4);
    cudaMalloc(&dout, n * 8 * 4);
    cudaMalloc(&dcounts, n * 4);
    cudaMemcpy(din, hin, n * 4, cudaMemcpyHostToDevice);
    mathfn<<<2, 128>>>(din, dout, dcounts, n);
    float hout[n * 8];
    int hcounts[n];
    unsigned int hcalls = 0;
    cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost);
    cudaMemcpy(hcounts, dcounts, sizeof hcounts, cudaMemcpyDeviceToHost);
    cudaMemcpyFromSymbol(&hcalls, calls, 4);
    printf("mathfn\n");
    for (int i = 0; i < n * 8; i++) {
        unsigned int u;
        memcpy(&u, &hout[i], 4);
        printf("%08x\n", u);
    }
    for (int i = 0; i < n; i++)
        printf("%08x\n", (unsigned)hcounts[i]);
    printf("%08x\n", hcalls);

    unsigned long long ha[n], hb[n], hres[n * 8];
    for (int i = 0; i < n; i++) {
        ha[i] = mix(i);
        hb[i] = mix(i + 1000);
    }
    unsigned long long *da, *db, *dres;
    cudaMalloc(&da, sizeof ha);
    cudaMalloc(&db, sizeof hb);
    cudaMalloc(&dres, sizeof hres);
    cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice);
    intops<<<2, 128>>>(da, db, dres, n);
    cudaMemcpy(hres, dres, sizeof hres, cudaMemcpyDeviceToHost);
    printf("intops\n");
    for (int i = 0; i < n * 8; i++)
        printf("%016llx\n", hres[i]);
    cudaError_t e = cudaDeviceSynchronize();
    fprintf(stderr, "status %s\n", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}
