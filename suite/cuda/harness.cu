// Ground-truth harness: runs instance files written by `cargo run -p suite --example dump` on a
// real NVIDIA GPU through the CUDA driver API and compares the buffers with the CPU reference.
// Build: nvcc -O2 -o harness harness.cu -lcuda      Run: ./harness FILE.bin...
// Prints one line per file: GT name=<workload>/<size> ok=<0|1> ms=<kernel time of the 2nd run>; details of
// failures on GTFAIL lines. Parameters are laid out at the offsets the Rust side computed and
// passed with CU_LAUNCH_PARAM_BUFFER_POINTER; cuFuncGetParamInfo cross-checks those offsets.
#include <cuda.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct Reader {
    const uint8_t *p, *end;
    int bad;
};

static uint64_t rd(Reader *r, int n)
{
    uint64_t v = 0;
    if (r->end - r->p < n) {
        r->bad = 1;
        return 0;
    }
    for (int i = 0; i < n; i++)
        v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return v;
}

static const uint8_t *bytes(Reader *r, uint64_t n)
{
    if ((uint64_t)(r->end - r->p) < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *s = r->p;
    r->p += n;
    return s;
}

static char *str(Reader *r)
{
    uint32_t n = (uint32_t)rd(r, 4);
    const uint8_t *s = bytes(r, n);
    char *c = (char *)calloc(n + 1, 1);
    if (s)
        memcpy(c, s, n);
    return c;
}

struct Buf {
    char *name;
    uint64_t size;
    const uint8_t *init;
    int kind, elem;
    const uint8_t *exp;
    uint64_t exp_len, count, min;
    float abs_tol, rel_tol;
    CUdeviceptr dev;
};

static float f32_at(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

// Returns the number of mismatching elements, printing the first few.
static long compare(const char *name, const Buf *b, const uint8_t *got)
{
    long bad = 0;
    if (b->kind == 1) {
        static const int widths[] = {1, 4, 4, 8, 4};
        int w = (b->elem >= 0 && b->elem < 5) ? widths[b->elem] : 1;
        for (uint64_t i = 0; i + w <= b->exp_len; i += w) {
            if (memcmp(b->exp + i, got + i, w) != 0) {
                if (bad++ < 4) {
                    uint64_t e = 0, g = 0;
                    memcpy(&e, b->exp + i, w);
                    memcpy(&g, got + i, w);
                    printf("GTFAIL name=%s buf=%s idx=%llu expected=0x%llx got=0x%llx\n", name, b->name,
                           (unsigned long long)(i / w), (unsigned long long)e, (unsigned long long)g);
                }
            }
        }
    } else if (b->kind == 2) {
        for (uint64_t i = 0; i + 4 <= b->exp_len; i += 4) {
            float e = f32_at(b->exp + i), g = f32_at(got + i);
            int ok = (isnan(e) || isnan(g)) ? (isnan(e) && isnan(g))
                                            : (e == g || fabsf(e - g) <= b->abs_tol + b->rel_tol * fabsf(e));
            if (!ok && bad++ < 4)
                printf("GTFAIL name=%s buf=%s idx=%llu expected=%.9g got=%.9g\n", name, b->name,
                       (unsigned long long)(i / 4), e, g);
        }
    } else if (b->kind == 3) {
        for (uint64_t i = 0; i < b->count; i++) {
            uint64_t g;
            memcpy(&g, got + 8 * i, 8);
            if (g < b->min && bad++ < 4)
                printf("GTFAIL name=%s buf=%s idx=%llu expected>=%llu got=%llu\n", name, b->name,
                       (unsigned long long)i, (unsigned long long)b->min, (unsigned long long)g);
        }
    }
    return bad;
}

#define TRY(call)                                                                          \
    do {                                                                                   \
        CUresult rc_ = (call);                                                             \
        if (rc_ != CUDA_SUCCESS) {                                                         \
            const char *msg_ = "?";                                                        \
            cuGetErrorString(rc_, &msg_);                                                  \
            printf("GTFAIL name=%s error=%s at %s:%d\n", name, msg_, __FILE__, __LINE__); \
            goto fail;                                                                     \
        }                                                                                  \
    } while (0)

static int run_file(const char *path)
{
    char name[256];
    snprintf(name, sizeof name, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("GT name=%s ok=0 ms=0 error=open\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = (uint8_t *)malloc(len > 0 ? len : 1);
    size_t got_len = fread(data, 1, len, f);
    fclose(f);
    Reader r = {data, data + got_len, 0};
    int ok = 0;
    float ms = 0;
    Buf *bufs = NULL;
    uint32_t nbuf = 0;
    CUmodule mod = NULL;
    CUevent ev0 = NULL, ev1 = NULL;
    char *wl = NULL, *size = NULL, *ptx = NULL;
    char log[16384] = {0};
    if (got_len < 8 || memcmp(bytes(&r, 8), "VGPUWL01", 8) != 0) {
        printf("GT name=%s ok=0 ms=0 error=magic\n", path);
        free(data);
        return 1;
    }
    {
        wl = str(&r);
        size = str(&r);
        ptx = str(&r);
        snprintf(name, sizeof name, "%s/%s", wl, size);
        nbuf = (uint32_t)rd(&r, 4);
        bufs = (Buf *)calloc(nbuf ? nbuf : 1, sizeof(Buf));
        for (uint32_t i = 0; i < nbuf && !r.bad; i++) {
            Buf *b = &bufs[i];
            b->name = str(&r);
            b->size = rd(&r, 8);
            b->init = bytes(&r, b->size);
            b->kind = (int)rd(&r, 1);
            if (b->kind == 1) {
                b->elem = (int)rd(&r, 1);
                b->exp_len = rd(&r, 8);
                b->exp = bytes(&r, b->exp_len);
            } else if (b->kind == 2) {
                uint32_t a = (uint32_t)rd(&r, 4), q = (uint32_t)rd(&r, 4);
                memcpy(&b->abs_tol, &a, 4);
                memcpy(&b->rel_tol, &q, 4);
                b->exp_len = rd(&r, 8);
                b->exp = bytes(&r, b->exp_len);
            } else if (b->kind == 3) {
                b->count = rd(&r, 8);
                b->min = rd(&r, 8);
            }
        }
        if (r.bad) {
            printf("GT name=%s ok=0 ms=0 error=truncated\n", name);
            goto fail;
        }
        CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
        void *vals[2] = {log, (void *)(uintptr_t)sizeof log};
        CUresult lr = cuModuleLoadDataEx(&mod, ptx, 2, opts, vals);
        if (lr != CUDA_SUCCESS) {
            printf("GTFAIL name=%s module load failed (%d): %s\n", name, (int)lr, log);
            goto fail;
        }
        for (uint32_t i = 0; i < nbuf; i++)
            TRY(cuMemAlloc(&bufs[i].dev, bufs[i].size ? bufs[i].size : 1));
        TRY(cuEventCreate(&ev0, CU_EVENT_DEFAULT));
        TRY(cuEventCreate(&ev1, CU_EVENT_DEFAULT));
        // Two runs from the same inputs: the first pays for lazy loading, the second is timed
        // too (ms is its time); both must match the reference.
        const Reader launches = r;
        int layout_ok = 1;
        long bad = 0;
        for (int rep = 0; rep < 2; rep++) {
            r = launches;
            for (uint32_t i = 0; i < nbuf; i++)
                if (bufs[i].size)
                    TRY(cuMemcpyHtoD(bufs[i].dev, bufs[i].init, bufs[i].size));
            TRY(cuCtxSynchronize());
            TRY(cuEventRecord(ev0, 0));
            uint32_t nl = (uint32_t)rd(&r, 4);
            for (uint32_t l = 0; l < nl && !r.bad; l++) {
                char *entry = str(&r);
                unsigned g[3], bl[3];
                for (int k = 0; k < 3; k++)
                    g[k] = (unsigned)rd(&r, 4);
                for (int k = 0; k < 3; k++)
                    bl[k] = (unsigned)rd(&r, 4);
                unsigned shared = (unsigned)rd(&r, 4);
                size_t psize = (size_t)rd(&r, 4);
                uint32_t np = (uint32_t)rd(&r, 4);
                uint8_t *pbuf = (uint8_t *)calloc(psize + 8, 1);
                CUfunction fn;
                TRY(cuModuleGetFunction(&fn, mod, entry));
                for (uint32_t p = 0; p < np && !r.bad; p++) {
                    int kind = (int)rd(&r, 1);
                    uint32_t off = (uint32_t)rd(&r, 4), sz = (uint32_t)rd(&r, 4);
                    uint64_t v = rd(&r, 8);
                    if (kind == 0)
                        v = v < nbuf ? (uint64_t)bufs[v].dev : 0;
                    if (off + sz <= psize)
                        memcpy(pbuf + off, &v, sz);
                    size_t real_off = 0, real_sz = 0;
                    if (cuFuncGetParamInfo(fn, p, &real_off, &real_sz) == CUDA_SUCCESS &&
                        (real_off != off || real_sz != sz)) {
                        printf("GTFAIL name=%s param %u layout %u+%u, driver says %zu+%zu\n", name, p, off, sz,
                               real_off, real_sz);
                        layout_ok = 0;
                    }
                }
                void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize,
                                 CU_LAUNCH_PARAM_END};
                TRY(cuLaunchKernel(fn, g[0], g[1], g[2], bl[0], bl[1], bl[2], shared, 0, NULL, extra));
                free(entry);
                free(pbuf);
            }
            if (r.bad) {
                printf("GTFAIL name=%s truncated launch list\n", name);
                goto fail;
            }
            TRY(cuEventRecord(ev1, 0));
            TRY(cuEventSynchronize(ev1));
            TRY(cuEventElapsedTime(&ms, ev0, ev1));
            for (uint32_t i = 0; i < nbuf; i++) {
                if (bufs[i].kind == 0)
                    continue;
                uint8_t *host = (uint8_t *)malloc(bufs[i].size ? bufs[i].size : 1);
                TRY(cuMemcpyDtoH(host, bufs[i].dev, bufs[i].size));
                bad += compare(name, &bufs[i], host);
                free(host);
            }
        }
        ok = bad == 0 && layout_ok;
        if (bad)
            printf("GTFAIL name=%s %ld mismatching elements\n", name, bad);
    }
fail:
    printf("GT name=%s ok=%d ms=%.4f\n", name, ok, ms);
    for (uint32_t i = 0; i < nbuf; i++) {
        if (bufs[i].dev)
            cuMemFree(bufs[i].dev);
        free(bufs[i].name);
    }
    free(wl);
    free(size);
    free(ptx);
    if (ev0)
        cuEventDestroy(ev0);
    if (ev1)
        cuEventDestroy(ev1);
    if (mod)
        cuModuleUnload(mod);
    free(bufs);
    free(data);
    return !ok;
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    char devname[256];
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        printf("GT error=no CUDA device\n");
        return 2;
    }
    cuDeviceGetName(devname, sizeof devname, dev);
    int drv = 0;
    cuDriverGetVersion(&drv);
    printf("GT device=\"%s\" driver_api=%d\n", devname, drv);
    int failed = 0;
    for (int i = 1; i < argc; i++)
        failed += run_file(argv[i]);
    printf("GT done files=%d failed=%d\n", argc - 1, failed);
    return failed ? 1 : 0;
}
