// Block GEMV on the canonical grid (DESIGN.md §3.4): the device twin of `twins/gemv.rs`.
//
// Why it looks like this: the K-block partials and the lane order of dot32 are fixed by the
// contract, so the only freedom left is which warp computes which (row, K-block) and how the
// bytes reach the lanes. One warp computes one (row, K-block) task: lane l accumulates the
// elements l, l+32, l+64, … of the K-block in that order, then the xor-butterfly. A block of 8
// warps owns `rpb` rows × all K-blocks; for `gemv_rows_*` it folds each row's partials from +0.0
// in K-block order from shared memory.
//
// Storage layouts (chosen by the runtime at upload, `vec` argument):
// - `vec == 0`: row-major, exactly as `MatrixShard` stores it; every lane loads its own strided
//   elements (works for every shape, and for NVFP4 and E4M3 weights holding NaN codes).
// - `vec == V > 0` ("lane-major"): inside each K-block, the n = kw/32 elements of lane l are
//   stored as n/V vectors of V consecutive elements, vector g of lane l at ((g*32 + l) * V):
//   column c = j*32 + l of the K-block (j = g*V + t) lives at position (j/V*32 + l)*V + j%V.
//   One 16-byte (or 8/4-byte) load then hands a lane the next V elements of its own sequence,
//   in order, and a warp's load is one contiguous 32·V-element run. Requires kw % 128 == 0 and
//   (kw/32) % V == 0. E4M3 in this layout additionally has no NaN code (decode_finite).
// The layout changes where bytes live, never which operations run in which order.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

#define FMT_BF16 0
#define FMT_F32 1
#define FMT_E4M3 2
#define FMT_NVFP4 3
#define FMT_W8 4

#define GEMV_WARPS 8
#define GEMV_THREADS 256
// rows_per_block × K-blocks held in shared memory for the row fold (checked by the runtime).
#define GEMV_MAX_TASKS 64
#define E4M3_BLOCK 128
#define NVFP4_GROUP 16
#define W8_GROUP 32
// 127.0
#define C_127 __uint_as_float(0x42FE0000u)

// ---- lane-major loads: V elements of lane `lane`'s vector g (element offset of the K-block `kb`).

// The raw 16 bytes of a V = 8 vector, and their conversion (split so that a weights-first kernel
// can issue the load before its wait and convert after it).
__device__ __forceinline__ uint4 ldg_bf16x8(const u16* __restrict__ w, size_t kb, int g, int lane) {
    return __ldg(reinterpret_cast<const uint4*>(w + kb + ((size_t)g * 32 + lane) * 8));
}

__device__ __forceinline__ void bf16x8_to_f32(uint4 q, float* out) {
    u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(words[i] << 16);
        out[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    }
}

template <int V>
__device__ __forceinline__ void load_bf16(const u16* __restrict__ w, size_t kb, int g, int lane, float* out) {
    const u16* p = w + kb + ((size_t)g * 32 + lane) * V;
    if constexpr (V == 8) {
        bf16x8_to_f32(ldg_bf16x8(w, kb, g, lane), out);
    } else {
        uint2 q = __ldg(reinterpret_cast<const uint2*>(p));
        out[0] = __uint_as_float(q.x << 16);
        out[1] = __uint_as_float(q.x & 0xFFFF0000u);
        out[2] = __uint_as_float(q.y << 16);
        out[3] = __uint_as_float(q.y & 0xFFFF0000u);
    }
}

__device__ __forceinline__ void load_f32x4(const float* __restrict__ w, size_t kb, int g, int lane, float* out) {
    float4 q = __ldg(reinterpret_cast<const float4*>(w + kb + ((size_t)g * 32 + lane) * 4));
    out[0] = q.x;
    out[1] = q.y;
    out[2] = q.z;
    out[3] = q.w;
}

// ---- the partial of one (row, K-block) task, returned in every lane.

// One vector step of partials_dense_lm: x's V values of vector g, then acc[r] += w[r][t] * x[t]
// in t order for each row.
template <int V, int R>
__device__ __forceinline__ void dense_lm_step(const float (&w)[R][V], const float* __restrict__ xk, int g, int lane,
                                              float (&acc)[R]) {
    float xv[V];
#pragma unroll
    for (int t = 0; t < V; ++t) xv[t] = __ldg(xk + (g * V + t) * 32 + lane);
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < V; ++t) acc[r] = acc[r] + w[r][t] * xv[t];
    }
}

// BF16 / F32, lane-major layout, R rows of one K-block at once (rows r < nvalid; the others
// compute on zeros and are not stored). The R weight loads are issued together and each x value
// is loaded once for the R rows; every row's accumulation order is unchanged. With PRE (BF16,
// V = 8), `pre` holds the rows' vectors g = 0, loaded by the caller before the kernel's wait:
// step g = 0 converts them in place of its loads.
template <int FMT, int V, int R, bool PRE>
__device__ __forceinline__ void partials_dense_lm(const void* wv, const float* __restrict__ xk, size_t kb0,
                                                  size_t row_stride, int nvalid, int kw, int lane,
                                                  const uint4* pre, float* out) {
    const int nv = (kw >> 5) / V;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = C_ZERO;
    int g = 0;
    if constexpr (PRE) {
        static_assert(FMT == FMT_BF16 && V == 8, "pre-loaded vectors: lane-major BF16 only");
        if (nv > 0) {
            float w[R][V];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r < nvalid) {
                    bf16x8_to_f32(pre[r], w[r]);
                } else {
#pragma unroll
                    for (int t = 0; t < V; ++t) w[r][t] = C_ZERO;
                }
            }
            dense_lm_step<V, R>(w, xk, 0, lane, acc);
            g = 1;
        }
    }
    for (; g < nv; ++g) {
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
        dense_lm_step<V, R>(w, xk, g, lane, acc);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = butterfly32(acc[r]);
}

