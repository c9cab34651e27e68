// Grouped routed experts: the device twins of `twins/experts.rs`.
//
// Why this file exists: one expert matrix is a few MB, less traffic than a launch costs, so the
// routed experts run as ONE launch per projection kind for every slot of the step (grid.y =
// slot), reading the route ids from device memory — no host round trip per layer, and the whole
// MoE half can be captured in a graph. A slot maps to its expert through the route (slot s < k:
// routed expert ids[s]; slot s >= k: the shared expert, entry experts + s - k); the expert's
// matrices come from a per-rank table of entries (null = not held on this rank). Inside a slot
// the arithmetic is the canonical GEMV of gemv.cu, task for task: only where the pointers come
// from changed.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

// One expert as a rank holds it (layout shared with the runtime's `ExpertEntry`, 112 bytes).
struct ExpertEntry {
    u64 gate;  // 0: this rank does not hold the expert
    u64 gate_scales;
    u64 up;
    u64 up_scales;
    u64 down;
    u64 down_scales;
    int fmt;  // FMT_E4M3 or FMT_NVFP4 (all three matrices)
    int gate_vec;
    int up_vec;
    int down_vec;
    int rows;  // gate/up rows held (the act width)
    int cols;  // gate/up in_features
    int kw;    // gate/up K-block width
    int row0;  // gate/up E4M3 row0
    int down_rows;
    int down_cols;
    int down_kw;
    int has_scales;  // NVFP4 per-matrix scales below
    float sg;
    float su;
    float sd;
    int pad;
};

// Entry index of slot s, or -1 (a routed id outside the experts: the slot is skipped).
__device__ __forceinline__ int slot_entry_c(const float* ids, int k, int experts, int s) {
    if (s < k) {
        const u32 id = __float_as_uint(ids[s]);
        return id < (u32)experts ? (int)id : -1;
    }
    return experts + (s - k);
}

// twins::experts::OwnerRule::owner_of, or -1.
__device__ __forceinline__ int owner_of_c(u32 id, u32 experts, u32 div, u32 modulo) {
    if (id >= experts || div == 0u || modulo == 0u) return -1;
    return (int)((id / div) % modulo);
}

// R partials of one task of a matrix whose format and layout are known only at run time (they
// are uniform across the block): dispatch to the instantiations of gemv.cu's gemv_task.
__device__ __forceinline__ void expert_task(int fmt, int vec, u64 w, u64 scales, int row0, const float* x, int cols,
                                            int kw, int r0, int nvalid, int k, int lane, float* p) {
    const void* wp = reinterpret_cast<const void*>(w);
    const void* sp = reinterpret_cast<const void*>(scales);
    if (fmt == FMT_NVFP4) {
        gemv_task<FMT_NVFP4, 0>(wp, sp, row0, x, cols, kw, r0, nvalid, k, lane, p);
    } else if (vec == E4M3_BPL) {
        // One row per task (task_rows_c); scale row as gemv_task's row-major E4M3 path.
        const float* srow = static_cast<const float*>(sp) +
                            (size_t)((row0 + r0) / E4M3_BLOCK - row0 / E4M3_BLOCK) * (size_t)(cols / E4M3_BLOCK);
        p[0] = partial_e4m3_bpl_task(static_cast<const u8*>(wp), srow, (k * kw) / E4M3_BLOCK, x + (size_t)k * kw, r0,
                                     cols / E4M3_BLOCK, kw, lane);
    } else if (vec == 16) {
        gemv_task<FMT_E4M3, 16>(wp, sp, row0, x, cols, kw, r0, nvalid, k, lane, p);
    } else if (vec == 4) {
        gemv_task<FMT_E4M3, 4>(wp, sp, row0, x, cols, kw, r0, nvalid, k, lane, p);
    } else {
        gemv_task<FMT_E4M3, 0>(wp, sp, row0, x, cols, kw, r0, nvalid, k, lane, p);
    }
}

__device__ __forceinline__ int task_rows_c(int fmt, int vec) {
    return (fmt == FMT_E4M3 && vec > 0 && vec != E4M3_BPL) ? GEMV_ROWS_PER_TASK : 1;
}

