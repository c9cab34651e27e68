// Lanes of one GEMV in one launch (DESIGN.md §3.6): the rows or columns of a pass multiply the
// same weights by up to 8 different inputs. `gemv_rows_*` / `gemv_partials_*` launched once per
// lane read every weight element once per lane; these kernels read it once for all lanes.
//
// Why it is bit-identical to the per-lane launches: lane l's output is computed with exactly the
// single-lane kernel's operands and order (gemv.cu) — the same canonical K-blocks, in each the
// same lane l' accumulating its elements l', l'+32, … from +0.0 (`acc = acc + w * x`, no
// contraction), the same xor-butterfly, and for rows the same fold of the K-block partials from
// +0.0 in K-block order. Only the loop nest changes: a warp loads the weights of its (rows,
// K-block) task once and runs every lane's accumulation over them, each lane its own accumulator.
// Which warp computes which task, and how many rows a task holds, are launch choices.
//
// Lane `l` reads x + l·x_pitch and writes out + l·out_pitch (element pitches, checked by the
// runtime: every lane's slice lies in its buffer, outputs of different lanes do not overlap and no
// output overlaps an input). The parameter block is gemv.cu's `GemvBatch` (one to four weights
// over the same x); dense formats only (BF16, F32), both layouts (row-major and lane-major).

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

#define GEMV_LANES_MAX 8
// Rows per lane-major task: R weight loads in flight per warp, each x value loaded once for R rows.
#define GEMV_LANES_ROWS 4

// BF16 / F32 lane-major: R rows of one K-block for L lanes (lanes l < nl, rows r < nvalid
// computed for real; the others compute on zeros and are not stored). Row r of lane l:
// gemv.cu's `partials_dense_lm` on x + l·x_pitch, operation for operation.
template <int FMT, int V, int R, int L>
__device__ __forceinline__ void lanes_dense_lm(const void* wv, const float* __restrict__ xk, int x_pitch, int nl,
                                               size_t kb0, size_t row_stride, int nvalid, int kw, int lane,
                                               float (*out)[R]) {
    const int nv = (kw >> 5) / V;
    float acc[L][R];
#pragma unroll
    for (int l = 0; l < L; ++l) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[l][r] = C_ZERO;
    }
    for (int g = 0; g < nv; ++g) {
        float w[R][V];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r < nvalid) {
                if constexpr (FMT == FMT_BF16) {
                    load_bf16<V>(static_cast<const u16*>(wv), kb0 + r * row_stride, g, lane, w[r]);
                } else {
                    load_f32x4(static_cast<const float*>(wv), kb0 + r * row_stride, g, lane, w[r]);
                }
            } else {
#pragma unroll
                for (int t = 0; t < V; ++t) w[r][t] = C_ZERO;
            }
        }
#pragma unroll
        for (int l = 0; l < L; ++l) {
            if (l < nl) {  // warp-uniform
                dense_lm_step<V, R>(w, xk + (size_t)l * x_pitch, g, lane, acc[l]);
            }
        }
    }
#pragma unroll
    for (int l = 0; l < L; ++l) {
#pragma unroll
        for (int r = 0; r < R; ++r) out[l][r] = butterfly32(acc[l][r]);
    }
}

// BF16 / F32 row-major (any kw): gemv.cu's `partial_dense_rm` for every lane.
template <int FMT, int L>
__device__ __forceinline__ void lanes_dense_rm(const void* wv, const float* __restrict__ xk, int x_pitch, int nl,
                                               size_t kb, int kw, int lane, float (*out)[1]) {
    float acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = C_ZERO;
    for (int i = lane; i < kw; i += 32) {
        float wi;
        if constexpr (FMT == FMT_BF16) {
            wi = bf16_to_f32_c(__ldg(static_cast<const u16*>(wv) + kb + i));
        } else {
            wi = __ldg(static_cast<const float*>(wv) + kb + i);
        }
#pragma unroll
        for (int l = 0; l < L; ++l) {
            if (l < nl) acc[l] = acc[l] + wi * __ldg(xk + (size_t)l * x_pitch + i);
        }
    }
#pragma unroll
    for (int l = 0; l < L; ++l) out[l][0] = butterfly32(acc[l]);
}