// BF16 / F32, row-major layout (any kw): lane l takes i = l, l+32, … < kw.
template <int FMT>
__device__ __forceinline__ float partial_dense_rm(const void* wv, const float* __restrict__ xk, size_t kb, int kw,
                                                  int lane) {
    float acc = C_ZERO;
    if constexpr (FMT == FMT_BF16) {
        const u16* w = static_cast<const u16*>(wv) + kb;
        for (int i = lane; i < kw; i += 32) acc = acc + bf16_to_f32_c(__ldg(w + i)) * __ldg(xk + i);
    } else {
        const float* w = static_cast<const float*>(wv) + kb;
        for (int i = lane; i < kw; i += 32) acc = acc + __ldg(w + i) * __ldg(xk + i);
    }
    return butterfly32(acc);
}

// Four butterflies at once (blocks q = 0..3 of one lane-major E4M3 vector). A reduce-scatter over
// the first two levels: at o = 16 a lane keeps the two blocks whose bit 1 matches lane bit 4 and
// hands the other two to its partner; at o = 8 it keeps one block. Every value a lane computes is
// exactly the value the full butterfly computes at that lane (same operands, IEEE addition is
// commutative), so block q's result, held by lanes 16·(q>>1) + 8·(q&1) + 0..7, equals the
// canonical dot32. 10 shuffles for four blocks instead of 20.
__device__ __forceinline__ void butterfly32_x4(float p0, float p1, float p2, float p3, int lane, float* d) {
    const bool hi = (lane >> 4) & 1;
    float k0 = hi ? p2 : p0;
    float k1 = hi ? p3 : p1;
    const float s0 = hi ? p0 : p2;
    const float s1 = hi ? p1 : p3;
    k0 = k0 + __shfl_xor_sync(MEMRA_FULL_MASK, s0, 16);
    k1 = k1 + __shfl_xor_sync(MEMRA_FULL_MASK, s1, 16);
    const bool mid = (lane >> 3) & 1;
    float keep = mid ? k1 : k0;
    const float send = mid ? k0 : k1;
    keep = keep + __shfl_xor_sync(MEMRA_FULL_MASK, send, 8);
    keep = keep + __shfl_xor_sync(MEMRA_FULL_MASK, keep, 4);
    keep = keep + __shfl_xor_sync(MEMRA_FULL_MASK, keep, 2);
    keep = keep + __shfl_xor_sync(MEMRA_FULL_MASK, keep, 1);
    d[0] = __shfl_sync(MEMRA_FULL_MASK, keep, 0);
    d[1] = __shfl_sync(MEMRA_FULL_MASK, keep, 8);
    d[2] = __shfl_sync(MEMRA_FULL_MASK, keep, 16);
    d[3] = __shfl_sync(MEMRA_FULL_MASK, keep, 24);
}

