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
#define ARGMAX_THREADS 256
// Values a thread loads before it compares the first (argmax_f32).
#define ARGMAX_BATCH 4
#define NO_INDEX 0xFFFFFFFFu
// Router candidates a thread scores per batch (router_body): 2 × ROUTER_THREADS covers `step`'s 288.
#define ROUTER_BATCH 2
// Router candidates a lane holds in registers (n <= 32 x this takes the register path).
#define ROUTER_LANE_CAND 16

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

// key_better as one unsigned 64-bit rank (larger ranks higher; 0 = no candidate): the upper word
// orders the key — NaN is 1, below every number; -0.0 counts as +0.0; a float's bits map to an
// unsigned order (negative: all bits flipped; otherwise the sign bit set) — and the lower word
// breaks ties by id (flipped when the lower id wins). Distinct ids give distinct ranks, so
// rank_code(a) > rank_code(b) exactly when key_better(a, b): a round of selection is a plain
// unsigned maximum.
__device__ __forceinline__ unsigned long long rank_code(float key, u32 id, bool higher_id) {
    if (id == NO_INDEX) return 0ull;
    u32 hi = 1u;
    if (!is_nan_c(key)) {
        const u32 b = __float_as_uint(key == C_ZERO ? C_ZERO : key);
        hi = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    }
    const u32 lo = higher_id ? id : ~id;
    return ((unsigned long long)hi << 32) | lo;
}

// The id of a non-zero rank_code.
__device__ __forceinline__ u32 rank_id(unsigned long long code, bool higher_id) {
    const u32 lo = (u32)code;
    return higher_id ? lo : ~lo;
}

__device__ __forceinline__ unsigned long long max_u64(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}

// The largest rank code of the warp, in every lane (the router's selection rounds, argmax's blocks).
__device__ __forceinline__ unsigned long long warp_max_code(unsigned long long c) {
    for (int o = 16; o > 0; o >>= 1) c = max_u64(c, __shfl_xor_sync(MEMRA_FULL_MASK, c, o));
    return c;
}

// The lane's rank codes in descending order: a bitonic network over ROUTER_LANE_CAND (a power of
// two) with constant indices, so the codes stay in registers. Zero codes (no candidate) sort last.
__device__ __forceinline__ void sort_codes_desc(unsigned long long (&c)[ROUTER_LANE_CAND]) {
    static_assert((ROUTER_LANE_CAND & (ROUTER_LANE_CAND - 1)) == 0, "a bitonic network needs a power of two");
#pragma unroll
    for (int size = 2; size <= ROUTER_LANE_CAND; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
#pragma unroll
            for (int i = 0; i < ROUTER_LANE_CAND; ++i) {
                const int l = i ^ stride;
                if (l > i) {
                    const unsigned long long a = c[i], b = c[l];
                    const bool swap = (i & size) == 0 ? a < b : a > b;
                    c[i] = swap ? b : a;
                    c[l] = swap ? a : b;
                }
            }
        }
    }
}

// Arg-best of (key, id) over one warp under key_better; every lane returns the winner.
__device__ __forceinline__ void warp_best(float& key, u32& id, bool higher_id) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ok = __shfl_xor_sync(MEMRA_FULL_MASK, key, o);
        const u32 oi = __shfl_xor_sync(MEMRA_FULL_MASK, id, o);
        if (key_better(ok, oi, key, id, higher_id)) {
            key = ok;
            id = oi;
        }
    }
}

// The k selection rounds by warp 0 from shared memory (any n): each lane scans its strided
// candidates not yet taken, a shuffle arg-best picks the winner.
__device__ __forceinline__ void router_select_scan(const float* keys, const float* scores, u32* taken, int n, int k,
                                                   int lane, bool variant, float& sel, u32& sel_id) {
    for (int slot = 0; slot < k; ++slot) {
        float key = C_ZERO;
        u32 id = NO_INDEX;
        for (int e = lane; e < n; e += 32) {
            if (taken[e]) continue;
            if (key_better(keys[e], (u32)e, key, id, variant)) {
                key = keys[e];
                id = (u32)e;
            }
        }
        warp_best(key, id, variant);
        if (lane == 0) taken[id] = 1u;
        __syncwarp();
        if (lane == (slot & 31)) {
            // k <= 32: one slot per lane (checked by the runtime).
            sel = scores[id];
            sel_id = id;
        }
    }
}

