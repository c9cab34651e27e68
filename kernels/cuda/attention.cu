// Per-head q/k RMSNorm + NeoX RoPE, and partitioned decode attention with a per-head gate: the
// device twins of `twins/attention.rs`.
//
// Heads never interact, so sharding heads over ranks changes nothing; the KV sequence is cut into
// fixed partitions of ATTN_PARTITION positions combined in order, so the split of the sequence is
// a property of the program, not of the launch.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

#define HEAD_DIM 128
#define ATTN_PARTITION 32
#define ATTN_THREADS 128
// 1/sqrt(128) (twins::attention::ATTN_SCALE_BITS).
#define C_ATTN_SCALE __uint_as_float(0x3DB504F3u)
// 128.0, the RMSNorm width of a head.
#define C_HEAD_DIM_F __uint_as_float(0x43000000u)

// One head: y = rmsnorm_c(x_h, w, eps) (dot32 over 128 values by one warp), then NeoX RoPE with
// cos_sin = [64 cos][64 sin]: y[i] = a*c - b*s, y[i+64] = b*c + a*s for i < 64. Lane l holds
// elements l, l+32, l+64, l+96 (its dot32 lane and both of its rotation pairs): `v` and `wv` are
// the lane's values of x_h and w (rope_head_load). Every cos/sin value is loaded before the first
// store (the k = 1 pair's loads, placed after the k = 0 stores they may alias, were issued only
// once the k = 0 values had arrived: a second round trip), so `out` may alias x_h or cos_sin.
// `out2` (may be null) receives a copy.
__device__ __forceinline__ void rope_head_vals(const float (&v)[4], const float (&wv)[4], float* out, float* out2,
                                               float eps, const float* cos_sin, int lane) {
    float cs[4];  // c(lane), c(lane + 32), s(lane), s(lane + 32)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        cs[k] = cos_sin[lane + 32 * k];
        cs[k + 2] = cos_sin[64 + lane + 32 * k];
    }
    float acc = C_ZERO;
#pragma unroll
    for (int k = 0; k < 4; ++k) acc = acc + v[k] * v[k];
    const float ss = butterfly32(acc);
    const float inv = rsqrt_c(div_c(ss, C_HEAD_DIM_F) + eps);
    float nrm[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) nrm[k] = (v[k] * inv) * wv[k];
    // pairs (i, i+64) for i = lane (k = 0, 2) and i = lane + 32 (k = 1, 3)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int i = lane + 32 * k;
        const float c = cs[k];
        const float s = cs[k + 2];
        const float a = nrm[k];
        const float b = nrm[k + 2];
        const float lo = a * c - b * s;
        const float hi = b * c + a * s;
        out[i] = lo;
        out[i + 64] = hi;
        if (out2 != nullptr) {
            out2[i] = lo;
            out2[i + 64] = hi;
        }
    }
}

// The lane's four values of a head (x_h and its norm weights w): elements lane + 32 k.
__device__ __forceinline__ void rope_head_load(const float* xh, const float* w, int lane, float (&v)[4],
                                               float (&wv)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[k] = xh[lane + 32 * k];
        wv[k] = w[lane + 32 * k];
    }
}

// rope_head_vals of head x_h: everything this lane reads is read before it writes, so `out` may
// alias `xh`.
__device__ __forceinline__ void rope_head(const float* xh, float* out, float* out2, const float* w, float eps,
                                          const float* cos_sin, int lane) {
    float v[4], wv[4];
    rope_head_load(xh, w, lane, v, wv);
    rope_head_vals(v, wv, out, out2, eps, cos_sin, lane);
}

// In place, for each head of x ([heads][128]): rope_head. One warp per head.
__device__ __forceinline__ void qk_norm_rope_body(float* x, const float* w, float eps, const float* cos_sin, int heads) {
    const int h = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (h >= heads) return;  // warp-uniform
    float* xh = x + (size_t)h * HEAD_DIM;
    rope_head(xh, xh, nullptr, w, eps, cos_sin, lane);
}