// E4M3, lane-major layout: V = 16 (four 128-column scale blocks per vector) or V = 4 (one),
// R rows of one K-block at once (rows r < nvalid stored). Per row and scale block: dot32 of the
// decoded codes with x, then kacc = kacc + scale * dot, from +0.0.
template <int V, int R>
__device__ __forceinline__ void partials_e4m3_lm(const u8* __restrict__ codes, const float* __restrict__ scales,
                                                 int row0, int r_first, int b0, const float* __restrict__ xk,
                                                 size_t kb0, int cols, int nvalid, int kw, int lane, float* out) {
    const int nv = (kw >> 5) / V;
    const int scale_cols = cols / E4M3_BLOCK;
    const float* srow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        // Scale row of view row r_first + r: (row0 + row) / 128 − row0 / 128.
        const int rr = r < nvalid ? r_first + r : r_first;
        srow[r] = scales + (size_t)((row0 + rr) / E4M3_BLOCK - row0 / E4M3_BLOCK) * scale_cols;
    }
    float kacc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) kacc[r] = C_ZERO;
    for (int g = 0; g < nv; ++g) {
        u32 words[R][V / 4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const u8* p = codes + kb0 + (size_t)r * cols + ((size_t)g * 32 + lane) * V;
            if (r >= nvalid) {
#pragma unroll
                for (int q = 0; q < V / 4; ++q) words[r][q] = 0u;
            } else if constexpr (V == 16) {
                const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
                words[r][0] = q.x;
                words[r][1] = q.y;
                words[r][2] = q.z;
                words[r][3] = q.w;
            } else {
                words[r][0] = __ldg(reinterpret_cast<const u32*>(p));
            }
        }
        float xv[V];
#pragma unroll
        for (int t = 0; t < V; ++t) xv[t] = __ldg(xk + (g * V + t) * 32 + lane);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float p[V / 4];
#pragma unroll
            for (int q = 0; q < V / 4; ++q) {
                float dec[4];
                e4m3x4_decode_finite(words[r][q], dec);
                float acc = C_ZERO;
#pragma unroll
                for (int t = 0; t < 4; ++t) acc = acc + dec[t] * xv[q * 4 + t];
                p[q] = acc;
            }
            if constexpr (V == 16) {
                float d[4];
                butterfly32_x4(p[0], p[1], p[2], p[3], lane, d);
#pragma unroll
                for (int q = 0; q < 4; ++q) kacc[r] = kacc[r] + __ldg(srow[r] + b0 + g * 4 + q) * d[q];
            } else {
                const float d = butterfly32(p[0]);
                kacc[r] = kacc[r] + __ldg(srow[r] + b0 + g) * d;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = kacc[r];
}

// E4M3, row-major layout, exact decode (NaN codes allowed).
__device__ __forceinline__ float partial_e4m3_rm(const u8* __restrict__ codes, const float* __restrict__ srow, int b0,
                                                 const float* __restrict__ xk, size_t kb, int kw, int lane) {
    float kacc = C_ZERO;
    for (int b = 0; b < kw / E4M3_BLOCK; ++b) {
        float acc = C_ZERO;
        for (int i = lane; i < E4M3_BLOCK; i += 32) {
            const int c = b * E4M3_BLOCK + i;
            acc = acc + e4m3_decode_c(__ldg(codes + kb + c)) * __ldg(xk + c);
        }
        const float d = butterfly32(acc);
        kacc = kacc + __ldg(srow + b0 + b) * d;
    }
    return kacc;
}

// ---- E4M3, block-per-lane layout (`vec == E4M3_BPL`): one THREAD owns one (row, 128-column
// scale block) "pair" and evaluates that block's dot32 alone — the same 32 lane sums and the same
// butterfly tree as the lane-major kernel (so the same bits), without a shuffle. Lanes sharing a
// block cost one butterfly per 128 columns (10+ shuffles per 16 bytes a lane loads); a thread per
// block costs only the adds the tree has anyway (docs/gpu/2026-12-03-e4m3/ measures both).
//
// Storage (runtime backend/cuda/layout.rs `to_block_per_lane`): pair q = r * nb + b (nb = cols/128)
// of the matrix; 32 consecutive pairs form a chunk; 16-byte vector g (0..7) of pair q lives at
// uint4 index ((q / 32) * 8 + g) * 32 + q % 32, so a warp's load of vector g is 512 contiguous
// bytes. Byte 4j + i of vector g is the code of block column m + 32 i, m = brev5(4g + j): word n
// of the pair (n = 4g + j) holds lane sum m's four codes, and words come in bit-reversed lane
// order, in which the butterfly tree (level o pairs lane l with l + o, lower lane first) is a
// left-to-right binary counter: a 6-deep stack instead of 32 live sums.
#define E4M3_BPL 128
// Shared-memory bounds of the block-per-lane kernels (the runtime checks shapes against them).
#define BPL_MAX_NB 32
#define BPL_XS_PITCH 132
#define BPL_SV 1024

__device__ __forceinline__ int brev5_c(int m) {
    return ((m & 1) << 4) | ((m & 2) << 2) | (m & 4) | ((m & 8) >> 2) | ((m & 16) >> 4);
}

// x (cols = nb * 128 values) into shared memory in the pairs' order: block b at b * BPL_XS_PITCH
// (the pitch skews blocks across banks), lane sum m's four values at 4 * brev5(m).
// A 16-byte-aligned x with GEMV_THREADS threads is read as float4s, every thread's (at most
// BPL_X4) loads issued before its first store: one round trip to L2 instead of one per value (the
// loop below waited for each load before the next; in a kernel that streams its weights through
// L2, that wait took several µs before any code load; docs/gpu/2026-12-06-variants/). The same
// values land in the same places either way. Stores: lane l of a warp writes values 4l .. 4l + 3
// of one block, at banks 4 · brev3(l % 8) + l / 8 (+ a constant per store): 32 distinct banks.
// CG: x was written by other blocks of the same launch, so it is read through L2 (ld.global.cg)
// instead of the non-coherent path; the same values land in the same places.
#define BPL_X4 (BPL_MAX_NB * E4M3_BLOCK / 4 / GEMV_THREADS)
template <bool CG = false>
__device__ __forceinline__ void bpl_stage_x(const float* __restrict__ x, int cols, float* xs) {
    if ((reinterpret_cast<size_t>(x) & 15) == 0 && blockDim.x == GEMV_THREADS) {  // block-uniform
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const int n4 = cols / 4;
        float4 v[BPL_X4];
#pragma unroll
        for (int i = 0; i < BPL_X4; ++i) {
            const int c4 = threadIdx.x + i * GEMV_THREADS;
            if (c4 < n4) v[i] = CG ? __ldcg(x4 + c4) : __ldg(x4 + c4);
        }
#pragma unroll
        for (int i = 0; i < BPL_X4; ++i) {
            const int c4 = threadIdx.x + i * GEMV_THREADS;
            if (c4 < n4) {
                const int e = (c4 & 31) * 4;  // values e .. e + 3 of block c4 / 32: one i = e / 32
                float* xb = xs + (c4 >> 5) * BPL_XS_PITCH + (e >> 5);
                xb[4 * brev5_c(e & 31)] = v[i].x;
                xb[4 * brev5_c((e + 1) & 31)] = v[i].y;
                xb[4 * brev5_c((e + 2) & 31)] = v[i].z;
                xb[4 * brev5_c((e + 3) & 31)] = v[i].w;
            }
        }
        return;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int b = c >> 7, e = c & 127;
        xs[b * BPL_XS_PITCH + 4 * brev5_c(e & 31) + (e >> 5)] = CG ? __ldcg(x + c) : x[c];
    }
}

// partial_e4m3_rm's K-block partial of view row r read from the block-per-lane layout (a warp
// task: lane m sums its four codes m + 32 i, then the butterfly): for a grouped expert whose one
// matrix is block-per-lane and the other row-major (a NaN code keeps that one off the fast
// layouts), which the expert kernels then run as warp tasks. Same operations, same order, same
// bits as both layouts' own kernels; every code decoded in full (NaN codes included).
__device__ __forceinline__ float partial_e4m3_bpl_task(const u8* __restrict__ codes, const float* __restrict__ srow,
                                                       int b0, const float* __restrict__ xk, int r, int nb, int kw,
                                                       int lane) {
    const int n = brev5_c(lane);
    float kacc = C_ZERO;
    for (int b = 0; b < kw / E4M3_BLOCK; ++b) {
        const size_t q = (size_t)r * (size_t)nb + (size_t)(b0 + b);
        const u8* word = codes + (((q / 32) * 8 + (size_t)(n >> 2)) * 32 + q % 32) * 16 + 4 * (n & 3);
        float acc = C_ZERO;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc = acc + e4m3_decode_c(__ldg(word + i)) * __ldg(xk + b * E4M3_BLOCK + lane + 32 * i);
        }
        const float d = butterfly32(acc);
        kacc = kacc + __ldg(srow + b0 + b) * d;
    }
    return kacc;
}