// Block `bx` of one weight's multi-lane GEMV (rows bx·rpb ..): its tasks for every lane, then
// (rows mode) each lane's K-block folds through `part` (GEMV_LANES_MAX × GEMV_MAX_TASKS shared
// floats). gemv.cu's `gemv_tasks` with a lane index added.
template <int FMT, int V, int L, bool PARTIALS>
__device__ __forceinline__ void lanes_tasks(const void* w, const float* __restrict__ x, int x_pitch, int nl,
                                            float* __restrict__ out, int out_pitch, int rows, int cols, int kw,
                                            int rpb, int bx, float* part) {
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int nk = cols / kw;
    const int r_first = bx * rpb;
    constexpr int R = V > 0 ? GEMV_LANES_ROWS : 1;
    const int n_groups = (rpb + R - 1) / R;
    const int n_tasks = n_groups * nk;
    for (int task = warp; task < n_tasks; task += GEMV_WARPS) {
        const int grp = task / nk;
        const int k = task - grp * nk;
        const int rl0 = grp * R;
        const int r0 = r_first + rl0;
        const int nvalid = min(min(R, rpb - rl0), rows - r0);
        if (nvalid <= 0) continue;  // warp-uniform
        const size_t kb0 = (size_t)r0 * cols + (size_t)k * kw;
        const float* xk = x + (size_t)k * kw;
        float p[L][R];
        if constexpr (V > 0) {
            lanes_dense_lm<FMT, V, R, L>(w, xk, x_pitch, nl, kb0, (size_t)cols, nvalid, kw, lane, p);
        } else {
            lanes_dense_rm<FMT, L>(w, xk, x_pitch, nl, kb0, kw, lane, p);
        }
        if (lane == 0) {
#pragma unroll
            for (int l = 0; l < L; ++l) {
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    if (l < nl && i < nvalid) {
                        if (PARTIALS) {
                            out[(size_t)l * out_pitch + (size_t)k * rows + r0 + i] = p[l][i];
                        } else {
                            part[(l * rpb + rl0 + i) * nk + k] = p[l][i];
                        }
                    }
                }
            }
        }
    }
    if (!PARTIALS) {
        __syncthreads();
        for (int t = threadIdx.x; t < nl * rpb; t += GEMV_THREADS) {
            const int l = t / rpb;
            const int rl = t - l * rpb;
            if (r_first + rl < rows) {
                float acc = C_ZERO;
                for (int k = 0; k < nk; ++k) acc = acc + part[(l * rpb + rl) * nk + k];
                out[(size_t)l * out_pitch + r_first + rl] = acc;
            }
        }
    }
}

// Dispatch on the layout (`vec`, as gemv.cu's `gemv_dispatch`), then on the lane count (L = 2, 4
// or 8 accumulators held, nl of them used).
template <int FMT, int L, bool PARTIALS>
__device__ __forceinline__ void lanes_layout(const void* w, const float* x, int x_pitch, int nl, float* out,
                                             int out_pitch, int rows, int cols, int kw, int rpb, int vec, int bx,
                                             float* part) {
    if constexpr (FMT == FMT_BF16) {
        if (vec == 8) {
            lanes_tasks<FMT, 8, L, PARTIALS>(w, x, x_pitch, nl, out, out_pitch, rows, cols, kw, rpb, bx, part);
            return;
        }
    }
    if (vec == 4) {
        lanes_tasks<FMT, 4, L, PARTIALS>(w, x, x_pitch, nl, out, out_pitch, rows, cols, kw, rpb, bx, part);
        return;
    }
    lanes_tasks<FMT, 0, L, PARTIALS>(w, x, x_pitch, nl, out, out_pitch, rows, cols, kw, rpb, bx, part);
}

