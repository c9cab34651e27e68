// RMSNorm kernels (device twins of `twins/norm.rs`): plain, residual add + RMSNorm, and the
// OPROJ_TAIL fusion fold + add + RMSNorm.
//
// The canonical sum of squares of a row is the 256-lane block order of `canon::sum_squares256`:
// thread l of a 256-thread block accumulates elements l, l+256, ... in order, each warp reduces
// its 32 lanes with the dot32 butterfly, and the 8 warp sums fold in halves (4, 2, 1). The whole
// block works on the row, so a 4096-wide row is 16 dependent adds per thread instead of 128.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

#define NORM_LANES 256
// Loads a thread issues before it uses the first: a strided loop that stores each value before
// loading the next waits a full memory round trip per element (16 of them for a 4096-wide row —
// most of a single-row norm's time). Batching moves loads earlier, never an operation; 16 covers a
// 4096-wide row in one round trip (and its weights, prefetched before the sum, in the same one).
#define NORM_BATCH 16

// dst[i] = a[i] (+ b[i] when b is given, operand order a + b; also into h when given) for this
// thread's elements i = tid, tid + blockDim, ...: the thread that stages an element is the thread
// that later reads it, so no barrier is needed before the caller's own reads.
__device__ __forceinline__ void norm_stage(const float* __restrict__ a, const float* __restrict__ b, float* h,
                                           float* sx, int n) {
    for (int base = threadIdx.x; base < n; base += NORM_BATCH * blockDim.x) {
        float v[NORM_BATCH];
        load_batch(a, base, blockDim.x, n, v);
        if (b != nullptr) {
            float u[NORM_BATCH];
            load_batch(b, base, blockDim.x, n, u);
#pragma unroll
            for (int j = 0; j < NORM_BATCH; ++j) v[j] = v[j] + u[j];
        }
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) {
            const int i = base + j * blockDim.x;
            if (i < n) {
                sx[i] = v[j];
                if (h != nullptr) h[i] = v[j];
            }
        }
    }
}

// A row of at most NORM_BATCH * NORM_LANES values ("one pass"): this thread's weights
// w[tid + j * NORM_LANES] into wpre, loaded before the sum of squares so that their round trip
// overlaps the reduction instead of following it. A longer row loads nothing here (rmsnorm_block
// loads its weights batch by batch).
__device__ __forceinline__ void norm_weights(const float* __restrict__ w, int n, float (&wpre)[NORM_BATCH]) {
    if (n > NORM_BATCH * NORM_LANES) return;
    load_batch(w, threadIdx.x, NORM_LANES, n, wpre);
}

// The canonical fold of the block: each warp's 32 lane sums by the butterfly, then the 8 warp sums
// in halves (4, 2, 1); inv = 1 / sqrt(ss / n + eps). Every thread returns inv.
__device__ __forceinline__ float norm_inv(float acc, float eps, int n) {
    __shared__ float s_warp[NORM_LANES / 32];
    const int tid = threadIdx.x;
    acc = butterfly32(acc);
    if ((tid & 31) == 0) s_warp[tid >> 5] = acc;
    __syncthreads();
    const float h0 = s_warp[0] + s_warp[4];
    const float h1 = s_warp[1] + s_warp[5];
    const float h2 = s_warp[2] + s_warp[6];
    const float h3 = s_warp[3] + s_warp[7];
    const float ss = (h0 + h2) + (h1 + h3);
    return rsqrt_c(div_c(ss, (float)n) + eps);
}

// One block of exactly NORM_LANES threads per row (the canonical lane count; any other block size
// would be another order, so it traps). The row is staged in shared memory by the caller (each
// thread stages exactly the elements it later reads: no barrier is needed before the sum), then
// every thread writes y = (x * inv) * w for its own elements. Reading x only from the staged copy
// lets `y` alias `x`. Dynamic shared memory: n floats. A one-pass row's weights come from `wpre`
// (norm_weights), filled by the caller when PRELOADED, else here.
template <bool PRELOADED>
__device__ __forceinline__ void rmsnorm_block(const float* sx, const float* __restrict__ w, float (&wpre)[NORM_BATCH],
                                              float eps, float* y, int n) {
    if (blockDim.x != NORM_LANES) __trap();
    const int tid = threadIdx.x;
    const bool one_pass = n <= NORM_BATCH * NORM_LANES;
    if (!PRELOADED) norm_weights(w, n, wpre);
    float acc = C_ZERO;
    for (int i = tid; i < n; i += NORM_LANES) acc = acc + sx[i] * sx[i];
    const float inv = norm_inv(acc, eps, n);
    if (one_pass) {
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) {
            const int i = tid + j * NORM_LANES;
            if (i < n) y[i] = (sx[i] * inv) * wpre[j];
        }
        return;
    }
    for (int base = tid; base < n; base += NORM_BATCH * NORM_LANES) {
        float wv[NORM_BATCH];
        load_batch(w, base, NORM_LANES, n, wv);
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) {
            const int i = base + j * NORM_LANES;
            if (i < n) y[i] = (sx[i] * inv) * wv[j];
        }
    }
}