// dot32 of one pair: v_m = (((+0 + p_m) + p_{m+32}) + p_{m+64}) + p_{m+96}, then the butterfly
// tree over the v_m, evaluated as a stack in bit-reversed leaf order.
__device__ __forceinline__ float bpl_dot(const uint4 (&c)[8], const float* xsb) {
    float st[6];
    int top = 0;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
        const u32 wd[4] = {c[g].x, c[g].y, c[g].z, c[g].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float d[4];
            e4m3x4_decode_finite(wd[j], d);
            const float4 xv = *reinterpret_cast<const float4*>(xsb + 16 * g + 4 * j);
            float v = C_ZERO;
            v = v + d[0] * xv.x;
            v = v + d[1] * xv.y;
            v = v + d[2] * xv.z;
            v = v + d[3] * xv.w;
            // Leaf n = 4g + j closes one subtree per trailing one bit of n (compile-time here).
            int n = 4 * g + j;
#pragma unroll
            for (int lv = 0; lv < 5; ++lv) {
                if ((n & 1) == 0) break;
                v = st[top - 1] + v;
                --top;
                n >>= 1;
            }
            st[top] = v;
            ++top;
        }
    }
    return st[0];
}

// scale · dot of the block's pairs: rows r_first .. r_first + nrows - 1 of the matrix (view rows
// for the scale lookup: row0 + r), pair ql = (r - r_first) * nb + b into sv[ql]. Every thread of
// the block takes part; the caller synchronises.
__device__ __forceinline__ void bpl_pairs(const u8* __restrict__ codes, const float* __restrict__ scales, int row0,
                                          int r_first, int nrows, int nb, const float* xs, float* sv) {
    const uint4* base = reinterpret_cast<const uint4*>(codes);
    const int npairs = nrows * nb;
    const size_t q0 = (size_t)r_first * nb;
    for (int ql = threadIdx.x; ql < npairs; ql += blockDim.x) {
        const size_t q = q0 + (size_t)ql;
        const uint4* v = base + (q >> 5) * 256 + (q & 31);
        uint4 c[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) c[g] = __ldg(v + g * 32);
        const int rl = ql / nb;
        const int b = ql - rl * nb;
        const float d = bpl_dot(c, xs + b * BPL_XS_PITCH);
        const int r = r_first + rl;
        sv[ql] = __ldg(scales + (size_t)((row0 + r) / E4M3_BLOCK - row0 / E4M3_BLOCK) * nb + b) * d;
    }
}

// The K-block partial of a row from its scaled block dots: +0.0, then each block of K-block k in
// order (kacc = kacc + scale * dot, as partials_e4m3_lm).
__device__ __forceinline__ float bpl_kpart(const float* sv_row, int k, int bk) {
    float kacc = C_ZERO;
    for (int j = 0; j < bk; ++j) kacc = kacc + sv_row[k * bk + j];
    return kacc;
}

// A row's fold of its K-block partials from +0.0 in K-block order (gemv_tasks' row fold).
__device__ __forceinline__ float bpl_row(const float* sv_row, int nk, int bk) {
    float acc = C_ZERO;
    for (int k = 0; k < nk; ++k) acc = acc + bpl_kpart(sv_row, k, bk);
    return acc;
}

// Block `bx` of an E4M3 GEMV in the block-per-lane layout (rows bx * rpb ..; rpb * nb <= BPL_SV and
// nb <= BPL_MAX_NB, checked by the runtime): partials out[k * rows + r], or rows out[r].
template <bool PARTIALS>
__device__ __forceinline__ void gemv_bpl(const u8* codes, const float* scales, int row0, const float* __restrict__ x,
                                         float* __restrict__ out, int rows, int cols, int kw, int rpb, int bx) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ float sv[BPL_SV];
    const int r_first = bx * rpb;
    if (r_first >= rows) return;  // block-uniform
    const int nrows = min(rpb, rows - r_first);
    const int nb = cols / E4M3_BLOCK, bk = kw / E4M3_BLOCK, nk = cols / kw;
    bpl_stage_x(x, cols, xs);
    __syncthreads();
    bpl_pairs(codes, scales, row0, r_first, nrows, nb, xs, sv);
    __syncthreads();
    if (PARTIALS) {
        for (int t = threadIdx.x; t < nrows * nk; t += blockDim.x) {
            const int k = t / nrows, rl = t - k * nrows;
            out[(size_t)k * rows + r_first + rl] = bpl_kpart(sv + rl * nb, k, bk);
        }
    } else {
        for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) out[r_first + rl] = bpl_row(sv + rl * nb, nk, bk);
    }
}

