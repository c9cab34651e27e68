// RMSNorm kernels (device twins of `twins/norm.rs`): plain, residual add + RMSNorm, and the
// OPROJ_TAIL fusion fold + add + RMSNorm.
//
// The canonical sum of squares is dot32 over the whole row (lane l accumulates elements l,
// l+32, ... in order), so the reduction of a row belongs to exactly one warp (see below).

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

// One block per row. The whole block first stages the row in shared memory (coalesced, all
// loads in flight at once: a single warp walking a 4096-wide row through global memory was
// latency-bound, 128 dependent loads per lane); then warp 0 runs the canonical sum of squares
// (dot32: lane l accumulates elements l, l+32, ... in order, then the butterfly) from shared
// memory, exactly the twin's operations; then every thread writes y = (x * inv) * w. Reading x
// only from the staged copy lets `y` alias `x`. Dynamic shared memory: n floats.
__device__ __forceinline__ void rmsnorm_block(const float* sx, const float* w, float eps, float* y, int n) {
    __shared__ float s_inv;
    if (threadIdx.x < MEMRA_LANES) {
        const int lane = threadIdx.x;
        float ss = dot32_warp(sx, sx, n, lane);
        if (lane == 0) s_inv = rsqrt_c(div_c(ss, (float)n) + eps);
    }
    __syncthreads();
    const float inv = s_inv;
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = (sx[i] * inv) * w[i];
}

// y = rmsnorm(x) row by row; `rows` rows of `n` values, one weight row `w` of n; grid = rows.
extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float eps, float* y, int n, int rows) {
    extern __shared__ float sx[];
    const int row = blockIdx.x;
    if (row >= rows || n <= 0) return;  // block-uniform
    const size_t off = (size_t)row * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sx[i] = x[off + i];
    __syncthreads();
    rmsnorm_block(sx, w, eps, y + off, n);
}

// h = x + a (operand order fixed), then y = rmsnorm(h) row by row; grid = rows.
extern "C" __global__ void add_rmsnorm_f32(const float* x, const float* a, const float* w, float eps, float* h,
                                           float* y, int n, int rows) {
    extern __shared__ float sx[];
    const int row = blockIdx.x;
    if (row >= rows || n <= 0) return;
    const size_t off = (size_t)row * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[off + i] + a[off + i];
        sx[i] = v;
        h[off + i] = v;
    }
    __syncthreads();
    rmsnorm_block(sx, w, eps, y + off, n);
}

// OPROJ_TAIL: a = fold(parts) over `n_parts` vectors of width rows·n from +0.0 in part order,
// then h = x + a, y = rmsnorm(h); `a` is written out too (the o_join seam stays observable).
extern "C" __global__ void fold_add_rmsnorm_f32(const float* parts, int n_parts, const float* x, const float* w,
                                                float eps, float* a, float* h, float* y, int n, int rows) {
    extern __shared__ float sx[];
    const int row = blockIdx.x;
    if (row >= rows || n <= 0) return;
    const size_t width = (size_t)n * rows;
    const size_t off = (size_t)row * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float acc = C_ZERO;
        for (int k = 0; k < n_parts; ++k) acc = acc + parts[(size_t)k * width + off + i];
        a[off + i] = acc;
        const float v = x[off + i] + acc;
        h[off + i] = v;
        sx[i] = v;
    }
    __syncthreads();
    rmsnorm_block(sx, w, eps, y + off, n);
}
