// Router, SwiGLU, weighted slot combine, argmax: the device twins of `twins/moe.rs`.
//
// Selection is a parallel arg-max under the same strict total order the host's sequential scan
// implements (non-NaN above NaN; larger key first; equal keys — with -0.0 == +0.0 — by expert
// id, lower first for the canonical router, higher first for the DEV_ROUTER variant), so any
// reduction tree picks the host's expert. Sums that decide bits (the normalisation, the combine)
// run in slot order in one thread per output value.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

#define ROUTER_THREADS 256
#define ARGMAX_THREADS 1024
#define NO_INDEX 0xFFFFFFFFu

// twins::moe::sigmoid_device_variant.
__device__ __forceinline__ float sigmoid_dev_variant_c(float x) {
    if (x < C_ZERO) {
        const float e = exp_c(x);
        return div_c(e, C_ONE + e);
    }
    const float e = exp_c(-x);
    return C_HALF * (C_ONE + div_c(C_ONE - e, C_ONE + e));
}

// Whether (ka, ia) ranks strictly above (kb, ib). NO_INDEX ranks below everything.
__device__ __forceinline__ bool key_better(float ka, u32 ia, float kb, u32 ib, bool higher_id) {
    if (ia == NO_INDEX) return false;
    if (ib == NO_INDEX) return true;
    const bool na = is_nan_c(ka);
    const bool nb = is_nan_c(kb);
    if (na && nb) return higher_id ? ia > ib : ia < ib;
    if (na) return false;
    if (nb) return true;
    if (ka > kb) return true;
    if (ka < kb) return false;
    return higher_id ? ia > ib : ia < ib;
}

// Block-wide arg-best of (key, id) under key_better; every thread returns the winner.
__device__ __forceinline__ void block_best(float& key, u32& id, bool higher_id, float* s_key, u32* s_id) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ok = __shfl_xor_sync(MEMRA_FULL_MASK, key, o);
        const u32 oi = __shfl_xor_sync(MEMRA_FULL_MASK, id, o);
        if (key_better(ok, oi, key, id, higher_id)) {
            key = ok;
            id = oi;
        }
    }
    const int warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        s_key[warp] = key;
        s_id[warp] = id;
    }
    __syncthreads();
    key = s_key[0];
    id = s_id[0];
    for (int w = 1; w < n_warps; ++w) {
        if (key_better(s_key[w], s_id[w], key, id, higher_id)) {
            key = s_key[w];
            id = s_id[w];
        }
    }
}

// Sigmoid top-k of one token; out = k ids (bits) then k weights. Dynamic shared memory:
// n scores, n keys, n taken flags (as u32).
__device__ __forceinline__ void router_body(const float* logits, const float* bias, int n, int k, int normalize,
                                            float scaling, float* out, bool variant) {
    extern __shared__ float smem[];
    float* scores = smem;
    float* keys = smem + n;
    u32* taken = reinterpret_cast<u32*>(smem + 2 * n);
    __shared__ float s_key[ROUTER_THREADS / 32];
    __shared__ u32 s_id[ROUTER_THREADS / 32];
    __shared__ float sel[64];
    __shared__ u32 sel_id[64];
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const float s = variant ? sigmoid_dev_variant_c(logits[e]) : sigmoid_c(logits[e]);
        scores[e] = s;
        keys[e] = s + bias[e];
        taken[e] = 0u;
    }
    __syncthreads();
    for (int slot = 0; slot < k; ++slot) {
        float key = C_ZERO;
        u32 id = NO_INDEX;
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            if (taken[e]) continue;
            if (key_better(keys[e], (u32)e, key, id, variant)) {
                key = keys[e];
                id = (u32)e;
            }
        }
        block_best(key, id, variant, s_key, s_id);
        if (threadIdx.x == 0) {
            taken[id] = 1u;
            sel_id[slot] = id;
            sel[slot] = scores[id];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (normalize) {
            float sum = C_ZERO;
            for (int s = 0; s < k; ++s) sum = sum + sel[s];
            for (int s = 0; s < k; ++s) sel[s] = div_c(sel[s], sum);
        }
        for (int s = 0; s < k; ++s) {
            out[s] = __uint_as_float(sel_id[s]);
            out[k + s] = sel[s] * scaling;
        }
    }
}

// twins::moe::router_topk (k <= 64, one block).
extern "C" __global__ void __launch_bounds__(ROUTER_THREADS)
    router_topk_f32(const float* logits, const float* bias, int n, int k, int normalize, float scaling, float* out) {
    router_body(logits, bias, n, k, normalize, scaling, out, false);
}

// twins::moe::router_topk_device_variant (the NUMERIC-CLASS DEV_ROUTER arithmetic).
extern "C" __global__ void __launch_bounds__(ROUTER_THREADS)
    router_topk_dev_f32(const float* logits, const float* bias, int n, int k, int normalize, float scaling,
                        float* out) {
    router_body(logits, bias, n, k, normalize, scaling, out, true);
}

// out[i] = swiglu_c(gate[i], up[i], limit).
extern "C" __global__ void swiglu_f32(const float* gate, const float* up, int has_limit, float limit, float* out,
                                      int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = swiglu_c(gate[i], up[i], has_limit, limit);
    }
}

// out[i] = Σ_s w[s] · y[s][i] in slot order from +0.0.
extern "C" __global__ void combine_f32(const float* y, const float* w, int slots, int width, float* out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        float acc = C_ZERO;
        for (int s = 0; s < slots; ++s) acc = acc + w[s] * y[(size_t)s * width + i];
        out[i] = acc;
    }
}

// out[0] = bits of the index of the largest value (lowest index on ties, NaN never wins, 0 when
// every value is NaN or n == 0). One block.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_f32(const float* x, int n, float* out) {
    __shared__ float s_val[ARGMAX_THREADS / 32];
    __shared__ u32 s_idx[ARGMAX_THREADS / 32];
    float best = C_ZERO;
    u32 idx = NO_INDEX;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[i];
        if (is_nan_c(v)) continue;
        if (idx == NO_INDEX || v > best) {
            best = v;
            idx = (u32)i;
        }
    }
    // NaN never enters, so key_better's order is value desc, index asc.
    block_best(best, idx, false, s_val, s_idx);
    if (threadIdx.x == 0) out[0] = __uint_as_float(idx == NO_INDEX ? 0u : idx);
}