// NVFP4, row-major (packed nibbles, low nibble first; one ue4m3 scale per 16 values of the view).
// Element value e2m1 · ue4m3 (exact), then one lane chain over the whole K-block. The per-matrix
// scale is not applied here (the program applies it once, after the row reduce).
__device__ __forceinline__ float partial_nvfp4(const u8* __restrict__ packed, const u8* __restrict__ scales,
                                               const float* __restrict__ xk, size_t kb, int kw, int lane) {
    float acc = C_ZERO;
    for (int i = lane; i < kw; i += 32) {
        const size_t e = kb + (size_t)i;
        const u32 byte = __ldg(packed + (e >> 1));
        const u32 nib = (byte >> ((u32)(e & 1) * 4)) & 0xFu;
        const float v = e2m1_decode_c(nib) * ue4m3_decode_c(__ldg(scales + e / NVFP4_GROUP));
        acc = acc + v * __ldg(xk + i);
    }
    return butterfly32(acc);
}

// W8 (NUMERIC-CLASS door, twins/w8.rs): int8 weights with one f32 scale per 32 values of a row;
// x is quantized per 32 the same way at every GEMV (scale = amax / 127, or 1 for an all-zero
// group; q = clamp(round-half-even(x / scale), -127, 127), NaN -> 0). Per group the exact integer
// dot (any order: integer addition is exact), then acc = acc + (float)isum * (ws * xs) in group
// order from +0.0. One warp per group of 32: lane l holds column l of it.
__device__ __forceinline__ float partial_w8(const signed char* __restrict__ q, const float* __restrict__ scales,
                                            const float* __restrict__ x, int r, int k, int cols, int kw, int lane) {
    const int groups = kw / W8_GROUP;
    const int row_groups = cols / W8_GROUP;
    float acc = C_ZERO;
    for (int g = k * groups; g < (k + 1) * groups; ++g) {
        const int c = g * W8_GROUP + lane;
        const float xv = __ldg(x + c);
        const float a = __uint_as_float(__float_as_uint(xv) & 0x7FFFFFFFu);
        float m = a > C_ZERO ? a : C_ZERO;  // NaN never wins, as in the host fold
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(MEMRA_FULL_MASK, m, o);
            if (other > m) m = other;
        }
        const float xs = m > C_ZERO ? div_c(m, C_127) : C_ONE;
        float t = rintf(div_c(xv, xs));
        if (t > C_127) {
            t = C_127;
        } else if (t < -C_127) {
            t = -C_127;
        }
        const int qx = is_nan_c(t) ? 0 : (int)t;
        const int qw = (int)__ldg(q + (size_t)r * cols + c);
        int isum = qw * qx;
        for (int o = 16; o > 0; o >>= 1) isum += __shfl_xor_sync(MEMRA_FULL_MASK, isum, o);
        acc = acc + (float)isum * (__ldg(scales + (size_t)r * row_groups + g) * xs);
    }
    return acc;
}

// ---- task loop shared by every format.

// Rows per lane-major task (weight loads in flight per warp, x reuse).
#define GEMV_ROWS_PER_TASK 4

// Rows computed by one task of format FMT in layout V (lane-major formats take R rows per task
// so that R weight loads are in flight and each x value is loaded once for R rows).
template <int FMT, int V>
struct GemvTaskRows {
    static constexpr int R = (V > 0 && (FMT == FMT_BF16 || FMT == FMT_F32 || FMT == FMT_E4M3)) ? GEMV_ROWS_PER_TASK : 1;
};

// One (row group, K-block) task: the partials of view rows r0 .. r0 + nvalid - 1 over K-block k
// into p[0 .. nvalid) (returned in every lane). `x` is the whole input vector of the view. With
// PRE, `pre` holds the task's weight vectors g = 0 (BF16, V = 8: gemv_tasks' weights first).
template <int FMT, int V, bool PRE = false>
__device__ __forceinline__ void gemv_task(const void* w, const void* scales, int row0, const float* __restrict__ x,
                                          int cols, int kw, int r0, int nvalid, int k, int lane, float* p,
                                          const uint4* pre = nullptr) {
    constexpr int R = GemvTaskRows<FMT, V>::R;
    const size_t kb0 = (size_t)r0 * cols + (size_t)k * kw;
    const float* xk = x + (size_t)k * kw;
    if constexpr (R > 1) {
        if constexpr (FMT == FMT_E4M3) {
            partials_e4m3_lm<V, R>(static_cast<const u8*>(w), static_cast<const float*>(scales), row0, r0,
                                   (k * kw) / E4M3_BLOCK, xk, kb0, cols, nvalid, kw, lane, p);
        } else {
            partials_dense_lm<FMT, V, R, PRE>(w, xk, kb0, (size_t)cols, nvalid, kw, lane, pre, p);
        }
    } else if constexpr (FMT == FMT_BF16 || FMT == FMT_F32) {
        p[0] = partial_dense_rm<FMT>(w, xk, kb0, kw, lane);
    } else if constexpr (FMT == FMT_E4M3) {
        // Scale row of this view row: (row0 + r) / 128 - row0 / 128; scale columns cols / 128.
        const float* srow = static_cast<const float*>(scales) +
                            (size_t)((row0 + r0) / E4M3_BLOCK - row0 / E4M3_BLOCK) * (size_t)(cols / E4M3_BLOCK);
        p[0] = partial_e4m3_rm(static_cast<const u8*>(w), srow, (k * kw) / E4M3_BLOCK, xk, kb0, kw, lane);
    } else if constexpr (FMT == FMT_NVFP4) {
        p[0] = partial_nvfp4(static_cast<const u8*>(w), static_cast<const u8*>(scales), xk, kb0, kw, lane);
    } else {
        p[0] = partial_w8(static_cast<const signed char*>(w), static_cast<const float*>(scales), x, r0, k, cols, kw,
                          lane);
    }
}

