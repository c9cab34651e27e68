// Device side of experts_fuse_bench.cu (kept apart so NVRTC can check it without a GPU: `python3
// scripts/sass/nvrtc_cubin.py`'s sources plus this file). The experts seam as ONE launch: the
// gate/up blocks of every slot and the down blocks of every slot in one grid, a down block waiting
// only for its own slot's gate/up blocks (a per-slot count) instead of the whole gate/up grid.
//
// Work is handed out by ticket (an atomic counter), not by blockIdx: tickets 0 .. G-1 are the
// gate/up blocks (slot-major, as expert_gate_up_bpl_f32's grid), G .. G+D-1 the down blocks (as
// expert_down_bpl_f32's). A block holding a down ticket waits only for gate/up tickets, every one
// of which was taken earlier by a block that is running or done and waits on nothing: no order of
// block dispatch can deadlock it. The last block to finish resets the counters for the next launch
// (graph replays reuse the arguments).
//
// Operations per block are those of the two shipped kernels, in the same order (bpl_pairs,
// bpl_row, bpl_kpart, swiglu_c): the act values and down partials must equal the split launches'
// bit for bit (the bench checks). What changes: one launch instead of two, no grid-wide barrier
// between gate/up and down, and act staged with L2-coherent loads (it is written in this launch).

__device__ __forceinline__ u32 ld_acquire_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ctl: [0] ticket, [1] blocks done, [2 + s] gate/up blocks done of slot s. Unclamped SwiGLU, routed
// ids as expert_gate_up_bpl_f32 reads them; every entry E4M3 block per lane without NVFP4 scales.
__device__ __forceinline__ void experts_fused_body(const ExpertEntry* table, int n_entries, int experts,
                                                   const float* ids, int k, int slots, const float* x, float* act,
                                                   int act_pitch, float* out, int out_pitch, int rpb_g, int gblocks,
                                                   int rpb_d, int dblocks, u32* ctl) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ float sv[BPL_SV];
    __shared__ u32 s_ticket;
    kernel_entry();
    if (threadIdx.x == 0) s_ticket = atomicAdd(ctl, 1u);
    __syncthreads();
    const int G = gblocks * slots, total = G + dblocks * slots;
    const int t = (int)s_ticket;
    if (t < G) {
        const int slot = t / gblocks, bx = t - slot * gblocks;
        const int e = slot_entry_c(ids, k, experts, slot);
        if (e >= 0 && e < n_entries && table[e].gate != 0ull && bx * rpb_g < table[e].rows) {
            const ExpertEntry& en = table[e];
            const int r_first = bx * rpb_g;
            const int nrows = min(rpb_g, en.rows - r_first);
            const int nb = en.cols / E4M3_BLOCK, bk = en.kw / E4M3_BLOCK, nk = en.cols / en.kw;
            bpl_stage_x(x, en.cols, xs);
            __syncthreads();
            bpl_pairs(reinterpret_cast<const u8*>(en.gate), reinterpret_cast<const float*>(en.gate_scales), en.row0,
                      r_first, nrows, nb, xs, sv);
            bpl_pairs(reinterpret_cast<const u8*>(en.up), reinterpret_cast<const float*>(en.up_scales), en.row0,
                      r_first, nrows, nb, xs, sv + nrows * nb);
            __syncthreads();
            for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) {
                const float g = bpl_row(sv + rl * nb, nk, bk);
                const float u = bpl_row(sv + (nrows + rl) * nb, nk, bk);
                act[(size_t)slot * act_pitch + r_first + rl] = swiglu_c(g, u, 0, C_ZERO);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(ctl + 2 + slot, 1u);
        }
    } else {
        const int td = t - G;
        const int slot = td / dblocks, bx = td - slot * dblocks;
        const int e = slot_entry_c(ids, k, experts, slot);
        if (e >= 0 && e < n_entries && table[e].down != 0ull && bx * rpb_d < table[e].down_rows) {
            const ExpertEntry& en = table[e];
            const int rows = en.down_rows, r_first = bx * rpb_d;
            const int nrows = min(rpb_d, rows - r_first);
            const int nb = en.down_cols / E4M3_BLOCK, bk = en.down_kw / E4M3_BLOCK, nk = en.down_cols / en.down_kw;
            const u8* codes = reinterpret_cast<const u8*>(en.down);
            if (threadIdx.x == 0) {
                while (ld_acquire_u32(ctl + 2 + slot) < (u32)gblocks) __nanosleep(100);
            }
            __syncthreads();
            bpl_stage_x<true>(act + (size_t)slot * act_pitch, en.down_cols, xs);  // L2-coherent: act is written in this launch
            __syncthreads();
            bpl_pairs(codes, reinterpret_cast<const float*>(en.down_scales), 0, r_first, nrows, nb, xs, sv);
            __syncthreads();
            float* o = out + (size_t)slot * out_pitch;
            for (int i = threadIdx.x; i < nrows * nk; i += blockDim.x) {
                const int kk = i / nrows, rl = i - kk * nrows;
                o[(size_t)kk * rows + r_first + rl] = bpl_kpart(sv + rl * nb, kk, bk);
            }
        }
    }
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(ctl + 1, 1u) == (u32)total - 1u) {
            ctl[0] = 0u;
            ctl[1] = 0u;
            for (int s = 0; s < slots; ++s) ctl[2 + s] = 0u;
            __threadfence();
        }
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 6)
    experts_fused_f32(const ExpertEntry* table, int n_entries, int experts, const float* ids, int k, int slots,
                      const float* x, float* act, int act_pitch, float* out, int out_pitch, int rpb_g, int gblocks,
                      int rpb_d, int dblocks, u32* ctl) {
    experts_fused_body(table, n_entries, experts, ids, k, slots, x, act, act_pitch, out, out_pitch, rpb_g,
                              gblocks, rpb_d, dblocks, ctl);
}