// The SwiGLU of expert_gate_up_f32 (the runtime's `swiglu_mode`): unclamped, clamped at `limit`,
// or NVFP4_DEV_ROUTES's (an unclamped layer) with an NVFP4 expert's up scale applied after the
// product (canon.rs `swiglu_folded`); an expert without per-matrix scales is unclamped there.
#define SWIGLU_PLAIN 0
#define SWIGLU_CLAMPED 1
#define SWIGLU_FOLD_UP 2

// Row r of a slot from its folded gate/up pair: the NVFP4 per-matrix scales once (the up scale
// kept for the SwiGLU under SWIGLU_FOLD_UP), then the SwiGLU into act (ROWS false: the fused
// kernel), or the SwiGLU's operands, g into act and u into up_out (ROWS true:
// expert_gate_up_rows_f32, STEP_EP's host-arithmetic default, whose SwiGLU the program applies).
template <bool ROWS>
__device__ __forceinline__ void gate_up_finish(const ExpertEntry& en, float* act, float* up_out, size_t r, float g,
                                               float u, int mode, float limit) {
    const bool fold = mode == SWIGLU_FOLD_UP && en.has_scales;
    if (en.has_scales) {
        g = g * en.sg;
        if (!fold) u = u * en.su;
    }
    if (ROWS) {
        act[r] = g;
        up_out[r] = u;
    } else if (fold) {
        act[r] = swiglu_folded_c(g, u, en.su);
    } else {
        act[r] = swiglu_c(g, u, mode == SWIGLU_CLAMPED, limit);
    }
}

// Gate, up and SwiGLU of rows r_first .. of one E4M3 expert in the block-per-lane layout (gemv.cu):
// x staged once for both matrices, every (row, scale block) pair of gate then up by one thread,
// then thread t folds row t of each and applies the SwiGLU — the operations of the task path.
// 2 · rpb · nb <= BPL_SV (checked by the runtime).
template <bool ROWS>
__device__ __forceinline__ void expert_gate_up_bpl(const ExpertEntry& en, const float* x, int mode, float limit,
                                                   float* act, float* up_out, int r_first, int rpb) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ float sv[BPL_SV];
    const int nrows = min(rpb, en.rows - r_first);
    const int nb = en.cols / E4M3_BLOCK, bk = en.kw / E4M3_BLOCK, nk = en.cols / en.kw;
    bpl_stage_x(x, en.cols, xs);
    __syncthreads();
    bpl_pairs(reinterpret_cast<const u8*>(en.gate), reinterpret_cast<const float*>(en.gate_scales), en.row0, r_first,
              nrows, nb, xs, sv);
    bpl_pairs(reinterpret_cast<const u8*>(en.up), reinterpret_cast<const float*>(en.up_scales), en.row0, r_first,
              nrows, nb, xs, sv + nrows * nb);
    __syncthreads();
    for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) {
        const float g = bpl_row(sv + rl * nb, nk, bk);
        const float u = bpl_row(sv + (nrows + rl) * nb, nk, bk);
        gate_up_finish<ROWS>(en, act, up_out, r_first + rl, g, u, mode, limit);
    }
}