// Task `task` of the block whose rows start at r_first: K-block k, rows r0 .. r0 + nvalid - 1
// (block-local from rl0; nvalid <= 0: none).
struct GemvTaskAt {
    int k, rl0, r0, nvalid;
};

template <int R>
__device__ __forceinline__ GemvTaskAt gemv_task_at(int task, int nk, int r_first, int rpb, int rows) {
    const int grp = task / nk;
    GemvTaskAt t;
    t.k = task - grp * nk;
    t.rl0 = grp * R;  // first block-local row of the group
    t.r0 = r_first + t.rl0;
    t.nvalid = min(min(R, rpb - t.rl0), rows - t.r0);
    return t;
}

// Task t of gemv_tasks (t.nvalid > 0): its partials, stored by lane 0 into out[k * rows + r]
// (PARTIALS) or the block's row-fold slots part[rl * nk + k].
template <int FMT, int V, bool PARTIALS, bool PRE>
__device__ __forceinline__ void gemv_task_store(const void* w, const void* scales, int row0,
                                                const float* __restrict__ x, float* __restrict__ out, float* part,
                                                int rows, int cols, int kw, int nk, const GemvTaskAt& t, int lane,
                                                const uint4* pre) {
    constexpr int R = GemvTaskRows<FMT, V>::R;
    float p[R];
    gemv_task<FMT, V, PRE>(w, scales, row0, x, cols, kw, t.r0, t.nvalid, t.k, lane, p, pre);
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            if (i < t.nvalid) {
                if (PARTIALS) {
                    out[(size_t)t.k * rows + t.r0 + i] = p[i];
                } else {
                    part[(t.rl0 + i) * nk + t.k] = p[i];
                }
            }
        }
    }
}

// Block `bx` of a GEMV (rows bx * rpb ..): its tasks, then (rows mode) the K-block folds.
//
// Weights first (WF; BF16, V = 8 only): the weights are uploaded once before any launch and no
// kernel writes them, so a warp may load bytes of them before kernel_entry()'s wait. Each warp
// issues the 16-byte loads of vector g = 0 of its first task (task = warp; at `step`'s 512-wide
// K-blocks half of the task's weight bytes, and typically its only task) into registers, then
// waits; their DRAM round trip overlaps the tail of the kernel ahead. x, `out` and `part` are
// touched only after the wait. The first task converts `pre` where it would have loaded: the same
// bytes, the same operations in the same order, only the load moves. (The first task is its own
// instantiation, so the loop of the other tasks is the plain one and `pre` dies after step 0.)
template <int FMT, int V, bool PARTIALS, bool WF>
__device__ __forceinline__ void gemv_tasks(const void* w, const void* scales, int row0, const float* __restrict__ x,
                                           float* __restrict__ out, int rows, int cols, int kw, int rpb, int bx) {
    __shared__ float part[GEMV_MAX_TASKS];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int nk = cols / kw;
    const int r_first = bx * rpb;
    constexpr int R = GemvTaskRows<FMT, V>::R;
    const int n_groups = (rpb + R - 1) / R;
    const int n_tasks = n_groups * nk;
    int task = warp;
    if constexpr (WF) {
        static_assert(FMT == FMT_BF16 && V == 8, "weights first: the lane-major BF16 GEMV only");
        uint4 pre[R];
        GemvTaskAt t = {0, 0, 0, 0};
        if (task < n_tasks) {
            t = gemv_task_at<R>(task, nk, r_first, rpb, rows);
            const size_t kb0 = (size_t)t.r0 * cols + (size_t)t.k * kw;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r < t.nvalid && (kw >> 5) / V > 0) {
                    pre[r] = ldg_bf16x8(static_cast<const u16*>(w), kb0 + r * (size_t)cols, 0, lane);
                }
            }
        }
        kernel_entry();
        if (t.nvalid > 0) {  // warp-uniform
            gemv_task_store<FMT, V, PARTIALS, true>(w, scales, row0, x, out, part, rows, cols, kw, nk, t, lane, pre);
        }
        task += GEMV_WARPS;
    }
    for (; task < n_tasks; task += GEMV_WARPS) {
        const GemvTaskAt t = gemv_task_at<R>(task, nk, r_first, rpb, rows);
        if (t.nvalid <= 0) continue;  // warp-uniform
        gemv_task_store<FMT, V, PARTIALS, false>(w, scales, row0, x, out, part, rows, cols, kw, nk, t, lane, nullptr);
    }
    if (!PARTIALS) {
        __syncthreads();
        const int rl = threadIdx.x;
        if (rl < rpb && r_first + rl < rows) {
            float acc = C_ZERO;
            for (int k = 0; k < nk; ++k) acc = acc + part[rl * nk + k];
            out[r_first + rl] = acc;
        }
    }
}