// Sigmoid top-k of one token; out = k ids (bits) then k weights. The whole block computes the
// scores and keys (the exps are the work); then warp 0 alone runs the k selection rounds from
// shared memory — each lane scans its strided candidates, a shuffle arg-best picks the winner,
// no block barrier per round. Selection under a strict total order is exact whatever the
// reduction tree. Dynamic shared memory: n scores, n keys, n taken flags (as u32).
//
// A thread scores candidates e = t, t + blockDim, ... in batches of ROUTER_BATCH, every load of a
// batch issued before the first exp (one candidate per loop iteration issued candidates 256..287
// of `step`'s 288 in a second run of loads: a second round trip). `bpre` holds the first batch's
// bias values (router_lane loads them before the kernel's wait: the bias is a weight).
__device__ __forceinline__ void router_body(const float* logits, const float* bias, const float (&bpre)[ROUTER_BATCH],
                                            int n, int k, int normalize, float scaling, float* out, bool variant) {
    extern __shared__ float smem[];
    float* scores = smem;
    float* keys = smem + n;
    u32* taken = reinterpret_cast<u32*>(smem + 2 * n);
    for (int base = threadIdx.x; base < n; base += ROUTER_BATCH * blockDim.x) {
        float lg[ROUTER_BATCH], bb[ROUTER_BATCH];
#pragma unroll
        for (int j = 0; j < ROUTER_BATCH; ++j) {
            const int e = base + j * blockDim.x;
            lg[j] = e < n ? logits[e] : C_ZERO;
            bb[j] = base == (int)threadIdx.x ? bpre[j] : (e < n ? bias[e] : C_ZERO);
        }
#pragma unroll
        for (int j = 0; j < ROUTER_BATCH; ++j) {
            const int e = base + j * blockDim.x;
            if (e >= n) break;
            const float s = variant ? sigmoid_dev_variant_c(lg[j]) : sigmoid_c(lg[j]);
            scores[e] = s;
            keys[e] = s + bb[j];
            taken[e] = 0u;
        }
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    float sel = C_ZERO;  // lane s < k keeps slot s's raw score
    u32 sel_id = 0u;
    if (n <= 32 * ROUTER_LANE_CAND) {
        // The lane's candidates e = lane + 32j live in registers as rank codes: a round is an
        // unsigned maximum over them and a 5-step shuffle maximum over the warp, and the winner's
        // owner drops it (code := 0, which never wins). Selection under a strict total order
        // picks the same expert in any order of comparisons.
        unsigned long long code[ROUTER_LANE_CAND];
#pragma unroll
        for (int j = 0; j < ROUTER_LANE_CAND; ++j) {
            const int e = lane + 32 * j;
            code[j] = e < n ? rank_code(keys[e], (u32)e, variant) : 0ull;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        // sm_80 and later: the lane's codes sorted once (largest first), so a lane's best is its
        // head; a round is the warp maximum of the heads in two 32-bit reductions — the upper words,
        // then the lower words of the lanes holding the top upper word: the same unsigned maximum
        // — and the winner pops its head. Each round used to take a 16-way maximum and a 5-step
        // 64-bit shuffle maximum in one dependent chain, k times over (ncu on one H100, step, b1:
        // 7.42 → 6.52 µs per launch, docs/gpu/2026-12-05-loads/).
        sort_codes_desc(code);
        for (int slot = 0; slot < k; ++slot) {
            const u32 hi = (u32)(code[0] >> 32);
            const u32 hmax = __reduce_max_sync(MEMRA_FULL_MASK, hi);
            const u32 lmax = __reduce_max_sync(MEMRA_FULL_MASK, hi == hmax ? (u32)code[0] : 0u);
            const unsigned long long best = ((unsigned long long)hmax << 32) | lmax;
            const u32 id = rank_id(best, variant);
            if (code[0] == best) {
#pragma unroll
                for (int j = 0; j + 1 < ROUTER_LANE_CAND; ++j) code[j] = code[j + 1];
                code[ROUTER_LANE_CAND - 1] = 0ull;
            }
            if (lane == (slot & 31)) {
                sel = scores[id];
                sel_id = id;
            }
        }
#else
        for (int slot = 0; slot < k; ++slot) {
            unsigned long long best = 0ull;
#pragma unroll
            for (int j = 0; j < ROUTER_LANE_CAND; ++j) best = max_u64(best, code[j]);
            best = warp_max_code(best);
            const u32 id = rank_id(best, variant);
#pragma unroll
            for (int j = 0; j < ROUTER_LANE_CAND; ++j) {
                if (code[j] == best) code[j] = 0ull;
            }
            if (lane == (slot & 31)) {
                sel = scores[id];
                sel_id = id;
            }
        }
#endif
    } else {
        router_select_scan(keys, scores, taken, n, k, lane, variant, sel, sel_id);
    }
    // The normalisation sum in slot order from +0.0 (every lane computes the same value).
    float sum = C_ZERO;
    for (int s = 0; s < k; ++s) sum = sum + __shfl_sync(MEMRA_FULL_MASK, sel, s);
    if (lane < k) {
        float wgt = sel;
        if (normalize) wgt = div_c(wgt, sum);
        out[lane] = __uint_as_float(sel_id);
        out[k + lane] = wgt * scaling;
    }
}

// One block per lane (blockIdx.z) of router_topk_f32 (VARIANT false) or router_topk_dev_f32.
// Weights first (WF): the bias is uploaded with the norm weights before any launch and no kernel
// writes it, so the thread's first batch of it is loaded before kernel_entry()'s wait (its round
// trip overlaps the tail of the router GEMV ahead); the logits and `out` only after the wait.
template <bool VARIANT, bool WF>
__device__ __forceinline__ void router_lane(const float* logits, const float* bias, int n, int k, int normalize,
                                            float scaling, float* out, const LanePitch& lp) {
    const int z = blockIdx.z;
    bias = LANE_AT(bias, lp, 1, z);
    float bpre[ROUTER_BATCH];
#pragma unroll
    for (int j = 0; j < ROUTER_BATCH; ++j) {
        const int e = threadIdx.x + j * blockDim.x;
        bpre[j] = e < n ? bias[e] : C_ZERO;
    }
    if constexpr (WF) kernel_entry();
    router_body(LANE_AT(logits, lp, 0, z), bias, bpre, n, k, normalize, scaling, LANE_AT(out, lp, 2, z), VARIANT);
}

// twins::moe::router_topk (k <= 32, one block per lane). Lane grid: blockIdx.z = lane, slices
// [logits, bias, out].
extern "C" __global__ void __launch_bounds__(ROUTER_THREADS)
    router_topk_f32(const float* logits, const float* bias, int n, int k, int normalize, float scaling, float* out,
                    const LanePitch lp) {
    router_lane<false, WEIGHTS_FIRST>(logits, bias, n, k, normalize, scaling, out, lp);
}

// twins::moe::router_topk_device_variant (the NUMERIC-CLASS DEV_ROUTER arithmetic); lanes as above.
extern "C" __global__ void __launch_bounds__(ROUTER_THREADS)
    router_topk_dev_f32(const float* logits, const float* bias, int n, int k, int normalize, float scaling,
                        float* out, const LanePitch lp) {
    router_lane<true, WEIGHTS_FIRST>(logits, bias, n, k, normalize, scaling, out, lp);
}

// out[i] = swiglu_c(gate[i], up[i], limit).
extern "C" __global__ void swiglu_f32(const float* gate, const float* up, int has_limit, float limit, float* out,
                                      int n) {
    kernel_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = swiglu_c(gate[i], up[i], has_limit, limit);
    }
}

// out[i] = Σ_s w[s] · y[s][i] in slot order from +0.0.
extern "C" __global__ void combine_f32(const float* y, const float* w, int slots, int width, float* out) {
    kernel_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        float acc = C_ZERO;
        for (int s = 0; s < slots; ++s) acc = acc + w[s] * y[(size_t)s * width + i];
        out[i] = acc;
    }
}