// Gate, up and SwiGLU of every slot (twins::experts::gate_up_act): block (bx, s) computes rows
// bx*rpb .. of slot s's expert; its 8 warps share the (matrix, row group, K-block) tasks of gate
// and up; then thread t folds row t's partials of each matrix from +0.0 in K-block order,
// applies the NVFP4 per-matrix scales once, and writes act[s * act_pitch + r] = swiglu (ROWS:
// act[s * act_pitch + r] = g and up_out[s * act_pitch + r] = u instead).
// Shared memory holds 2 x rpb x nk partials (rpb * nk <= GEMV_MAX_TASKS, checked by the runtime).
//
// Lane grid: blockIdx.y = slot × lanes + lane (slot-major, so every lane's blocks of one slot —
// the shared expert's above all — run side by side and share the weights through L2); slices
// [ids, x, act] (ROWS: [ids, x, act, up_out]).
template <bool ROWS>
__device__ __forceinline__ void expert_gate_up_slots(const ExpertEntry* table, int n_entries, int experts,
                                                     const float* ids, int k, int first_slot, const float* x,
                                                     int mode, float limit, float* act, float* up_out,
                                                     int act_pitch, int rpb, const LanePitch& lp) {
    __shared__ float part[2][GEMV_MAX_TASKS];
    const int slot = (int)blockIdx.y / lp.lanes;
    const int ln = (int)blockIdx.y - slot * lp.lanes;
    ids = LANE_AT(ids, lp, 0, ln);
    x = LANE_AT(x, lp, 1, ln);
    act = LANE_AT(act, lp, 2, ln);
    if (ROWS) up_out = LANE_AT(up_out, lp, 3, ln);
    const int e = slot_entry_c(ids, k, experts, first_slot + slot);
    if (e < 0 || e >= n_entries) return;  // block-uniform
    // Read through a reference (the fields are re-read from L1 where needed): a register copy of
    // the 112-byte entry made this kernel spill under its 3-blocks-per-SM register budget.
    const ExpertEntry& en = table[e];
    if (en.gate == 0ull) return;
    const int r_first = blockIdx.x * rpb;
    if (r_first >= en.rows) return;
    if (en.fmt == FMT_E4M3 && en.gate_vec == E4M3_BPL && en.up_vec == E4M3_BPL) {
        expert_gate_up_bpl<ROWS>(en, x, mode, limit, act + (size_t)slot * act_pitch,
                                 ROWS ? up_out + (size_t)slot * act_pitch : nullptr, r_first, rpb);
        return;
    }
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int nk = en.cols / en.kw;
    const int rg = task_rows_c(en.fmt, en.gate_vec);
    const int ru = task_rows_c(en.fmt, en.up_vec);
    const int tasks_g = ((rpb + rg - 1) / rg) * nk;
    const int tasks_u = ((rpb + ru - 1) / ru) * nk;
    for (int task = warp; task < tasks_g + tasks_u; task += GEMV_WARPS) {
        const int m = task < tasks_g ? 0 : 1;
        const int t = m == 0 ? task : task - tasks_g;
        const int R = m == 0 ? rg : ru;
        const int grp = t / nk;
        const int kb = t - grp * nk;
        const int rl0 = grp * R;
        const int r0 = r_first + rl0;
        const int nvalid = min(min(R, rpb - rl0), en.rows - r0);
        if (nvalid <= 0) continue;  // warp-uniform
        float p[GEMV_ROWS_PER_TASK];
        if (m == 0) {
            expert_task(en.fmt, en.gate_vec, en.gate, en.gate_scales, en.row0, x, en.cols, en.kw, r0, nvalid, kb, lane,
                        p);
        } else {
            expert_task(en.fmt, en.up_vec, en.up, en.up_scales, en.row0, x, en.cols, en.kw, r0, nvalid, kb, lane, p);
        }
        if (lane == 0) {
            for (int i = 0; i < nvalid; ++i) part[m][(rl0 + i) * nk + kb] = p[i];
        }
    }
    __syncthreads();
    const int rl = threadIdx.x;
    const int r = r_first + rl;
    if (rl < rpb && r < en.rows) {
        float g = C_ZERO;
        float u = C_ZERO;
        for (int kb = 0; kb < nk; ++kb) g = g + part[0][rl * nk + kb];
        for (int kb = 0; kb < nk; ++kb) u = u + part[1][rl * nk + kb];
        gate_up_finish<ROWS>(en, act, up_out, (size_t)slot * act_pitch + r, g, u, mode, limit);
    }
}