// Dispatch on the layout argument (warp-uniform, once per kernel). WF: the kernel has not waited
// yet; the lane-major BF16 path loads weights first and waits itself, every other layout waits
// here, before anything else.
template <int FMT, bool PARTIALS, bool WF>
__device__ __forceinline__ void gemv_dispatch(const void* w, const void* scales, int row0, const float* x, float* out,
                                              int rows, int cols, int kw, int rpb, int vec, int bx = -1) {
    if (bx < 0) bx = blockIdx.x;
    if constexpr (FMT == FMT_BF16) {
        if (vec == 8) {
            gemv_tasks<FMT, 8, PARTIALS, WF>(w, scales, row0, x, out, rows, cols, kw, rpb, bx);
            return;
        }
    }
    if constexpr (WF) kernel_entry();
    if constexpr (FMT == FMT_E4M3) {
        if (vec == E4M3_BPL) {
            gemv_bpl<PARTIALS>(static_cast<const u8*>(w), static_cast<const float*>(scales), row0, x, out, rows, cols,
                               kw, rpb, bx);
            return;
        }
        if (vec == 16) {
            gemv_tasks<FMT, 16, PARTIALS, false>(w, scales, row0, x, out, rows, cols, kw, rpb, bx);
            return;
        }
    }
    if constexpr (FMT == FMT_BF16 || FMT == FMT_F32 || FMT == FMT_E4M3) {
        if (vec == 4) {
            gemv_tasks<FMT, 4, PARTIALS, false>(w, scales, row0, x, out, rows, cols, kw, rpb, bx);
            return;
        }
    }
    gemv_tasks<FMT, 0, PARTIALS, false>(w, scales, row0, x, out, rows, cols, kw, rpb, bx);
}

// ---- several matrices with the same input in one launch (the qkv seam's q, k, v, gate): the
// grid is the concatenation of each matrix's row blocks; block b runs block b - block_start[i]
// of matrix i, exactly the program of a separate launch.
#define GEMV_BATCH_MAX 4

struct GemvBatch {
    u64 w[GEMV_BATCH_MAX];
    u64 out[GEMV_BATCH_MAX];
    int rows[GEMV_BATCH_MAX];
    int block_start[GEMV_BATCH_MAX + 1];
    int count;
};

// WF: the matrix is chosen from the kernel parameters alone (no memory read), so before the wait;
// gemv_dispatch then loads weights first and waits.
template <int FMT, bool WF>
__device__ __forceinline__ void gemv_rows_batch(const GemvBatch& b, const float* x, int cols, int kw, int rpb, int vec) {
    // Constant indices only (a runtime index would copy the parameter block to local memory).
    const int bx = (int)blockIdx.x;
    u64 w = b.w[0], dst = b.out[0];
    int rows = b.rows[0], start = b.block_start[0], end = b.block_start[1];
#pragma unroll
    for (int j = 1; j < GEMV_BATCH_MAX; ++j) {
        if (j < b.count && b.block_start[j] <= bx) {
            w = b.w[j];
            dst = b.out[j];
            rows = b.rows[j];
            start = b.block_start[j];
            end = b.block_start[j + 1];
        }
    }
    if (bx >= start && bx < end) {  // block-uniform
        gemv_dispatch<FMT, false, WF>(reinterpret_cast<const void*>(w), 0, 0, x, reinterpret_cast<float*>(dst), rows,
                                      cols, kw, rpb, vec, bx - start);
        return;
    }
    if constexpr (WF) kernel_entry();  // a block past the batch (none in a valid launch) waits too
}

