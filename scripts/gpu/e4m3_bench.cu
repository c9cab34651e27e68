// E4M3 GEMV work distributions, one H200: the lane-major kernel of gemv.cu (lanes share a scale
// block, one butterfly per block) against a block-per-lane kernel (one lane owns a whole 128-column
// scale block and evaluates the SAME dot32 tree alone), on the step model's expert gate/up shape.
// Both must give the same bits; the question is which reaches HBM speed.
//
// This file is the record of the experiment (docs/gpu/2026-12-03-e4m3/): its variants are kept as
// they were measured. What shipped from it — the v2 kernel — lives in kernels/cuda/gemv.cu
// (`bpl_stage_x`, `bpl_dot`, `bpl_pairs`, `gemv_bpl`); change that, not this.
//
// Build and run on the GPU machine (nvcc there):
//   nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -I kernels/cuda \
//        -o /tmp/e4m3_bench scripts/gpu/e4m3_bench.cu && /tmp/e4m3_bench
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "canon.cuh"
#include "gemv.cu"

#include "cuda_check.cuh"

// ---- block-per-lane layout: pair q = r * nb + b (row r, scale block b); chunk = q / 32, l = q % 32;
// 16-byte vector g (0..7) of pair q at byte ((chunk * 8 + g) * 32 + l) * 16; byte 4j + i of vector
// g is element m + 32 i of the block, m = 4g + j (so word j of vector g holds lane sum m's codes).
__host__ __device__ inline size_t bpl_offset(size_t q, int g, int j, int i) {
    return (((q / 32) * 8 + g) * 32 + (q % 32)) * 16 + 4 * j + i;
}

// Shared x of one block of 128 columns, permuted so vector g's 16 values are contiguous:
// xs[b * XS_PITCH + 4m + i] = x[b * 128 + m + 32 i]; the pitch skews blocks across banks.
#define XS_PITCH 132

template <int CVT>
__device__ __forceinline__ void decode4(u32 w, float* d) {
    if (CVT) {
        e4m3x4_decode_finite(w, d);
    } else {
#pragma unroll
        for (int t = 0; t < 4; ++t) d[t] = e4m3_decode_finite((w >> (8 * t)) & 0xFFu);
    }
}

// The dot32 of one scale block by one thread: v_m = (((0 + p_m) + p_{m+32}) + p_{m+64}) + p_{m+96},
// then the butterfly's tree as lane 0 evaluates it (level o: v_l = v_l + v_{l+o}).
template <int CVT>
__device__ __forceinline__ float block_dot(const uint4* codes, const float* xs) {
    float v[32];
#pragma unroll
    for (int g = 0; g < 8; ++g) {
        const uint4 q = codes[g];
        const u32 wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float d[4];
            decode4<CVT>(wd[j], d);
            const float4 xv = *reinterpret_cast<const float4*>(xs + 16 * g + 4 * j);
            float acc = C_ZERO;
            acc = acc + d[0] * xv.x;
            acc = acc + d[1] * xv.y;
            acc = acc + d[2] * xv.z;
            acc = acc + d[3] * xv.w;
            v[4 * g + j] = acc;
        }
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
#pragma unroll
        for (int l = 0; l < o; ++l) v[l] = v[l] + v[l + o];
    }
    return v[0];
}

// Rows mode: block bx owns rows bx*rpb ..; out[r] = fold over K-blocks (from +0) of the K-block
// partials, each a fold (from +0) of scale * dot over its scale blocks in order.
template <int CVT>
__global__ void __launch_bounds__(256) gemv_rows_e4m3_bpl(const u8* __restrict__ codes, const float* __restrict__ scales,
                                                          const float* __restrict__ x, float* __restrict__ out,
                                                          int rows, int cols, int kw, int rpb) {
    extern __shared__ float sm[];
    const int nb = cols / E4M3_BLOCK;
    float* xs = sm;                    // nb * XS_PITCH
    float* sv = sm + nb * XS_PITCH;    // rpb * nb
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int b = c / E4M3_BLOCK, e = c % E4M3_BLOCK, m = e & 31, i = e >> 5;
        xs[b * XS_PITCH + 4 * m + i] = x[c];
    }
    __syncthreads();
    const int r_first = blockIdx.x * rpb;
    const int nrows = min(rpb, rows - r_first);
    const int npairs = nrows * nb;
    const size_t q0 = (size_t)r_first * nb;
    const int scale_cols = nb;
    for (int ql = threadIdx.x; ql < ((npairs + 31) & ~31); ql += blockDim.x) {
        if (ql >= npairs) continue;
        const size_t q = q0 + ql;
        uint4 c[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) c[g] = __ldg(reinterpret_cast<const uint4*>(codes + bpl_offset(q, g, 0, 0)));
        const int r = (int)(q / nb), b = (int)(q % nb);
        const float d = block_dot<CVT>(c, xs + b * XS_PITCH);
        sv[ql] = __ldg(scales + (size_t)(r / E4M3_BLOCK) * scale_cols + b) * d;
    }
    __syncthreads();
    const int rl = threadIdx.x;
    if (rl < nrows) {
        const int bk = kw / E4M3_BLOCK, nk = cols / kw;
        float acc = C_ZERO;
        for (int k = 0; k < nk; ++k) {
            float kacc = C_ZERO;
            for (int j = 0; j < bk; ++j) kacc = kacc + sv[rl * nb + k * bk + j];
            acc = acc + kacc;
        }
        out[r_first + rl] = acc;
    }
}