// The shared slot ahead of the wait (SETTLED_FIRST, canon.cuh): the shared expert's slot (first_slot
// + slot == k) needs no route id — its entry is `experts + 0` — and reads only x (the expert
// input) and the entry table, and writes only its own act rows. When the runtime passes
// `ahead` = 1 it has checked that the kernel ahead of this one on the stream touches neither x nor
// act (CudaBackend::settled): x was then written, and act last read, by kernels at least two
// launches back, which have completed before this kernel can be scheduled (the kernel ahead has
// passed its own wait). So the shared slot's blocks compute while the kernel ahead (the router's
// top-k) still runs; every routed slot's block waits first, as every kernel does. The same
// blocks, operations and order either way: only when the shared slot runs moves.
template <bool SF>
__device__ __forceinline__ void expert_gate_up_bpl_entry(const ExpertEntry* table, int n_entries, int experts,
                                                         const float* ids, int k, int first_slot, const float* x,
                                                         int mode, float limit, float* act, int act_pitch, int rpb,
                                                         const LanePitch& lp, int ahead) {
    if (!(SF && ahead != 0 && first_slot + (int)blockIdx.y / lp.lanes == k)) kernel_entry();
    const int slot = (int)blockIdx.y / lp.lanes;
    const int ln = (int)blockIdx.y - slot * lp.lanes;
    ids = LANE_AT(ids, lp, 0, ln);
    x = LANE_AT(x, lp, 1, ln);
    act = LANE_AT(act, lp, 2, ln);
    const int e = slot_entry_c(ids, k, experts, first_slot + slot);
    if (e < 0 || e >= n_entries) return;  // block-uniform
    const ExpertEntry& en = table[e];
    if (en.gate == 0ull) return;
    const int r_first = blockIdx.x * rpb;
    if (r_first >= en.rows) return;
    if (en.fmt != FMT_E4M3 || en.gate_vec != E4M3_BPL || en.up_vec != E4M3_BPL) __trap();
    expert_gate_up_bpl<false>(en, x, mode, limit, act + (size_t)slot * act_pitch, nullptr, r_first, rpb);
}

// expert_gate_up_f32 for a group whose every gate and up matrix is E4M3 in the block-per-lane
// layout (the runtime picks it then; anything else traps): the same blocks, pairs and folds, so
// the same bits, without the warp-task path, whose registers bound the general kernel to 80 per
// thread and 3 blocks per SM. This one runs 6 blocks per SM in 40 registers (20 bytes of spill):
// more code loads in flight per SM. On one H200 the experts seam at b1 was 64.2–64.9 µs at 4 blocks
// per SM (64 registers), 63.7–64.3 at 5, 55.2–56.0 at 6 and 56.7–57.4 at 8 (32 registers); the
// register count never changes an operation (docs/gpu/2026-12-05-bounds/). `ahead`: the shared
// slot may run before the wait (expert_gate_up_bpl_entry).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 6)
    expert_gate_up_bpl_f32(const ExpertEntry* table, int n_entries, int experts, const float* ids, int k,
                           int first_slot, const float* x, int mode, float limit, float* act, int act_pitch, int rpb,
                           const LanePitch lp, int ahead) {
    expert_gate_up_bpl_entry<SETTLED_FIRST>(table, n_entries, experts, ids, k, first_slot, x, mode, limit, act,
                                            act_pitch, rpb, lp, ahead);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3)
    expert_gate_up_f32(const ExpertEntry* table, int n_entries, int experts, const float* ids, int k, int first_slot,
                       const float* x, int mode, float limit, float* act, int act_pitch, int rpb,
                       const LanePitch lp, int ahead) {
    kernel_entry();  // `ahead` unused: the launch is expert_gate_up_bpl_f32's, this kernel always waits first
    expert_gate_up_slots<false>(table, n_entries, experts, ids, k, first_slot, x, mode, limit, act, nullptr,
                                act_pitch, rpb, lp);
}

// The SwiGLU's operands of every slot (twins::experts::gate_up_rows; Op::ExpertGateUpRows): the
// fused kernel's blocks and arithmetic up to the SwiGLU, g stored at gate[s * pitch + r] and u at
// up[s * pitch + r].
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3)
    expert_gate_up_rows_f32(const ExpertEntry* table, int n_entries, int experts, const float* ids, int k,
                            int first_slot, const float* x, float* gate, float* up, int pitch, int rpb,
                            const LanePitch lp) {
    kernel_entry();
    expert_gate_up_slots<true>(table, n_entries, experts, ids, k, first_slot, x, 0, C_ZERO, gate, up, pitch, rpb, lp);
}