extern "C" __global__ void qk_norm_rope_f32(float* x, const float* w, float eps, const float* cos_sin, int heads) {
    kernel_entry();
    qk_norm_rope_body(x, w, eps, cos_sin, heads);
}

// GRAPH: the same program at the device-held position: cos_sin = row pos[0] of table
// ([positions][128]); nothing is written when pos[0] >= positions (the host twin does the same).
extern "C" __global__ void qk_norm_rope_at_f32(float* x, const float* w, float eps, const float* table,
                                               const unsigned* pos, int positions, int heads) {
    kernel_entry();
    const unsigned p = pos[0];
    if (p >= (unsigned)positions) return;
    qk_norm_rope_body(x, w, eps, table + (size_t)p * HEAD_DIM, heads);
}

// The rope seam in one launch (twins::attention::rope_append): at the device-held position p,
// q heads -> q_out = rope_head(q, q_norm); kv heads -> k_out = rope_head(k, k_norm), also stored
// at row p of k_cache; v heads copied to row p of v_cache. One warp per head of the three groups
// (q_heads + 2 kv_heads warps). Nothing is written when p is outside the RoPE table or the
// cache (`positions`, `cache_positions`), exactly like the twin.
// Lane grid: blockIdx.z = lane (the rows of a pass, each its own session's cache and position),
// slices [q, k, v, q_norm, k_norm, table, pos, q_out, k_out, k_cache, v_cache].
extern "C" __global__ void rope_append_f32(const float* q, const float* k, const float* v, const float* q_norm,
                                           const float* k_norm, float eps, const float* table, const unsigned* pos,
                                           int positions, int cache_positions, int q_heads, int kv_heads, float* q_out,
                                           float* k_out, float* k_cache, float* v_cache, const LanePitch lp) {
    kernel_entry();
    const int z = blockIdx.z;
    q = LANE_AT(q, lp, 0, z);
    k = LANE_AT(k, lp, 1, z);
    v = LANE_AT(v, lp, 2, z);
    q_norm = LANE_AT(q_norm, lp, 3, z);
    k_norm = LANE_AT(k_norm, lp, 4, z);
    table = LANE_AT(table, lp, 5, z);
    pos = LANE_AT(pos, lp, 6, z);
    q_out = LANE_AT(q_out, lp, 7, z);
    k_out = LANE_AT(k_out, lp, 8, z);
    k_cache = LANE_AT(k_cache, lp, 9, z);
    v_cache = LANE_AT(v_cache, lp, 10, z);
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    // The warp's head values (and norm weights) do not depend on the position: they are loaded in
    // the same round trip as it, and the cos/sin row (which does) in the next. Loading them after
    // the position, and v's copy value by value behind its stores, cost up to four more.
    float hv[4] = {C_ZERO, C_ZERO, C_ZERO, C_ZERO};
    float wv[4] = {C_ZERO, C_ZERO, C_ZERO, C_ZERO};
    if (gw < q_heads) {
        rope_head_load(q + (size_t)gw * HEAD_DIM, q_norm, lane, hv, wv);
    } else if (gw < q_heads + kv_heads) {
        rope_head_load(k + (size_t)(gw - q_heads) * HEAD_DIM, k_norm, lane, hv, wv);
    } else if (gw < q_heads + 2 * kv_heads) {
#pragma unroll
        for (int j = 0; j < 4; ++j) hv[j] = v[(size_t)(gw - q_heads - kv_heads) * HEAD_DIM + lane + 32 * j];
    }
    const unsigned p = pos[0];
    if (p >= (unsigned)positions || p >= (unsigned)cache_positions) return;
    const float* cs = table + (size_t)p * HEAD_DIM;
    const size_t row = (size_t)p * kv_heads * HEAD_DIM;
    if (gw < q_heads) {
        rope_head_vals(hv, wv, q_out + (size_t)gw * HEAD_DIM, nullptr, eps, cs, lane);
    } else if (gw < q_heads + kv_heads) {
        const int h = gw - q_heads;
        rope_head_vals(hv, wv, k_out + (size_t)h * HEAD_DIM, k_cache + row + (size_t)h * HEAD_DIM, eps, cs, lane);
    } else if (gw < q_heads + 2 * kv_heads) {
        const int h = gw - q_heads - kv_heads;
#pragma unroll
        for (int j = 0; j < 4; ++j) v_cache[row + (size_t)h * HEAD_DIM + lane + 32 * j] = hv[j];
    }
}