// ---- v2: m in bit-reversed order (the butterfly's tree becomes a left-to-right stack), pairs of a
// warp in 32-pair chunks with the next chunk's codes loaded while this one computes.
__host__ __device__ inline int brev5(int m) {
    return ((m & 1) << 4) | ((m & 2) << 2) | (m & 4) | ((m & 8) >> 2) | ((m & 16) >> 4);
}
// byte 4j + i of vector g of pair q: element brev5(4g + j) + 32 i.
__host__ __device__ inline size_t bpl2_offset(size_t q, int g, int j, int i) { return bpl_offset(q, g, j, i); }

template <int CVT>
__device__ __forceinline__ float block_dot2(const uint4* codes, const float* xs) {
    // Stack of the butterfly tree in bit-reversed leaf order: leaf n (n = 0..31) is v_{brev5(n)};
    // combining the two newest entries of equal height reproduces (v_a + v_b) with a the lower lane.
    float st[6];
    int h[6];
    int top = 0;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
        const uint4 q = codes[g];
        const u32 wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float d[4];
            decode4<CVT>(wd[j], d);
            const float4 xv = *reinterpret_cast<const float4*>(xs + 16 * g + 4 * j);
            float acc = C_ZERO;
            acc = acc + d[0] * xv.x;
            acc = acc + d[1] * xv.y;
            acc = acc + d[2] * xv.z;
            acc = acc + d[3] * xv.w;
            const int n = 4 * g + j;
            // leaf n; merge while the trailing ones of n+1 say a subtree closed.
            float v = acc;
            int m = n;
#pragma unroll
            for (int lv = 0; lv < 5; ++lv) {
                if (m & 1) {
                    v = st[top - 1] + v;  // lower lane first: the earlier leaf has the smaller lane
                    --top;
                    m >>= 1;
                } else {
                    break;
                }
            }
            st[top] = v;
            h[top] = 0;
            ++top;
        }
    }
    (void)h;
    return st[0];
}

template <int CVT, int PREFETCH>
__global__ void __launch_bounds__(256, 2) gemv_rows_e4m3_bpl2(const u8* __restrict__ codes,
                                                             const float* __restrict__ scales,
                                                             const float* __restrict__ x, float* __restrict__ out,
                                                             int rows, int cols, int kw, int rpb) {
    extern __shared__ float sm[];
    const int nb = cols / E4M3_BLOCK;
    float* xs = sm;
    float* sv = sm + nb * XS_PITCH;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int b = c / E4M3_BLOCK, e = c % E4M3_BLOCK, m = e & 31, i = e >> 5;
        xs[b * XS_PITCH + 4 * brev5(m) + i] = x[c];
    }
    __syncthreads();
    const int r_first = blockIdx.x * rpb;
    const int nrows = min(rpb, rows - r_first);
    const int npairs = nrows * nb;
    const size_t q0 = (size_t)r_first * nb;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nchunks = (npairs + 31) / 32;
    uint4 cur[8], nxt[8];
    int ch = warp;
    auto load = [&](int chunk, uint4* c) {
        const int ql = chunk * 32 + lane;
        if (chunk < nchunks && ql < npairs) {
#pragma unroll
            for (int g = 0; g < 8; ++g)
                c[g] = __ldg(reinterpret_cast<const uint4*>(codes + bpl_offset(q0 + ql, g, 0, 0)));
        }
    };
    load(ch, cur);
    for (; ch < nchunks; ch += 8) {
        if (PREFETCH) load(ch + 8, nxt);
        const int ql = ch * 32 + lane;
        if (ql < npairs) {
            const size_t q = q0 + ql;
            const int r = (int)(q / nb), b = (int)(q % nb);
            const float d = block_dot2<CVT>(cur, xs + b * XS_PITCH);
            sv[ql] = __ldg(scales + (size_t)(r / E4M3_BLOCK) * nb + b) * d;
        }
        if (PREFETCH) {
#pragma unroll
            for (int g = 0; g < 8; ++g) cur[g] = nxt[g];
        } else {
            load(ch + 8, cur);
        }
    }
    __syncthreads();
    for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) {
        const int bk = kw / E4M3_BLOCK, nk = cols / kw;
        float acc = C_ZERO;
        for (int k = 0; k < nk; ++k) {
            float kacc = C_ZERO;
            for (int j = 0; j < bk; ++j) kacc = kacc + sv[rl * nb + k * bk + j];
            acc = acc + kacc;
        }
        out[r_first + rl] = acc;
    }
}

