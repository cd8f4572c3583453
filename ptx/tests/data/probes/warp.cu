// Probe: warp shuffles, votes, __syncwarp, __activemask, warp-level reductions.
extern "C" __global__ void warp_ops(const int *in, const float *fin, const double *din,
                                    int *out, float *fout, double *dout)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    int v = in[t];
    float f = fin[t];
    double d = din[t];
    int o = 0;
    // Reductions by xor and down shuffles (int, float, double).
    int s = v;
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    float fs = f;
    for (int k = 16; k > 0; k >>= 1) fs += __shfl_down_sync(0xffffffffu, fs, k);
    double ds = d;
    for (int k = 16; k > 0; k >>= 1) ds += __shfl_down_sync(0xffffffffu, ds, k);
    // Inclusive scan with up shuffles.
    int sc = v;
    for (int k = 1; k < 32; k <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, sc, k);
        if (lane >= k) sc += y;
    }
    int bcast = __shfl_sync(0xffffffffu, v, 5);
    int rot = __shfl_sync(0xffffffffu, v, (lane + 1) & 31);
    int w16 = __shfl_sync(0xffffffffu, v, 3, 16);
    unsigned ballot = __ballot_sync(0xffffffffu, v & 1);
    int any = __any_sync(0xffffffffu, v > 900);
    int all = __all_sync(0xffffffffu, v >= 0);
    unsigned act = 0;
    if (lane < 20) act = __activemask();
    __syncwarp();
    int pop = __popc(ballot);
    o = s;
    out[t * 10 + 0] = o;
    out[t * 10 + 1] = sc;
    out[t * 10 + 2] = bcast;
    out[t * 10 + 3] = rot;
    out[t * 10 + 4] = w16;
    out[t * 10 + 5] = (int)ballot;
    out[t * 10 + 6] = any;
    out[t * 10 + 7] = all;
    out[t * 10 + 8] = (int)act;
    out[t * 10 + 9] = pop;
    fout[t] = fs;
    dout[t] = ds;
}

// A partial-warp ballot under divergence (the mask names only the active lanes).
extern "C" __global__ void warp_partial(const int *in, unsigned *out)
{
    int t = threadIdx.x;
    unsigned r = 0;
    if (in[t] % 3 == 0) {
        unsigned m = __activemask();
        r = __ballot_sync(m, in[t] > 50);
        __syncwarp(m);
    }
    out[t] = r;
}
