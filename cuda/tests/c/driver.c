/* A driver-API program in C, built at test time against libcuda.so.1 (tests/c_abi.rs):
 * loads a PTX file, launches vecadd, checks the result, and calls one function the library
 * does not implement. Prototypes are declared here (as cuda.h declares them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuCtxCreate_v4(CUcontext *, void *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuCtxSynchronize(void);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuGraphCreate(void **, unsigned int);

#define CK(call) do { CUresult r_ = (call); if (r_) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); printf("FAIL %s: %s (%d)\n", #call, n_, r_); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    static char ptx[1 << 16];
    size_t len = fread(ptx, 1, sizeof ptx - 1, f);
    fclose(f);
    ptx[len] = 0;

    int version = 0;
    CK(cuInit(0));
    CK(cuDriverGetVersion(&version));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    char name[128];
    CK(cuDeviceGetName(name, sizeof name, dev));
    CUcontext ctx;
    CK(cuCtxCreate_v4(&ctx, NULL, 0, dev));
    CUmodule mod;
    CK(cuModuleLoadData(&mod, ptx));
    CUfunction fn;
    CK(cuModuleGetFunction(&fn, mod, "vecadd"));

    enum { N = 500 };
    unsigned a[N], b[N], c[N];
    for (unsigned i = 0; i < N; i++) { a[i] = i; b[i] = 1; }
    CUdeviceptr da, db, dc;
    CK(cuMemAlloc_v2(&da, sizeof a));
    CK(cuMemAlloc_v2(&db, sizeof b));
    CK(cuMemAlloc_v2(&dc, sizeof c));
    CK(cuMemcpyHtoD_v2(da, a, sizeof a));
    CK(cuMemcpyHtoD_v2(db, b, sizeof b));
    unsigned n = N;
    void *args[] = { &da, &db, &dc, &n };
    CK(cuLaunchKernel(fn, (N + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH_v2(c, dc, sizeof c));
    for (unsigned i = 0; i < N; i++) {
        if (c[i] != 3 * (i + 1)) { printf("FAIL c[%u] = %u\n", i, c[i]); return 1; }
    }
    void *graph = NULL;
    CUresult unsupported = cuGraphCreate(&graph, 0);
    CK(cuMemFree_v2(da));
    CK(cuMemFree_v2(db));
    CK(cuMemFree_v2(dc));
    CK(cuCtxDestroy_v2(ctx));
    printf("ok version=%d device=%s unsupported=%d\n", version, name, unsupported);
    return 0;
}