// ---- v3: codes reach shared memory through cp.async (STAGES chunks in flight per warp), so the
// bytes in flight no longer cost registers; each lane reads back only the 128 bytes it copied.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <int CVT>
__device__ __forceinline__ float block_dot3(const uint4* codes, const float* xs) {
    float st[6];
    int top = 0;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
        const uint4 q = codes[g * 32];
        const u32 wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float d[4];
            decode4<CVT>(wd[j], d);
            const float4 xv = *reinterpret_cast<const float4*>(xs + 16 * g + 4 * j);
            float acc = C_ZERO;
            acc = acc + d[0] * xv.x;
            acc = acc + d[1] * xv.y;
            acc = acc + d[2] * xv.z;
            acc = acc + d[3] * xv.w;
            float v = acc;
            int m = 4 * g + j;
#pragma unroll
            for (int lv = 0; lv < 5; ++lv) {
                if (m & 1) {
                    v = st[top - 1] + v;
                    --top;
                    m >>= 1;
                } else {
                    break;
                }
            }
            st[top] = v;
            ++top;
        }
    }
    return st[0];
}

template <int CVT, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32) gemv_rows_e4m3_bpl3(const u8* __restrict__ codes,
                                                                  const float* __restrict__ scales,
                                                                  const float* __restrict__ x,
                                                                  float* __restrict__ out, int rows, int cols,
                                                                  int kw, int rpb) {
    extern __shared__ uint4 smq[];
    const int nb = cols / E4M3_BLOCK;
    uint4* ring = smq;  // [WARPS][STAGES][8 g][32 lanes]
    float* xs = reinterpret_cast<float*>(smq + WARPS * STAGES * 256);
    float* sv = xs + nb * XS_PITCH;
    const int r_first = blockIdx.x * rpb;
    const int nrows = max(0, min(rpb, rows - r_first));
    const int npairs = nrows * nb;
    const size_t q0 = (size_t)r_first * nb;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nchunks = (npairs + 31) / 32;
    auto issue = [&](int it) {
        const int ch = warp + it * WARPS;
        const int ql = ch * 32 + lane;
        if (ch < nchunks && ql < npairs) {
            uint4* dst = ring + ((warp * STAGES + it % STAGES) * 8) * 32 + lane;
#pragma unroll
            for (int g = 0; g < 8; ++g) cp_async16(dst + g * 32, codes + bpl_offset(q0 + ql, g, 0, 0));
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) issue(i);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int b = c / E4M3_BLOCK, e = c % E4M3_BLOCK, m = e & 31, i = e >> 5;
        xs[b * XS_PITCH + 4 * brev5(m) + i] = x[c];
    }
    __syncthreads();
    for (int it = 0; warp + it * WARPS < nchunks; ++it) {
        issue(it + STAGES - 1);  // into the stage chunk it - 1 used (this lane read it already)
        cp_async_wait<STAGES - 1>();
        const int ql = (warp + it * WARPS) * 32 + lane;
        if (ql < npairs) {
            const size_t q = q0 + ql;
            const int r = (int)(q / nb), b = (int)(q % nb);
            const float d = block_dot3<CVT>(ring + ((warp * STAGES + it % STAGES) * 8) * 32 + lane, xs + b * XS_PITCH);
            sv[ql] = __ldg(scales + (size_t)(r / E4M3_BLOCK) * nb + b) * d;
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) {
        const int bk = kw / E4M3_BLOCK, nk = cols / kw;
        float acc = C_ZERO;
        for (int k = 0; k < nk; ++k) {
            float kacc = C_ZERO;
            for (int j = 0; j < bk; ++j) kacc = kacc + sv[rl * nb + k * bk + j];
            acc = acc + kacc;
        }
        out[r_first + rl] = acc;
    }
}

// ---- v4: v2 with 32-bit index math inside the block (no 64-bit division per pair) and P pairs per
// thread in flight (P chunks' codes loaded before any is computed).
template <int CVT, int P>
__global__ void __launch_bounds__(256, 2) gemv_rows_e4m3_bpl4(const u8* __restrict__ codes,
                                                             const float* __restrict__ scales,
                                                             const float* __restrict__ x, float* __restrict__ out,
                                                             int rows, int cols, int kw, int rpb) {
    extern __shared__ float sm[];
    const int nb = cols / E4M3_BLOCK;
    float* xs = sm;
    float* sv = sm + nb * XS_PITCH;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int b = c / E4M3_BLOCK, e = c % E4M3_BLOCK, m = e & 31, i = e >> 5;
        xs[b * XS_PITCH + 4 * brev5(m) + i] = x[c];
    }
    const int r_first = blockIdx.x * rpb;
    const int nrows = min(rpb, rows - r_first);
    const int npairs = nrows * nb;
    // The block's pairs start at a chunk boundary when r_first * nb is a multiple of 32.
    const uint4* base = reinterpret_cast<const uint4*>(codes) + (size_t)r_first * nb * 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nchunks = (npairs + 31) / 32;
    const int srow0 = r_first / E4M3_BLOCK;
    __syncthreads();
    for (int ch0 = warp; ch0 < nchunks; ch0 += 8 * P) {
        uint4 c[P][8];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int ch = ch0 + 8 * p;
            if (ch < nchunks && ch * 32 + lane < npairs) {
#pragma unroll
                for (int g = 0; g < 8; ++g) c[p][g] = __ldg(base + (ch * 8 + g) * 32 + lane);
            }
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int ql = (ch0 + 8 * p) * 32 + lane;
            if (ch0 + 8 * p < nchunks && ql < npairs) {
                const int rl = ql / nb, b = ql - rl * nb;
                const float d = block_dot2<CVT>(c[p], xs + b * XS_PITCH);
                sv[ql] = __ldg(scales + (size_t)((r_first + rl) / E4M3_BLOCK) * nb + b) * d;
            }
        }
    }
    (void)srow0;
    __syncthreads();
    for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) {
        const int bk = kw / E4M3_BLOCK, nk = cols / kw;
        float acc = C_ZERO;
        for (int k = 0; k < nk; ++k) {
            float kacc = C_ZERO;
            for (int j = 0; j < bk; ++j) kacc = kacc + sv[rl * nb + k * bk + j];
            acc = acc + kacc;
        }
        out[r_first + rl] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3)
    lm_rows(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw, int rpb) {
    gemv_dispatch<FMT_E4M3, false, false>(codes, scales, 0, x, out, rows, cols, kw, rpb, 16);
}

