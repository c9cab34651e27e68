// SEL_DOWN8: an NVFP4_EP2 owner's down sweep fused with its route-weight combine (the device twin
// of twins/down8.rs). The door claims BIT-IDENTICAL, so every value is computed by the operations
// of the kernels it replaces: a (slot, row) partial is experts.cu's expert_task (gemv.cu's
// gemv_task, the dot program and reduce tree of expert_down_f32), the slot fold is fold_slots_f32's
// (+0.0, K-blocks in order, then the NVFP4 down scale once), and the chain is combine_owned_f32's
// (acc = +0; per owned slot in slot order t = +0 + w[s] * y; acc = acc + t). What changes is only
// that the folded slot outputs stay in shared memory: one launch instead of three.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

// Rows per block (one warp per (slot, row) task; 8 warps) and the most routed slots a block stages.
#define DC_ROWS 8
#define DC_MAX_SLOTS 16

// Block bx computes rows bx * DC_ROWS .. of `out` (width = the down rows). Slot s < k is live when
// its id is an expert this rank holds as NVFP4, owned (rule (id / div) % modulo == want); a live
// slot's partials are written to parts[s * parts_pitch + kb * rows + r] (expert_down's layout), a
// slot that is not live writes nothing and adds nothing. Slices [ids, act, parts, w, out].
// `reverse` != 0 is a PLANTED DEFECT (canary_down8_slot_order, twins::down8's
// combine_folded_owned_reversed): the chain walks the slots from k-1 down to 0.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    expert_down_combine_f32(const ExpertEntry* table, int n_entries, int experts, const float* ids, int k, u32 o_experts,
                            u32 o_div, u32 o_mod, u32 o_want, const float* act, int act_pitch, float* parts,
                            int parts_pitch, const float* w, float* out, int width, int reverse) {
    kernel_entry();
    __shared__ float ys[DC_MAX_SLOTS * DC_ROWS];
    __shared__ int live[DC_MAX_SLOTS];
    if ((int)threadIdx.x < k) {
        const int s = (int)threadIdx.x;
        const int e = slot_entry_c(ids, k, experts, s);
        int ok = e >= 0 && e < n_entries && owner_of_c(__float_as_uint(ids[s]), o_experts, o_div, o_mod) == (int)o_want;
        if (ok) ok = table[e].down != 0ull && table[e].fmt == FMT_NVFP4;
        live[s] = ok;
    }
    __syncthreads();
    const int r_first = (int)blockIdx.x * DC_ROWS;
    const int warp = (int)threadIdx.x >> 5;
    const int lane = (int)threadIdx.x & 31;
    for (int task = warp; task < k * DC_ROWS; task += GEMV_WARPS) {
        const int j = task / DC_ROWS;
        const int rl = task - j * DC_ROWS;
        const int r = r_first + rl;
        if (!live[j]) continue;
        const ExpertEntry en = table[slot_entry_c(ids, k, experts, j)];
        if (r >= en.down_rows) continue;
        const int nk = en.down_cols / en.down_kw;
        const float* x = act + (size_t)j * act_pitch;
        float* pj = parts + (size_t)j * parts_pitch;
        float y = C_ZERO;
        for (int kb = 0; kb < nk; ++kb) {
            float p[GEMV_ROWS_PER_TASK];
            expert_task(en.fmt, en.down_vec, en.down, en.down_scales, 0, x, en.down_cols, en.down_kw, r, 1, kb, lane, p);
            if (lane == 0) pj[(size_t)kb * en.down_rows + r] = p[0];
            y = y + p[0];
        }
        if (lane == 0) ys[j * DC_ROWS + rl] = en.has_scales ? y * en.sd : y;
    }
    __syncthreads();
    const int r = r_first + (int)threadIdx.x;
    if ((int)threadIdx.x < DC_ROWS && r < width) {
        float acc = C_ZERO;
        for (int i = 0; i < k; ++i) {
            const int j = reverse ? k - 1 - i : i;
            if (!live[j]) continue;
            const float t = C_ZERO + w[j] * ys[j * DC_ROWS + (int)threadIdx.x];
            acc = acc + t;
        }
        out[r] = acc;
    }
}