// Down-projection K-block partials of every slot: out[s * out_pitch + kb * rows + r] for the
// K-blocks this rank holds of slot s's expert (twins::gemv::gemv_partials of the entry's down
// shard over act[s * act_pitch ..]); slots are relative to first_slot on both buffers. Lane grid
// as expert_gate_up_f32's (blockIdx.y = slot × lanes + lane), slices [ids, act, out].
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3)
    expert_down_f32(const ExpertEntry* table, int n_entries, int experts, const float* ids, int k, int first_slot,
                    const float* act, int act_pitch, float* out, int out_pitch, int rpb, const LanePitch lp) {
    kernel_entry();
    const int slot = (int)blockIdx.y / lp.lanes;
    const int ln = (int)blockIdx.y - slot * lp.lanes;
    ids = LANE_AT(ids, lp, 0, ln);
    act = LANE_AT(act, lp, 1, ln);
    out = LANE_AT(out, lp, 2, ln);
    const int e = slot_entry_c(ids, k, experts, first_slot + slot);
    if (e < 0 || e >= n_entries) return;
    const ExpertEntry en = table[e];
    if (en.down == 0ull) return;
    const int rows = en.down_rows;
    const int r_first = blockIdx.x * rpb;
    if (r_first >= rows) return;
    if (en.fmt == FMT_E4M3 && en.down_vec == E4M3_BPL) {
        gemv_bpl<true>(reinterpret_cast<const u8*>(en.down), reinterpret_cast<const float*>(en.down_scales), 0,
                       act + (size_t)slot * act_pitch, out + (size_t)slot * out_pitch, rows, en.down_cols, en.down_kw,
                       rpb, blockIdx.x);
        return;
    }
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int nk = en.down_cols / en.down_kw;
    const int R = task_rows_c(en.fmt, en.down_vec);
    const int n_tasks = ((rpb + R - 1) / R) * nk;
    const float* x = act + (size_t)slot * act_pitch;
    float* o = out + (size_t)slot * out_pitch;
    for (int task = warp; task < n_tasks; task += GEMV_WARPS) {
        const int grp = task / nk;
        const int kb = task - grp * nk;
        const int rl0 = grp * R;
        const int r0 = r_first + rl0;
        const int nvalid = min(min(R, rpb - rl0), rows - r0);
        if (nvalid <= 0) continue;
        float p[GEMV_ROWS_PER_TASK];
        expert_task(en.fmt, en.down_vec, en.down, en.down_scales, 0, x, en.down_cols, en.down_kw, r0, nvalid, kb, lane,
                    p);
        if (lane == 0) {
            for (int i = 0; i < nvalid; ++i) o[(size_t)kb * rows + r0 + i] = p[i];
        }
    }
}

// Canonical fold of each slot's n_parts partials (twins::experts::fold_slot): slot s (relative
// index j = s - first_slot) reads parts[j * parts_pitch + p * width + i] and writes
// out[j * width + i]. With `cond`, a routed slot (s < k) is folded only when its owner under the
// rule is `want`. With a scale table, the slot's entry NVFP4 down scale is applied once after
// the fold. grid = (ceil(width / blockDim), n_slots, lanes); lane grid slices [ids, parts, out].
extern "C" __global__ void fold_slots_f32(const float* ids, int k, int first_slot, const float* parts, int parts_pitch,
                                          int n_parts, int width, float* out, int cond, u32 o_experts, u32 o_div,
                                          u32 o_mod, u32 o_want, const ExpertEntry* scale_table, int n_entries,
                                          int experts, const LanePitch lp) {
    kernel_entry();
    ids = LANE_AT(ids, lp, 0, blockIdx.z);
    parts = LANE_AT(parts, lp, 1, blockIdx.z);
    out = LANE_AT(out, lp, 2, blockIdx.z);
    const int j = blockIdx.y;
    const int s = first_slot + j;
    if (cond && s < k && owner_of_c(__float_as_uint(ids[s]), o_experts, o_div, o_mod) != (int)o_want) return;
    int has = 0;
    float sc = C_ONE;
    if (scale_table != nullptr) {
        const int e = slot_entry_c(ids, k, experts, s);
        if (e >= 0 && e < n_entries && scale_table[e].has_scales) {
            has = 1;
            sc = scale_table[e].sd;
        }
    }
    const float* pj = parts + (size_t)j * parts_pitch;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        float acc = C_ZERO;
        // Unrolled so the part loads are issued together (the adds keep their order).
#pragma unroll 8
        for (int p = 0; p < n_parts; ++p) acc = acc + pj[(size_t)p * width + i];
        out[(size_t)j * width + i] = has ? acc * sc : acc;
    }
}

