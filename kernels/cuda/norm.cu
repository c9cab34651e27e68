// RMSNorm kernels (device twins of `twins/norm.rs`): plain, residual add + RMSNorm, and the
// OPROJ_TAIL fusion fold + add + RMSNorm.
//
// One warp per row: the canonical sum of squares is dot32 over the whole row (lane l accumulates
// elements l, l+32, … in order), so the reduction of a row belongs to exactly one warp. Each lane
// writes back only the elements it read, so an output may alias its input.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

// y = rmsnorm(x) row by row; `rows` rows of `n` values, one weight row `w` of n.
extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float eps, float* y, int n, int rows) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;  // warp-uniform
    rmsnorm_warp(x + (size_t)row * n, w, eps, y + (size_t)row * n, n, lane);
}

// h = x + a (operand order fixed), then y = rmsnorm(h) row by row.
extern "C" __global__ void add_rmsnorm_f32(const float* x, const float* a, const float* w, float eps, float* h,
                                           float* y, int n, int rows) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const size_t off = (size_t)row * n;
    for (int i = lane; i < n; i += 32) h[off + i] = x[off + i] + a[off + i];
    rmsnorm_warp(h + off, w, eps, y + off, n, lane);
}

// OPROJ_TAIL: a = fold(parts) over `n_parts` vectors of width rows·n from +0.0 in part order,
// then h = x + a, y = rmsnorm(h); `a` is written out too (the o_join seam stays observable).
extern "C" __global__ void fold_add_rmsnorm_f32(const float* parts, int n_parts, const float* x, const float* w,
                                                float eps, float* a, float* h, float* y, int n, int rows) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const size_t width = (size_t)n * rows;
    const size_t off = (size_t)row * n;
    for (int i = lane; i < n; i += 32) {
        float acc = C_ZERO;
        for (int k = 0; k < n_parts; ++k) acc = acc + parts[(size_t)k * width + off + i];
        a[off + i] = acc;
        h[off + i] = x[off + i] + acc;
    }
    rmsnorm_warp(h + off, w, eps, y + off, n, lane);
}