static u8 rand_code(unsigned& s) {
    for (;;) {
        s = s * 1664525u + 1013904223u;
        const u8 c = (u8)(s >> 24);
        if ((c & 0x7F) != 0x7F) return c;
    }
}

int main() {
    const int rows = 23040, cols = 4096, kw = 512, nb = cols / 128;
    const size_t n = (size_t)rows * cols;
    std::vector<u8> rm(n), lm(n), bpl(n), bpl2(n);
    unsigned s = 12345u;
    for (size_t i = 0; i < n; ++i) rm[i] = rand_code(s);
    // lane-major V=16 for kw = 512: column c = j*32 + l of a K-block at (j/16*32 + l)*16 + j%16.
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const int k = c / kw, rem = c % kw, j = rem >> 5, l = rem & 31;
            lm[(size_t)r * cols + k * kw + ((j / 16) * 32 + l) * 16 + j % 16] = rm[(size_t)r * cols + c];
            const int b = c / 128, e = c % 128, m = e & 31, i = e >> 5;
            bpl[bpl_offset((size_t)r * nb + b, m / 4, m % 4, i)] = rm[(size_t)r * cols + c];
            const int n2 = brev5(m);
            bpl2[bpl_offset((size_t)r * nb + b, n2 / 4, n2 % 4, i)] = rm[(size_t)r * cols + c];
        }
    const int srows = (rows + 127) / 128;
    std::vector<float> sc((size_t)srows * nb), xh(cols);
    for (auto& v : sc) { s = s * 1664525u + 1013904223u; v = 0.001f + (float)(s >> 8) * 1e-9f; }
    for (auto& v : xh) { s = s * 1664525u + 1013904223u; v = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f; }
    u8 *d_lm, *d_bpl, *d_bpl2;
    float *d_sc, *d_x, *d_o1, *d_o2;
    CK(cudaMalloc(&d_lm, n)); CK(cudaMalloc(&d_bpl, n)); CK(cudaMalloc(&d_bpl2, n));
    CK(cudaMalloc(&d_sc, sc.size() * 4)); CK(cudaMalloc(&d_x, cols * 4));
    CK(cudaMalloc(&d_o1, rows * 4)); CK(cudaMalloc(&d_o2, rows * 4));
    CK(cudaMemcpy(d_lm, lm.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_bpl, bpl.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_bpl2, bpl2.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_sc, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_x, xh.data(), cols * 4, cudaMemcpyHostToDevice));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    auto timeit = [&](const char* name, double bytes, auto launch) {
        for (int i = 0; i < 3; ++i) launch();
        CK(cudaDeviceSynchronize());
        std::vector<float> ms;
        for (int i = 0; i < 21; ++i) {
            CK(cudaEventRecord(a)); launch(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
            float t; CK(cudaEventElapsedTime(&t, a, b)); ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double us = ms[10] * 1000.0;
        printf("%-28s median %8.1f us  %6.2f TB/s\n", name, us, bytes / (us * 1e-6) / 1e12);
    };
    timeit("lane-major rpb4 (today)", (double)n, [&] { lm_rows<<<rows / 4, 256>>>(d_lm, d_sc, d_x, d_o1, rows, cols, kw, 4); });
    std::vector<float> o1(rows), o2(rows);
    CK(cudaMemcpy(o1.data(), d_o1, rows * 4, cudaMemcpyDeviceToHost));
    auto check = [&](const char* what) {
        CK(cudaGetLastError());
        CK(cudaMemcpy(o2.data(), d_o2, rows * 4, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < rows; ++r) bad += memcmp(&o1[r], &o2[r], 4) != 0;
        printf("    %s: rows differing from lane-major: %d of %d\n", what, bad, rows);
    };
    {
        const int rpb = 16;
        const size_t smem = ((size_t)nb * XS_PITCH + (size_t)rpb * nb) * 4;
        CK(cudaMemset(d_o2, 0xFF, rows * 4));
        timeit("v1 block-per-lane rpb16 cvt", (double)n, [&] { gemv_rows_e4m3_bpl<1><<<(rows + rpb - 1) / rpb, 256, smem>>>(d_bpl, d_sc, d_x, d_o2, rows, cols, kw, rpb); });
        check("v1");
    }
    {
        const int rpb = 32;
        const size_t smem = ((size_t)nb * XS_PITCH + (size_t)rpb * nb) * 4;
        const int grid = (rows + rpb - 1) / rpb;
        CK(cudaMemset(d_o2, 0xFF, rows * 4));
        timeit("v2 rpb32 cvt", (double)n, [&] { gemv_rows_e4m3_bpl2<1, 0><<<grid, 256, smem>>>(d_bpl2, d_sc, d_x, d_o2, rows, cols, kw, rpb); });
        check("v2");
    }
    auto v4run = [&](auto kern, int rpb, const char* what) {
        const int grid = (rows + rpb - 1) / rpb;
        const size_t smem = ((size_t)nb * XS_PITCH + (size_t)rpb * nb) * 4;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        char name[96];
        snprintf(name, sizeof name, "v4 %s rpb%d", what, rpb);
        CK(cudaMemset(d_o2, 0xFF, rows * 4));
        timeit(name, (double)n, [&] { kern<<<grid, 256, smem>>>(d_bpl2, d_sc, d_x, d_o2, rows, cols, kw, rpb); });
        check(name);
    };
    for (int rpb : {32, 64}) {
        v4run(gemv_rows_e4m3_bpl4<1, 1>, rpb, "cvt P1");
        v4run(gemv_rows_e4m3_bpl4<1, 2>, rpb, "cvt P2");
        v4run(gemv_rows_e4m3_bpl4<0, 1>, rpb, "bits P1");
    }
    const size_t big = (size_t)1 << 30;
    u8 *p1, *p2;
    CK(cudaMalloc(&p1, big)); CK(cudaMalloc(&p2, big));
    timeit("d2d copy 1 GiB (read+write)", 2.0 * big, [&] { CK(cudaMemcpyAsync(p2, p1, big, cudaMemcpyDeviceToDevice)); });
    return 0;
}