// The TP-sharded moe_join (twins::experts::fold_combine), element by element: slot s's output
// y_s = ((+0 + P0) + P1) + ... of its n_parts partials (parts[s * pitch + p * width + i]),
// routed = sum over s < k of w[s] * y_s in slot order from +0.0, shared = y_k.
// The (slot, part) values of an element, up to FC_BATCH of them, are all read before any is added:
// a loop that adds each value as it arrives waits a memory round trip per value ((k + 1) · n_parts
// of them; 18 at `step`'s TP1). (slot, part) advance as counters, not divisions: the unrolled
// index stays a register index. The adds keep their order: t = s · n_parts + p, ascending.
#define FC_BATCH 32
// Slots of the constant-count path (fold_combine_np): up to FC_KMAX routed slots and the shared one.
#define FC_KMAX 8

// Element i for NP parts a slot and k <= FC_KMAX routed slots: the slot weights
// and every (slot, part) value loaded first, all in one batch (the general loop below issued each
// weight load where its slot started, after the adds before it: one more memory round trip), then
// the same adds in the same order — y_s = ((+0 + P0) + P1) + ..., routed = routed + w[s] · y_s.
template <int NP>
__device__ __forceinline__ void fold_combine_np(const float* parts, int pitch, const float* w, int k, int width, int i,
                                                float& routed, float& shared) {
    float ws[FC_KMAX];
#pragma unroll
    for (int s = 0; s < FC_KMAX; ++s) ws[s] = s < k ? w[s] : C_ZERO;
    float v[FC_KMAX + 1][NP];
#pragma unroll
    for (int s = 0; s <= FC_KMAX; ++s) {
#pragma unroll
        for (int p = 0; p < NP; ++p) v[s][p] = s <= k ? parts[(size_t)s * pitch + (size_t)p * width + i] : C_ZERO;
    }
    routed = C_ZERO;
    shared = C_ZERO;
#pragma unroll
    for (int s = 0; s <= FC_KMAX; ++s) {
        if (s > k) break;
        float y = C_ZERO;
#pragma unroll
        for (int p = 0; p < NP; ++p) y = y + v[s][p];
        if (s < k) {
            routed = routed + ws[s] * y;
        } else {
            shared = y;
        }
    }
}

// Element i of any other count: the (slot, part) values in batches of FC_BATCH, adds in order.
__device__ __forceinline__ void fold_combine_any(const float* parts, int pitch, int n_parts, const float* w, int k,
                                                 int width, int i, float& routed, float& shared) {
    const int total = (k + 1) * n_parts;
    routed = C_ZERO;
    float y = C_ZERO;
    float ws = C_ZERO;
    int s = 0, p = 0;  // the (slot, part) of value t0
    for (int t0 = 0; t0 < total; t0 += FC_BATCH) {
        float v[FC_BATCH];
        int ls = s, lp_ = p;
#pragma unroll
        for (int j = 0; j < FC_BATCH; ++j) {
            v[j] = t0 + j < total ? parts[(size_t)ls * pitch + (size_t)lp_ * width + i] : C_ZERO;
            if (++lp_ == n_parts) {
                lp_ = 0;
                ++ls;
            }
        }
#pragma unroll
        for (int j = 0; j < FC_BATCH; ++j) {
            if (t0 + j >= total) break;
            if (p == 0) {
                y = C_ZERO;
                ws = s < k ? w[s] : C_ZERO;  // read as the slot starts, used at its last part
            }
            y = y + v[j];
            if (p == n_parts - 1 && s < k) routed = routed + ws * y;
            if (++p == n_parts) {
                p = 0;
                ++s;
            }
        }
    }
    shared = y;
}

