// Issue 29's doors: SEL_MIRROR's selection mirror and FENCE_RANK1's kernel doorbell. Neither does
// arithmetic: one moves words bit for bit, the other stores one word.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

// SEL_MIRROR: out[i] = src[i] for i < n, as u32 words (route ids are bit patterns, so the
// selection is never touched as floats). `out` is a peer rank's route buffer (a peer store:
// another device's memory through peer access, or the same device's).
extern "C" __global__ void mirror_sel_u32(const unsigned* src, unsigned* out, int n) {
    kernel_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = src[i];
}

// FENCE_RANK1: ring a doorbell in the root's device memory. Launched on the peer's stream after
// its peer stores (stream order: those kernels have completed); the system-scope fence orders
// every store of this device before the flag store for every observer (the engine's argument:
// posted writes from one device arrive in order), then the ticket is stored as one volatile
// 32-bit store, which the root's stream awaits with a same-device cuStreamWaitValue32 (GEQ).
extern "C" __global__ void ring_flag_u32(unsigned* flag, unsigned ticket) {
    kernel_entry();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        __threadfence_system();
        *(volatile unsigned*)flag = ticket;
        __threadfence_system();
    }
}