// max by plain comparisons in index order (a leading NaN stays, a later NaN is skipped).
__device__ __forceinline__ float max_in_order_c(const float* xs, int n) {
    float m = xs[0];
    for (int i = 1; i < n; ++i) {
        if (xs[i] > m) m = xs[i];
    }
    return m;
}

// Decode attention of q ([q_heads][128]) over `len` cached positions (k, v: [len][kv_heads][128]),
// gated per head. One block of 128 threads per q head, scores in dynamic shared memory (len
// floats). Phase 1: the 4 warps compute s_t = dot32(q_h, k_t) * scale for t = warp, warp+4, ….
// Phase 2: thread d owns output dimension d; every thread recomputes the partition maxima, the
// weights e = exp_c(s_t - m_p) and the sums l_p (identical values in every thread) and
// accumulates o_p[d] in position order; partitions are combined in order with c_p = exp_c(m_p - M).
// The combine is interleaved with the partitions here while the host runs all partitions first:
// each value is the same sequence of IEEE operations either way.
// Phase 1 of one head: scores[t] = dot32(q_h, k_t) * scale for t < len (warp w takes t = w, w+4, …).
// A warp loads the key rows of ATTN_BATCH of its positions before its first dot: one at a time, a
// position could cost a memory round trip each (8 of them per warp at 32 positions). With both
// batches, ncu on one H100 (step, b1): 8.82 → 6.48 µs per launch (docs/gpu/2026-12-05-loads/).
// Each score is still dot32_warp's sequence (lane l: +0 then q[l]·k[l], q[l+32]·k[l+32], … in order, then the
// butterfly); only the loads moved. Rows past `len` are not read (the last valid row stands in).
#define ATTN_BATCH 8
// Phase 2's values of a partition in one load run: ATTN_VBATCH = ATTN_PARTITION (16 took two round
// trips for a partition of more than 16 positions; 64 registers, no spill, NVRTC 13.0).
#define ATTN_VBATCH 32
// NQ columns of one session share the walk (SPEC_FA2: each key row is loaded once for both
// columns' scores); column c has its own causal bound lens[c] and its own score row. The walk
// covers the longest bound; a column's score past its bound is computed on a stand-in row and not
// stored. NQ = 1 is the single-lane kernels' phase 1.
template <int NQ>
__device__ __forceinline__ void attention_scores_cols(const float* const (&qh)[NQ], const float* k, size_t stride,
                                                      size_t kv_off, const int (&lens)[NQ],
                                                      float* const (&scores)[NQ]) {
    constexpr int WARPS = ATTN_THREADS / 32;
    constexpr int PER_LANE = HEAD_DIM / 32;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    int walk = lens[0];
#pragma unroll
    for (int c = 1; c < NQ; ++c) walk = max(walk, lens[c]);
    float qv[NQ][PER_LANE];
#pragma unroll
    for (int c = 0; c < NQ; ++c) {
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) qv[c][i] = qh[c][lane + 32 * i];
    }
    for (int t0 = warp; t0 < walk; t0 += WARPS * ATTN_BATCH) {
        float kv[ATTN_BATCH][PER_LANE];
#pragma unroll
        for (int j = 0; j < ATTN_BATCH; ++j) {
            const float* kt = k + (size_t)min(t0 + WARPS * j, walk - 1) * stride + kv_off;
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) kv[j][i] = kt[lane + 32 * i];
        }
        // Every row of the batch is dotted (a row past the bound repeats the last valid one and is
        // not stored) and the scores are stored after the batch: with a `break` at the first row
        // past `len` and a store after each dot, ptxas issued each row's loads after the previous
        // row's butterfly — a memory round trip per position instead of one per batch (SASS,
        // NVRTC 13.0).
        float sc[NQ][ATTN_BATCH];