// The moe_join and the residual in one launch (twins::moe::fold_combine_residual; a launch of
// its own for the residual cost a dependent launch per layer): per element, fold_combine's
// out = [routed | shared], then sum = routed + shared and x = h + sum — residual_add's two
// roundings in that order. h is loaded before the parts, so its round trip is in their batch;
// nothing is stored before every value of the element is loaded.
// Lane grid: blockIdx.z = lane, slices [parts, w, h, out, sum, x].
extern "C" __global__ void fold_combine_residual_f32(const float* parts, int pitch, int n_parts, const float* w, int k,
                                                     int width, const float* h, float* out, float* sum, float* x,
                                                     const LanePitch lp) {
    kernel_entry();
    const int z = blockIdx.z;
    parts = LANE_AT(parts, lp, 0, z);
    w = LANE_AT(w, lp, 1, z);
    h = LANE_AT(h, lp, 2, z);
    out = LANE_AT(out, lp, 3, z);
    sum = LANE_AT(sum, lp, 4, z);
    x = LANE_AT(x, lp, 5, z);
    const bool np_path = k <= FC_KMAX && (n_parts == 1 || n_parts == 2 || n_parts == 4);  // kernel-uniform
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        const float hv = h[i];
        float routed, shared;
        if (!np_path) {
            fold_combine_any(parts, pitch, n_parts, w, k, width, i, routed, shared);
        } else if (n_parts == 1) {
            fold_combine_np<1>(parts, pitch, w, k, width, i, routed, shared);
        } else if (n_parts == 2) {
            fold_combine_np<2>(parts, pitch, w, k, width, i, routed, shared);
        } else {
            fold_combine_np<4>(parts, pitch, w, k, width, i, routed, shared);
        }
        out[i] = routed;
        out[width + i] = shared;
        const float v = routed + shared;
        sum[i] = v;
        x[i] = hv + v;
    }
}

// Expert-parallel gather at the root (twins::experts::select_slots): out[s] = src[owner *
// rank_pitch + s * width ..] for routed slot s < k; nothing for a slot without an owner below
// `ranks`. Bytes only. grid = (ceil(width / blockDim), k).
extern "C" __global__ void select_slots_f32(const float* ids, int k, u32 o_experts, u32 o_div, u32 o_mod, int ranks,
                                            const float* src, int rank_pitch, int width, float* out) {
    kernel_entry();
    const int s = blockIdx.y;
    if (s >= k) return;
    const int owner = owner_of_c(__float_as_uint(ids[s]), o_experts, o_div, o_mod);
    if (owner < 0 || owner >= ranks) return;
    const float* from = src + (size_t)owner * rank_pitch + (size_t)s * width;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        out[(size_t)s * width + i] = from[i];
    }
}

// NVFP4_EP2's per-owner routed sum (twins::experts::combine_owned): acc = +0; for each owned
// routed slot in order: t = +0 + w[s] * y[s][i]; acc = acc + t.
extern "C" __global__ void combine_owned_f32(const float* ids, int k, u32 o_experts, u32 o_div, u32 o_mod, u32 o_want,
                                             const float* y, const float* w, int width, float* out) {
    kernel_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        float acc = C_ZERO;
        for (int s = 0; s < k; ++s) {
            if (owner_of_c(__float_as_uint(ids[s]), o_experts, o_div, o_mod) != (int)o_want) continue;
            const float t = C_ZERO + w[s] * y[(size_t)s * width + i];
            acc = acc + t;
        }
        out[i] = acc;
    }
}

// expert_down_f32 for a group whose every down matrix is E4M3 in the block-per-lane layout (the
// runtime picks it then; anything else traps): the same blocks and partials, so the same bits,
// without the warp-task path's registers (as expert_gate_up_bpl_f32: 6 blocks per SM, here in 40
// registers without spill).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 6)
    expert_down_bpl_f32(const ExpertEntry* table, int n_entries, int experts, const float* ids, int k, int first_slot,
                        const float* act, int act_pitch, float* out, int out_pitch, int rpb, const LanePitch lp) {
    kernel_entry();
    const int slot = (int)blockIdx.y / lp.lanes;
    const int ln = (int)blockIdx.y - slot * lp.lanes;
    ids = LANE_AT(ids, lp, 0, ln);
    act = LANE_AT(act, lp, 1, ln);
    out = LANE_AT(out, lp, 2, ln);
    const int e = slot_entry_c(ids, k, experts, first_slot + slot);
    if (e < 0 || e >= n_entries) return;
    const ExpertEntry& en = table[e];
    if (en.down == 0ull) return;
    const int r_first = blockIdx.x * rpb;
    if (r_first >= en.down_rows) return;
    if (en.fmt != FMT_E4M3 || en.down_vec != E4M3_BPL) __trap();
    gemv_bpl<true>(reinterpret_cast<const u8*>(en.down), reinterpret_cast<const float*>(en.down_scales), 0,
                   act + (size_t)slot * act_pitch, out + (size_t)slot * out_pitch, en.down_rows, en.down_cols,
                   en.down_kw, rpb, blockIdx.x);
}