// The moe_join in one launch (twins::moe::combine_shared): out[i] = sum_s w[s] * y[s][i] in slot
// order from +0.0 over the k routed slots, out[width + i] = y[k][i] (the shared expert, copied).
extern "C" __global__ void combine_shared_f32(const float* y, const float* w, int k, int width, float* out) {
    kernel_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        float acc = C_ZERO;
        for (int s = 0; s < k; ++s) acc = acc + w[s] * y[(size_t)s * width + i];
        out[i] = acc;
        out[width + i] = y[(size_t)k * width + i];
    }
}

// NVFP4_DEV_ROUTES's moe_join in one launch (twins::moe::combine_scaled): combine_shared_f32 with
// each routed slot's down scale folded into its weight, read from the layer's table by the route
// id: out[i] = +0, then per slot s in order acc = acc + (w[s] * m_s) * y[s][i], m_s =
// macros[ids[s]] (1.0 for an id outside the table); out[width + i] = y[k][i].
extern "C" __global__ void combine_scaled_f32(const float* ids, const float* y, const float* w, const float* macros,
                                              int n_macros, int k, int width, float* out) {
    kernel_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        float acc = C_ZERO;
        for (int s = 0; s < k; ++s) {
            const u32 id = __float_as_uint(ids[s]);
            const float m = id < (u32)n_macros ? macros[id] : C_ONE;
            acc = acc + (w[s] * m) * y[(size_t)s * width + i];
        }
        out[i] = acc;
        out[width + i] = y[(size_t)k * width + i];
    }
}