// A one-pass row (n <= NORM_BATCH * NORM_LANES) in registers: thread l loads exactly the elements
// it sums in the canonical order (l, l + 256, ...), all of x (and a) in one batch before the first
// use, so the row costs one memory round trip; staged through shared memory, ptxas issued the
// loads in two or three batches around the stores (each batch a round trip: 3.9-4.9 µs per norm on
// an H200, 2026-12-06). The same operations in the same order as norm_stage + rmsnorm_block: h = x
// + a, the sum of squares over i = l, l + 256, ..., then y = (h * inv) * w. A thread reads and
// writes only its own elements, so `y` and `h` may alias `x`. `wpre` holds the weights
// (norm_weights).
template <bool ADD>
__device__ __forceinline__ void norm_row_regs(const float* x, const float* a, float* h, const float (&wpre)[NORM_BATCH],
                                              float eps, float* y, int n) {
    if (blockDim.x != NORM_LANES) __trap();
    const int tid = threadIdx.x;
    float v[NORM_BATCH];
    load_batch(x, tid, NORM_LANES, n, v);
    if constexpr (ADD) {
        float u[NORM_BATCH];
        load_batch(a, tid, NORM_LANES, n, u);
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) v[j] = v[j] + u[j];
    }
    float acc = C_ZERO;
#pragma unroll
    for (int j = 0; j < NORM_BATCH; ++j) {
        if (tid + j * NORM_LANES < n) acc = acc + v[j] * v[j];
    }
    // h is stored after norm_inv's barrier: stored with the adds, ptxas split a's loads around
    // the first stores (three round trips; add_rmsnorm 5.5 -> 7.4 µs, one H100, 2026-12-06).
    const float inv = norm_inv(acc, eps, n);
#pragma unroll
    for (int j = 0; j < NORM_BATCH; ++j) {
        const int i = tid + j * NORM_LANES;
        if (i < n) {
            if constexpr (ADD) h[i] = v[j];
            y[i] = (v[j] * inv) * wpre[j];
        }
    }
}

// One row (blockIdx.x, lane blockIdx.z) of rmsnorm_f32 (ADD false; lane slices [x, w, y]) or
// add_rmsnorm_f32 (ADD true: h = x + a first; slices [x, a, w, h, y]).
//
// Weights first (WF): w is uploaded once before any launch and no kernel writes it, so a one-pass
// row's weights (norm_weights, from the kernel parameters alone) are loaded before
// kernel_entry()'s wait and their round trip overlaps the tail of the kernel ahead; x and a are
// staged and h and y written only after the wait. The values and every operation are those of
// a load after the wait.
template <bool ADD, bool WF>
__device__ __forceinline__ void norm_rows(const float* x, const float* a, const float* w, float eps, float* h, float* y,
                                          int n, int rows, const LanePitch& lp) {
    w = LANE_AT(w, lp, ADD ? 2 : 1, blockIdx.z);
    float wpre[NORM_BATCH];
    norm_weights(w, n, wpre);
    if constexpr (WF) kernel_entry();
    x = LANE_AT(x, lp, 0, blockIdx.z);
    if constexpr (ADD) {
        a = LANE_AT(a, lp, 1, blockIdx.z);
        h = LANE_AT(h, lp, 3, blockIdx.z);
    }
    y = LANE_AT(y, lp, ADD ? 4 : 2, blockIdx.z);
    extern __shared__ float s_row[];  // a name of its own (NVRTC warns where a kernel shares it)
    const int row = blockIdx.x;
    if (row >= rows || n <= 0) return;  // block-uniform
    const size_t off = (size_t)row * n;
    if (n <= NORM_BATCH * NORM_LANES) {
        norm_row_regs<ADD>(x + off, ADD ? a + off : nullptr, ADD ? h + off : nullptr, wpre, eps, y + off, n);
        return;
    }
    norm_stage(x + off, ADD ? a + off : nullptr, ADD ? h + off : nullptr, s_row, n);
    __syncthreads();
    rmsnorm_block<true>(s_row, w, wpre, eps, y + off, n);
}

// y = rmsnorm(x) row by row; `rows` rows of `n` values, one weight row `w` of n; grid = rows.
// Lane grid: blockIdx.z = lane, slices [x, w, y]. The launch bounds were chosen for the staged
// rows (n > 4096): without a minimum block count, ptxas fits this kernel in 32 registers (full
// occupancy) by issuing x's loads one at a time while wpre is held across them; 4 blocks per SM
// (at most 64 registers) leaves it 48 and the loads in two batches. The register rows
// (norm_row_regs, n <= 4096) were measured under the same bounds (one load run).
extern "C" __global__ void __launch_bounds__(NORM_LANES, 4)
    rmsnorm_f32(const float* x, const float* w, float eps, float* y, int n, int rows, const LanePitch lp) {
    norm_rows<false, WEIGHTS_FIRST>(x, nullptr, w, eps, nullptr, y, n, rows, lp);
}

// h = x + a (operand order fixed), then y = rmsnorm(h) row by row; grid = rows.
// Lane grid: blockIdx.z = lane, slices [x, a, w, h, y].
extern "C" __global__ void add_rmsnorm_f32(const float* x, const float* a, const float* w, float eps, float* h,
                                           float* y, int n, int rows, const LanePitch lp) {
    norm_rows<true, WEIGHTS_FIRST>(x, a, w, eps, h, y, n, rows, lp);
}

// OPROJ_TAIL: a = fold(parts) over `n_parts` vectors of width rows·n from +0.0 in part order,
// then h = x + a, y = rmsnorm(h); `a` is written out too (the o_join seam stays observable).
extern "C" __global__ void fold_add_rmsnorm_f32(const float* parts, int n_parts, const float* x, const float* w,
                                                float eps, float* a, float* h, float* y, int n, int rows) {
    kernel_entry();
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
    float wpre[NORM_BATCH];
    rmsnorm_block<false>(sx, w, wpre, eps, y + off, n);
}
