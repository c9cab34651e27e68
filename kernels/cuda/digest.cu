// The seam digest (DESIGN.md §5, twin `twins/digest.rs`): the wrapping u64 sum over elements of
// splitmix64((global index << 32) | bits). Wrapping addition is associative and commutative, so
// per-thread sums, a block tree and one atomicAdd per block into the ticket's slot give the
// host's value whatever the order — the digest is deterministic by construction.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

#define DIGEST_THREADS 256

__device__ __forceinline__ u64 splitmix64_c(u64 x) {
    u64 z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// *slot += digest of x[0..n) whose first element has global index `base` (slot zeroed by the
// runtime before the step).
extern "C" __global__ void __launch_bounds__(DIGEST_THREADS)
    digest_f32(const float* x, int n, u64 base, u64* slot) {
    __shared__ u64 warp_sums[DIGEST_THREADS / 32];
    u64 acc = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const u64 bits = (u64)__float_as_uint(x[i]);
        acc += splitmix64_c(((base + (u64)i) << 32) | bits);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(MEMRA_FULL_MASK, acc, o);
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 total = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += warp_sums[w];
        atomicAdd(slot, total);
    }
}