#pragma unroll
        for (int j = 0; j < ATTN_BATCH; ++j) {
#pragma unroll
            for (int c = 0; c < NQ; ++c) {
                float acc = C_ZERO;
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) acc = acc + qv[c][i] * kv[j][i];
                sc[c][j] = butterfly32(acc) * C_ATTN_SCALE;
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < NQ; ++c) {
#pragma unroll
                for (int j = 0; j < ATTN_BATCH; ++j) {
                    const int t = t0 + WARPS * j;
                    if (t < lens[c]) scores[c][t] = sc[c][j];
                }
            }
        }
    }
}

__device__ __forceinline__ void attention_scores(const float* qh, const float* k, size_t stride, size_t kv_off,
                                                 int len, float* scores) {
    const float* const q1[1] = {qh};
    const int l1[1] = {len};
    float* const s1[1] = {scores};
    attention_scores_cols<1>(q1, k, stride, kv_off, l1, s1);
}

// Phase 2 of one head: thread d's output dimension from the scores (partitions of part_len).
__device__ __forceinline__ float attention_combine(const float* scores, const float* v, size_t stride, size_t kv_off,
                                                   int len, int part_len, float gate_h) {
    const int d = threadIdx.x;
    const int n_parts = (len + part_len - 1) / part_len;
    float m_all = C_ZERO;
    for (int p = 0; p < n_parts; ++p) {
        const int t0 = p * part_len;
        const int cnt = min(part_len, len - t0);
        const float m = max_in_order_c(scores + t0, cnt);
        if (p == 0 || m > m_all) m_all = m;
    }
    float l_all = C_ZERO;
    float o_all = C_ZERO;
    for (int p = 0; p < n_parts; ++p) {
        const int t0 = p * part_len;
        const int cnt = min(part_len, len - t0);
        const float m = max_in_order_c(scores + t0, cnt);
        float l = C_ZERO;
        float o = C_ZERO;
        // The partition's values of dimension d are loaded ATTN_VBATCH at a time before they are
        // used (as the keys above); e, l and o keep their order.
        for (int j0 = 0; j0 < cnt; j0 += ATTN_VBATCH) {
            float vb[ATTN_VBATCH];
#pragma unroll
            for (int j = 0; j < ATTN_VBATCH; ++j) {
                vb[j] = v[(size_t)(t0 + min(j0 + j, cnt - 1)) * stride + kv_off + d];
            }
#pragma unroll
            for (int j = 0; j < ATTN_VBATCH; ++j) {
                if (j0 + j >= cnt) break;
                const float e = exp_c(scores[t0 + j0 + j] - m);
                l = l + e;
                o = o + e * vb[j];
            }
        }
        const float c = exp_c(m - m_all);
        l_all = l_all + l * c;
        o_all = o_all + o * c;
    }
    const float g = sigmoid_c(gate_h);
    float r = div_c(o_all, l_all);
    return r * g;
}

__device__ __forceinline__ void decode_attention_body(const float* q, const float* k, const float* v,
                                                      const float* gate, int len, int q_heads, int kv_heads,
                                                      int part_len, int h, float* out) {
    extern __shared__ float scores[];
    if (h >= q_heads || len < 1) return;  // block-uniform
    const int group = q_heads / kv_heads;
    const size_t stride = (size_t)kv_heads * HEAD_DIM;
    const size_t kv_off = (size_t)(h / group) * HEAD_DIM;
    attention_scores(q + (size_t)h * HEAD_DIM, k, stride, kv_off, len, scores);
    __syncthreads();
    out[(size_t)h * HEAD_DIM + threadIdx.x] = attention_combine(scores, v, stride, kv_off, len, part_len, gate[h]);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    decode_attention_f32(const float* q, const float* k, const float* v, const float* gate, int len, int q_heads,
                         int kv_heads, float* out) {
    kernel_entry();
    decode_attention_body(q, k, v, gate, len, q_heads, kv_heads, ATTN_PARTITION, blockIdx.x, out);
}

// GRAPH: attention over pos[0] + 1 positions at the device-held position (k, v hold max_len
// positions; shared memory is sized for max_len). Nothing is written when pos[0] >= max_len.
// part_len is ATTN_PARTITION in the program; another value is the verify-partitions canary.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    decode_attention_at_f32(const float* q, const float* k, const float* v, const float* gate, const unsigned* pos,
                            int max_len, int q_heads, int kv_heads, int part_len, float* out) {
    kernel_entry();
    const unsigned p = pos[0];
    if (p >= (unsigned)max_len || part_len < 1) return;
    decode_attention_body(q, k, v, gate, (int)p + 1, q_heads, kv_heads, part_len, blockIdx.x, out);
}