// The grid is the concatenation of each weight's row blocks (gemv.cu's `gemv_rows_batch`); block
// b runs block b − block_start[i] of weight i for every lane. `out_pitch0..3` are the weights'
// output pitches (separate scalars: the parameter block is gemv.cu's, unchanged).
template <int FMT, bool PARTIALS>
__device__ __forceinline__ void gemv_lanes(const GemvBatch& b, const float* x, int cols, int kw, int rpb, int vec,
                                           int nl, int x_pitch, int out_pitch0, int out_pitch1, int out_pitch2,
                                           int out_pitch3) {
    // Constant indices only (a runtime index would copy the parameter block to local memory).
    const int bx = (int)blockIdx.x;
    const int pitches[GEMV_BATCH_MAX] = {out_pitch0, out_pitch1, out_pitch2, out_pitch3};
    u64 w = b.w[0], out = b.out[0];
    int rows = b.rows[0], start = b.block_start[0], end = b.block_start[1], out_pitch = pitches[0];
#pragma unroll
    for (int j = 1; j < GEMV_BATCH_MAX; ++j) {
        if (j < b.count && b.block_start[j] <= bx) {
            w = b.w[j];
            out = b.out[j];
            rows = b.rows[j];
            start = b.block_start[j];
            end = b.block_start[j + 1];
            out_pitch = pitches[j];
        }
    }
    if (bx < start || bx >= end) return;  // block-uniform
    // One fold buffer for every instantiation below (each declaring its own would add up).
    __shared__ float part[GEMV_LANES_MAX * GEMV_MAX_TASKS];
    const void* wp = reinterpret_cast<const void*>(w);
    float* op = reinterpret_cast<float*>(out);
    if (nl <= 2) {
        lanes_layout<FMT, 2, PARTIALS>(wp, x, x_pitch, nl, op, out_pitch, rows, cols, kw, rpb, vec, bx - start, part);
    } else if (nl <= 4) {
        lanes_layout<FMT, 4, PARTIALS>(wp, x, x_pitch, nl, op, out_pitch, rows, cols, kw, rpb, vec, bx - start, part);
    } else {
        lanes_layout<FMT, 8, PARTIALS>(wp, x, x_pitch, nl, op, out_pitch, rows, cols, kw, rpb, vec, bx - start, part);
    }
}

// Every lane l: `out_i + l·pitch_i` = gemv_rows of weight i over `x + l·x_pitch`.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_lanes_bf16(const GemvBatch batch, const float* x, int cols, int kw, int rpb, int vec, int lanes,
                         int x_pitch, int out_pitch0, int out_pitch1, int out_pitch2, int out_pitch3) {
    kernel_entry();
    gemv_lanes<FMT_BF16, false>(batch, x, cols, kw, rpb, vec, lanes, x_pitch, out_pitch0, out_pitch1, out_pitch2,
                                out_pitch3);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_lanes_f32(const GemvBatch batch, const float* x, int cols, int kw, int rpb, int vec, int lanes,
                        int x_pitch, int out_pitch0, int out_pitch1, int out_pitch2, int out_pitch3) {
    kernel_entry();
    gemv_lanes<FMT_F32, false>(batch, x, cols, kw, rpb, vec, lanes, x_pitch, out_pitch0, out_pitch1, out_pitch2,
                               out_pitch3);
}

// Every lane l: `out_i + l·pitch_i` = gemv_partials of weight i over `x + l·x_pitch`.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_partials_lanes_bf16(const GemvBatch batch, const float* x, int cols, int kw, int rpb, int vec, int lanes,
                             int x_pitch, int out_pitch0, int out_pitch1, int out_pitch2, int out_pitch3) {
    kernel_entry();
    gemv_lanes<FMT_BF16, true>(batch, x, cols, kw, rpb, vec, lanes, x_pitch, out_pitch0, out_pitch1, out_pitch2,
                               out_pitch3);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_partials_lanes_f32(const GemvBatch batch, const float* x, int cols, int kw, int rpb, int vec, int lanes,
                            int x_pitch, int out_pitch0, int out_pitch1, int out_pitch2, int out_pitch3) {
    kernel_entry();
    gemv_lanes<FMT_F32, true>(batch, x, cols, kw, rpb, vec, lanes, x_pitch, out_pitch0, out_pitch1, out_pitch2,
                              out_pitch3);
}