// The residual in one launch (twins::moe::residual_add): sum = a + b, then out = h + sum.
// Lane grid: blockIdx.z = lane, slices [h, a, b, sum, out].
extern "C" __global__ void residual_add_f32(const float* h, const float* a, const float* b, float* sum, float* out,
                                            int n, const LanePitch lp) {
    kernel_entry();
    const int z = blockIdx.z;
    h = LANE_AT(h, lp, 0, z);
    a = LANE_AT(a, lp, 1, z);
    b = LANE_AT(b, lp, 2, z);
    sum = LANE_AT(sum, lp, 3, z);
    out = LANE_AT(out, lp, 4, z);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        // h is read with a and b, before sum is stored: placed after that store (which it may
        // alias), its load was issued only once a and b had arrived — a second round trip. The
        // values are the twin's, which reads every input first.
        const float hv = h[i];
        const float v = a[i] + b[i];
        sum[i] = v;
        out[i] = hv + v;
    }
}

// The rank code of value x[i] under argmax's order (value desc, index asc; -0.0 as +0.0); 0 for
// NaN, which never wins and never enters.
__device__ __forceinline__ unsigned long long argmax_code(float v, int i) {
    return is_nan_c(v) ? 0ull : rank_code(v, (u32)i, false);
}

// out[0] = bits of the index of the largest value (lowest index on ties, NaN never wins, 0 when
// every value is NaN or n == 0). Many blocks: block b reduces the values i = b*T + t, strided by
// the grid, to its best as one rank code (rank_code: the order as an unsigned maximum, the
// router's), and thread 0 folds it into one 64-bit word of scratch with an atomic maximum; the
// last block to finish (a counter in scratch) takes the word — resetting it — and writes the
// index. A strict total order, so any grid and any arrival order give the host's index. One
// atomic per block and one read of one word, where the last block used to read every block's
// pair and reduce them again (6.6 -> 4.1 us per launch on one H100 under ncu's flush, alone).
// `scratch`: word 0 the counter, words 2..3 the code (8-byte aligned); both zero at launch (the
// runtime zeroes the scratch once; every launch leaves them zero).
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_f32(const float* x, int n, float* out,
                                                                       u32* scratch) {
    kernel_entry();
    __shared__ unsigned long long s_code[ARGMAX_THREADS / 32];
    unsigned long long best = 0ull;
    // ARGMAX_BATCH loads in flight before the first comparison (a load-then-compare loop waits a
    // memory round trip per element). At the runtime's grid a 32,768 vocabulary is one value per
    // thread (the batch is idle there); it matters above 128 × 256 values.
    const int stride = gridDim.x * blockDim.x;
    for (int base = blockIdx.x * blockDim.x + threadIdx.x; base < n; base += ARGMAX_BATCH * stride) {
        float v[ARGMAX_BATCH];
#pragma unroll
        for (int j = 0; j < ARGMAX_BATCH; ++j) {
            const int i = base + j * stride;
            v[j] = i < n ? x[i] : C_ZERO;
        }
#pragma unroll
        for (int j = 0; j < ARGMAX_BATCH; ++j) {
            const int i = base + j * stride;
            if (i < n) best = max_u64(best, argmax_code(v[j], i));
        }
    }
    best = warp_max_code(best);
    if ((threadIdx.x & 31) == 0) s_code[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x >= 32) return;
    best = warp_max_code(threadIdx.x < ARGMAX_THREADS / 32 ? s_code[threadIdx.x] : 0ull);
    if (threadIdx.x != 0) return;
    unsigned long long* word = reinterpret_cast<unsigned long long*>(scratch + 2);
    atomicMax(word, best);
    __threadfence();
    if (atomicAdd(scratch, 1u) != gridDim.x - 1) return;
    __threadfence();
    const unsigned long long code = atomicExch(word, 0ull);
    out[0] = __uint_as_float(code == 0ull ? 0u : rank_id(code, false));
    scratch[0] = 0u;
}