// DECODE_V2: decode_attention_at_f32 for `rows` lanes in one launch, block b = (lane b / q_heads,
// head b % q_heads); lane i's q/gate/pos/out at i * their pitch, its k/v at i * kv_pitch (0:
// columns share one session's caches). Each (lane, head) is exactly the single-lane block.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    decode_attention_rows_f32(const float* q, const float* k, const float* v, const float* gate, const unsigned* pos,
                              int rows, int q_pitch, int kv_pitch, int gate_pitch, int pos_pitch, int out_pitch,
                              int max_len, int q_heads, int kv_heads, int part_len, float* out) {
    kernel_entry();
    const int row = blockIdx.x / q_heads;
    const int h = blockIdx.x % q_heads;
    if (row >= rows) return;
    const unsigned p = pos[(size_t)row * pos_pitch];
    if (p >= (unsigned)max_len || part_len < 1) return;
    const size_t kv = (size_t)row * kv_pitch;
    decode_attention_body(q + (size_t)row * q_pitch, k + kv, v + kv, gate + (size_t)row * gate_pitch, (int)p + 1,
                          q_heads, kv_heads, part_len, h, out + (size_t)row * out_pitch);
}

// SPEC_FA2: two columns of one session (shared caches) in one walk: per head, each cached key is
// visited once for both columns' scores (column c over its own causal bound pos_c + 1), then each
// column's combine exactly as decode_attention_body's. Shared memory: 2 * max_len scores.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    decode_attention_cols2_f32(const float* q, const float* k, const float* v, const float* gate, const unsigned* pos,
                               int q_pitch, int gate_pitch, int pos_pitch, int out_pitch, int max_len, int q_heads,
                               int kv_heads, int part_len, float* out) {
    kernel_entry();
    extern __shared__ float scores2[];
    const int h = blockIdx.x;
    const unsigned p0 = pos[0], p1 = pos[pos_pitch];
    if (h >= q_heads || part_len < 1) return;  // block-uniform
    // A column whose position is outside the caches writes nothing (as decode_attention_at_f32).
    const int len0 = p0 < (unsigned)max_len ? (int)p0 + 1 : 0;
    const int len1 = p1 < (unsigned)max_len ? (int)p1 + 1 : 0;
    const int group = q_heads / kv_heads;
    const size_t stride = (size_t)kv_heads * HEAD_DIM;
    const size_t kv_off = (size_t)(h / group) * HEAD_DIM;
    const float* const qs[2] = {q + (size_t)h * HEAD_DIM, q + (size_t)q_pitch + (size_t)h * HEAD_DIM};
    const int lens[2] = {len0, len1};
    float* const ss[2] = {scores2, scores2 + max_len};
    attention_scores_cols<2>(qs, k, stride, kv_off, lens, ss);
    __syncthreads();
    const int d = threadIdx.x;
    if (len0 > 0) out[(size_t)h * HEAD_DIM + d] = attention_combine(scores2, v, stride, kv_off, len0, part_len, gate[h]);
    if (len1 > 0) {
        out[(size_t)out_pitch + (size_t)h * HEAD_DIM + d] =
            attention_combine(scores2 + max_len, v, stride, kv_off, len1, part_len, gate[(size_t)gate_pitch + h]);
    }
}
