// Warp votes: ballot, any, all and popc of the ballot, per warp, on a per-thread predicate.
extern "C" __global__ void vote(const unsigned int *in, unsigned int *ballots, unsigned int *counts,
                                unsigned int *flags, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int v = (i < n) ? in[i] : 0u;
    int pred = (v & 1u) != 0;
    unsigned int ballot = __ballot_sync(0xffffffffu, pred);
    int any = __any_sync(0xffffffffu, v > 0x80000000u);
    int all = __all_sync(0xffffffffu, v != 0u);
    if ((threadIdx.x & 31) == 0) {
        int w = i >> 5;
        ballots[w] = ballot;
        counts[w] = __popc(ballot) + __popc(v);
        flags[w] = (unsigned int)any | ((unsigned int)all << 1);
    }
}