// 5 blocks per SM, not the 4 that 62 registers allow: 48 registers and 44 bytes of spill, and one
// more block's loads in flight per SM took the qkv seam 1.0-1.2 us shorter (ncu 23.4 -> 20.7 us per
// launch; docs/gpu/2026-12-06-h100/).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 5)
    gemv_rows_batch_bf16(const GemvBatch batch, const float* x, int cols, int kw, int rpb, int vec) {
    gemv_rows_batch<FMT_BF16, WEIGHTS_FIRST>(batch, x, cols, kw, rpb, vec);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_batch_f32(const GemvBatch batch, const float* x, int cols, int kw, int rpb, int vec) {
    kernel_entry();
    gemv_rows_batch<FMT_F32, false>(batch, x, cols, kw, rpb, vec);
}

// `out[r]` = fold over K-blocks of row r's partials (twins::gemv::gemv_rows).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_bf16(const u16* w, const float* x, float* out, int rows, int cols, int kw, int rpb, int vec) {
    gemv_dispatch<FMT_BF16, false, WEIGHTS_FIRST>(w, 0, 0, x, out, rows, cols, kw, rpb, vec);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_f32(const float* w, const float* x, float* out, int rows, int cols, int kw, int rpb, int vec) {
    kernel_entry();
    gemv_dispatch<FMT_F32, false, false>(w, 0, 0, x, out, rows, cols, kw, rpb, vec);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_e4m3(const u8* codes, const float* scales, int row0, const float* x, float* out, int rows, int cols,
                   int kw, int rpb, int vec) {
    kernel_entry();
    gemv_dispatch<FMT_E4M3, false, false>(codes, scales, row0, x, out, rows, cols, kw, rpb, vec);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_nvfp4(const u8* packed, const u8* scales, const float* x, float* out, int rows, int cols, int kw,
                    int rpb) {
    kernel_entry();
    gemv_dispatch<FMT_NVFP4, false, false>(packed, scales, 0, x, out, rows, cols, kw, rpb, 0);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_rows_w8(const signed char* q, const float* scales, const float* x, float* out, int rows, int cols, int kw,
                 int rpb) {
    kernel_entry();
    gemv_dispatch<FMT_W8, false, false>(q, scales, 0, x, out, rows, cols, kw, rpb, 0);
}

// `out[k * rows + r]` = partial of row r over K-block k (twins::gemv::gemv_partials).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_partials_bf16(const u16* w, const float* x, float* out, int rows, int cols, int kw, int rpb, int vec) {
    gemv_dispatch<FMT_BF16, true, WEIGHTS_FIRST>(w, 0, 0, x, out, rows, cols, kw, rpb, vec);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_partials_f32(const float* w, const float* x, float* out, int rows, int cols, int kw, int rpb, int vec) {
    kernel_entry();
    gemv_dispatch<FMT_F32, true, false>(w, 0, 0, x, out, rows, cols, kw, rpb, vec);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_partials_e4m3(const u8* codes, const float* scales, int row0, const float* x, float* out, int rows, int cols,
                       int kw, int rpb, int vec) {
    kernel_entry();
    gemv_dispatch<FMT_E4M3, true, false>(codes, scales, row0, x, out, rows, cols, kw, rpb, vec);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_partials_nvfp4(const u8* packed, const u8* scales, const float* x, float* out, int rows, int cols, int kw,
                        int rpb) {
    kernel_entry();
    gemv_dispatch<FMT_NVFP4, true, false>(packed, scales, 0, x, out, rows, cols, kw, rpb, 0);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    gemv_partials_w8(const signed char* q, const float* scales, const float* x, float* out, int rows, int cols,
                     int kw, int rpb) {
    kernel_entry();
    gemv_dispatch<FMT_W8, true, false>(q, scales, 0, x, out, rows, cols, kw, rpb, 0);
}

// ---- NUMERIC-CLASS arithmetic of QKV_FUSED (twins::gemv::gemv_rows_tree): per row, products
// padded with +0.0 to the next power of two P, reduced by a perfect binary tree of adjacent pairs.
// One block per row: thread t owns the aligned run [t·S, (t+1)·S) of the P leaves (a subtree),
// summed in order with a binary-counter stack (which builds exactly that subtree), then the
// T thread results are reduced level by level in shared memory.

#define TREE_THREADS 256

// Stored position of column c of view row r (either layout).
__device__ __forceinline__ size_t stored_index(int r, int c, int cols, int kw, int vec) {
    if (vec == 0) return (size_t)r * cols + c;
    const int k = c / kw;
    const int rem = c - k * kw;
    const int j = rem >> 5;
    const int l = rem & 31;
    return (size_t)r * cols + (size_t)k * kw + ((size_t)(j / vec) * 32 + l) * vec + (j % vec);
}

template <int FMT>
__device__ __forceinline__ void gemv_tree(const void* wv, const float* __restrict__ x, float* __restrict__ out,
                                          int rows, int cols, int kw, int vec) {
    __shared__ float red[TREE_THREADS];
    const int r = blockIdx.x;
    if (r >= rows) return;  // block-uniform
    int p_len = 1;
    while (p_len < cols) p_len <<= 1;
    const int n_threads = p_len < TREE_THREADS ? p_len : TREE_THREADS;
    const int seg = p_len / n_threads;
    const int tid = threadIdx.x;
    float v = C_ZERO;
    if (tid < n_threads) {
        float stack[32];
        const int c0 = tid * seg;
        for (int i = 0; i < seg; ++i) {
            const int c = c0 + i;
            float p = C_ZERO;
            if (c < cols) {
                const size_t at = stored_index(r, c, cols, kw, vec);
                const float wvalue = FMT == FMT_BF16 ? bf16_to_f32_c(static_cast<const u16*>(wv)[at])
                                                     : static_cast<const float*>(wv)[at];
                p = wvalue * x[c];
            }
            int lvl = 0;
            int bits = i;
            while (bits & 1) {
                p = stack[lvl] + p;
                ++lvl;
                bits >>= 1;
            }
            stack[lvl] = p;
        }
        int top = 0;
        while ((1 << top) < seg) ++top;
        v = stack[top];
    }
    red[tid] = v;
    __syncthreads();
    for (int len = n_threads >> 1; len >= 1; len >>= 1) {
        float s = C_ZERO;
        if (tid < len) s = red[2 * tid] + red[2 * tid + 1];
        __syncthreads();
        if (tid < len) red[tid] = s;
        __syncthreads();
    }
    if (tid == 0) out[r] = red[0];
}

extern "C" __global__ void __launch_bounds__(TREE_THREADS)
    gemv_rows_tree_bf16(const u16* w, const float* x, float* out, int rows, int cols, int kw, int vec) {
    kernel_entry();
    gemv_tree<FMT_BF16>(w, x, out, rows, cols, kw, vec);
}
extern "C" __global__ void __launch_bounds__(TREE_THREADS)
    gemv_rows_tree_f32(const float* w, const float* x, float* out, int rows, int cols, int kw, int vec) {
    kernel_entry();
    gemv_tree<FMT_F32>(w, x, out, rows, cols, kw, vec);
}

// TCOL_OPROJ: fold_f32 (forward) for `lanes` lanes in one launch; lane j's parts at
// j * parts_pitch, its output at j * out_pitch. Each value is exactly fold_f32's.
extern "C" __global__ void fold_lanes_f32(const float* parts, int parts_pitch, int n_parts, int width, int lanes,
                                          float* out, int out_pitch) {
    kernel_entry();
    const size_t total = (size_t)lanes * width;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t j = idx / width, i = idx % width;
        const float* pj = parts + j * parts_pitch;
        float acc = C_ZERO;
        for (int k = 0; k < n_parts; ++k) acc = acc + pj[(size_t)k * width + i];
        out[j * out_pitch + i] = acc;
    }
}

// ---- canonical fold of row-parallel partials (twins::gemv::fold_partials):
// out[i] = ((+0 + p[0][i]) + p[1][i]) + …; `reverse` is the CANARY order.
extern "C" __global__ void fold_f32(const float* parts, int n_parts, int width, int reverse, float* out) {
    kernel_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        float acc = C_ZERO;
        if (reverse) {
            for (int k = n_parts - 1; k >= 0; --k) acc = acc + parts[(size_t)k * width + i];
        } else {
            for (int k = 0; k < n_parts; ++k) acc = acc + parts[(size_t)k * width + i];
        }
        out[i] = acc;
    }
}
