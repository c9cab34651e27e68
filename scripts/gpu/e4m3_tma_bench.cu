// Can the E4M3 expert GEMV reach ≥ 75 % of HBM? (issue 27; the experts seam is 1.93× its floor)
//
// The shipped block-per-lane kernel (`gemv_bpl`, kernels/cuda/gemv.cu) loads a pair's 128 code
// bytes into registers, then decodes and sums them: a warp waits a full memory round trip per
// pair, 64 registers hold 4 blocks per SM, and 720 blocks of 32 rows are 1.36 waves of 528 (the
// last wave a third full). ncu measured it latency-bound (docs/gpu/2026-12-03-e4m3/, 2026-12-04-
// staging/). This microbenchmark times, at the `step` expert gate/up shape (23,040 × 4,096 E4M3,
// the 9 slots' gate and up, rows mode), the shipped kernel against three changes, each alone
// and together, none of which moves an operation:
//
// - persistent blocks over small units (4 or 8 rows) instead of 720 blocks of 32 rows: no last
//   partial wave;
// - half pairs: two threads per (row, 128-column block) pair, one for lane sums 0–15 of the
//   bit-reversed stack and one for 16–31, then one add of the two subtrees — the stack's own last
//   add (left + right), so the same bits — with half the code registers per thread;
// - the codes through a ring of shared-memory stages filled by `cp.async.bulk` (the Hopper bulk
//   copy engine, completion on an mbarrier), so no register waits on HBM and the next units'
//   bytes are in flight while this one is summed.
//
// Every variant's 23,040 rows are compared bit for bit with the host's canonical evaluation.
// Nothing here is shipped: it measures before a kernel of the runtime changes.
//
// Build and run on the GPU machine (nvcc there):
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
//        -I kernels/cuda -o /tmp/e4m3_tma scripts/gpu/e4m3_tma_bench.cu && /tmp/e4m3_tma
#include "canon.cuh"
#include "gemv.cu"

#include "e4m3_host.cuh"

typedef unsigned long long u64;

// ---- Hopper bulk copies into shared memory, completion counted on an mbarrier (PTX ISA 8.0).
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes the barriers' initialisation visible to the async proxy (the bulk copies' completion).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Orders this thread's earlier shared-memory accesses before later async-proxy writes (a stage
// is refilled only after every thread read it: the caller synchronised the block first).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global `src` into shared `dst`.
__device__ __forceinline__ void bulk_to_smem(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

// Wait until the barrier's phase `parity` has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    asm volatile(
        "{\n\t.reg .pred p;\n"
        "WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
        "@!p bra WAIT;\n}" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// ---- Half pairs: leaves 16h .. 16h + 15 of the bit-reversed stack (bpl_dot's groups 4h .. 4h + 3):
// a 16-leaf subtree, closed into one value exactly as bpl_dot closes it.
__device__ __forceinline__ float bpl_half(const uint4 (&c)[4], const float* xsh) {
    float st[5];
    int top = 0;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        const u32 wd[4] = {c[g].x, c[g].y, c[g].z, c[g].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float d[4];
            e4m3x4_decode_finite(wd[j], d);
            const float4 xv = *reinterpret_cast<const float4*>(xsh + 16 * g + 4 * j);
            float v = C_ZERO;
            v = v + d[0] * xv.x;
            v = v + d[1] * xv.y;
            v = v + d[2] * xv.z;
            v = v + d[3] * xv.w;
            int n = 4 * g + j;
#pragma unroll
            for (int lv = 0; lv < 4; ++lv) {
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

// Pair ql's scaled dot from codes at `v` (the pair's vector 0; vectors 32 uint4 apart), thread
// half h: the left subtree on the even lane, the right on the odd one, then left + right (the
// stack's last add) on both. Returns the pair's value on both lanes.
__device__ __forceinline__ float half_pair(const uint4* v, const float* xsb, int h) {
    uint4 c[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) c[g] = v[(4 * h + g) * 32];
    const float mine = bpl_half(c, xsb + 64 * h);
    const float other = __shfl_xor_sync(0xFFFFFFFFu, mine, 1);
    return h == 0 ? mine + other : other + mine;
}

// The shipped kernel, rows mode, at the experts' launch bounds (4 blocks per SM).
__global__ void __launch_bounds__(GEMV_THREADS, 4)
    rows_shipped(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw,
                 int rpb) {
    gemv_bpl<false>(codes, scales, 0, x, out, rows, cols, kw, rpb, blockIdx.x);
}

// The shipped grid (blocks of rpb rows) with half pairs: what half pairs give alone.
template <int MIN_BLOCKS>
__global__ void __launch_bounds__(GEMV_THREADS, MIN_BLOCKS)
    rows_half(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw, int rpb) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ float sv[BPL_SV];
    const int r_first = blockIdx.x * rpb;
    if (r_first >= rows) return;  // block-uniform
    const int nrows = min(rpb, rows - r_first);
    const int nb = cols / E4M3_BLOCK, bk = kw / E4M3_BLOCK, nk = cols / kw;
    bpl_stage_x(x, cols, xs);
    __syncthreads();
    const uint4* base = reinterpret_cast<const uint4*>(codes);
    const int npairs = nrows * nb;  // a multiple of 16 here (nb = 32): whole warps in the loop
    const size_t q0 = (size_t)r_first * nb;
    for (int t = threadIdx.x; t < 2 * npairs; t += blockDim.x) {
        const int ql = t >> 1, h = t & 1;
        const size_t q = q0 + (size_t)ql;
        const float d = half_pair(base + (q >> 5) * 256 + (q & 31), xs + (ql % nb) * BPL_XS_PITCH, h);
        const int rl = ql / nb, b = ql - rl * nb;
        if (h == 0) sv[ql] = __ldg(scales + (size_t)((r_first + rl) / E4M3_BLOCK) * nb + b) * d;
    }
    __syncthreads();
    for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) out[r_first + rl] = bpl_row(sv + rl * nb, nk, bk);
}

// Folds a unit's rows from sv (its pairs' scaled dots) into out, one thread per row.
__device__ __forceinline__ void fold_unit(const float* sv, float* out, int row0, int unit_rows, int nb, int nk,
                                          int bk) {
    for (int rl = threadIdx.x; rl < unit_rows; rl += blockDim.x) out[row0 + rl] = bpl_row(sv + rl * nb, nk, bk);
}

// Persistent blocks over units of UNIT rows, half pairs, codes read straight from global memory
// (no staging ring): what persistence and half pairs give without the bulk copies.
template <int UNIT, int MIN_BLOCKS>
__global__ void __launch_bounds__(GEMV_THREADS, MIN_BLOCKS)
    rows_persist_half(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ float sv[BPL_SV];
    const int nb = cols / E4M3_BLOCK, bk = kw / E4M3_BLOCK, nk = cols / kw;
    const int unit_pairs = UNIT * nb, units = rows / UNIT;
    bpl_stage_x(x, cols, xs);
    __syncthreads();
    const uint4* base = reinterpret_cast<const uint4*>(codes);
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const size_t q0 = (size_t)u * unit_pairs;
        for (int t = threadIdx.x; t < 2 * unit_pairs; t += blockDim.x) {
            const int ql = t >> 1, h = t & 1;
            const size_t q = q0 + (size_t)ql;
            const float* xsb = xs + (ql % nb) * BPL_XS_PITCH;
            const float d = half_pair(base + (q >> 5) * 256 + (q & 31), xsb, h);
            const int rl = ql / nb, b = ql - rl * nb;
            if (h == 0) sv[ql] = __ldg(scales + (size_t)((u * UNIT + rl) / E4M3_BLOCK) * nb + b) * d;
        }
        __syncthreads();
        fold_unit(sv, out, u * UNIT, UNIT, nb, nk, bk);
        __syncthreads();
    }
}

// Persistent blocks over units of UNIT rows whose codes arrive through a ring of NBUF shared-memory
// stages filled by bulk copies; HALF: two threads per pair (else one, with bpl_dot). A unit's pairs
// are contiguous in the block-per-lane layout (UNIT * nb is a multiple of 32), so one bulk copy
// fills a stage. Dynamic shared memory: NBUF stages, then x, the unit's dots and the barriers.
template <int UNIT, int NBUF, bool HALF, int MIN_BLOCKS>
__global__ void __launch_bounds__(GEMV_THREADS, MIN_BLOCKS)
    rows_tma(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int nb = cols / E4M3_BLOCK, bk = kw / E4M3_BLOCK, nk = cols / kw;
    const int unit_pairs = UNIT * nb, units = rows / UNIT;
    const u32 unit_bytes = (u32)unit_pairs * 128u;
    uint4* ring = reinterpret_cast<uint4*>(smem);
    float* xs = reinterpret_cast<float*>(smem + (size_t)NBUF * unit_bytes);
    float* sv = xs + nb * BPL_XS_PITCH;
    u64* bars = reinterpret_cast<u64*>(sv + unit_pairs);
    if (threadIdx.x == 0) {
        for (int i = 0; i < NBUF; ++i) mbar_init(&bars[i], 1);
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < NBUF; ++i) {
            const int u = blockIdx.x + i * gridDim.x;
            if (u >= units) break;
            mbar_arrive_expect_tx(&bars[i], unit_bytes);
            bulk_to_smem(ring + (size_t)i * (unit_bytes / 16), codes + (size_t)u * unit_bytes, unit_bytes, &bars[i]);
        }
    }
    bpl_stage_x(x, cols, xs);
    __syncthreads();
    int i = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x, ++i) {
        const int buf = i % NBUF;
        mbar_wait(&bars[buf], (u32)((i / NBUF) & 1));
        const uint4* stage = ring + (size_t)buf * (unit_bytes / 16);
        if (HALF) {
            for (int t = threadIdx.x; t < 2 * unit_pairs; t += blockDim.x) {
                const int ql = t >> 1, h = t & 1;
                const float d = half_pair(stage + (ql >> 5) * 256 + (ql & 31), xs + (ql % nb) * BPL_XS_PITCH, h);
                const int rl = ql / nb, b = ql - rl * nb;
                if (h == 0) sv[ql] = __ldg(scales + (size_t)((u * UNIT + rl) / E4M3_BLOCK) * nb + b) * d;
            }
        } else {
            for (int ql = threadIdx.x; ql < unit_pairs; ql += blockDim.x) {
                const uint4* v = stage + (ql >> 5) * 256 + (ql & 31);
                uint4 c[8];
#pragma unroll
                for (int g = 0; g < 8; ++g) c[g] = v[g * 32];
                const int rl = ql / nb, b = ql - rl * nb;
                const float d = bpl_dot(c, xs + b * BPL_XS_PITCH);
                sv[ql] = __ldg(scales + (size_t)((u * UNIT + rl) / E4M3_BLOCK) * nb + b) * d;
            }
        }
        __syncthreads();  // the stage is read and the unit's dots are in sv
        if (threadIdx.x == 0) {
            const int next = u + NBUF * gridDim.x;
            if (next < units) {
                fence_proxy_async();
                mbar_arrive_expect_tx(&bars[buf], unit_bytes);
                bulk_to_smem(ring + (size_t)buf * (unit_bytes / 16), codes + (size_t)next * unit_bytes, unit_bytes,
                             &bars[buf]);
            }
        }
        fold_unit(sv, out, u * UNIT, UNIT, nb, nk, bk);
        __syncthreads();  // sv is free for the next unit
    }
}

template <int UNIT, int NBUF>
static size_t tma_smem(int cols) {
    const int nb = cols / E4M3_BLOCK;
    return (size_t)NBUF * UNIT * nb * 128 + (size_t)nb * BPL_XS_PITCH * 4 + (size_t)UNIT * nb * 4 + NBUF * 8;
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // each variant's line survives a later one that hangs
    const int rows = 23040, cols = 4096, kw = 512, rpb = 32;
    const E4m3Problem pr(rows, cols, kw);
    const size_t n = pr.bytes();
    const int sms = sm_count();
    const E4m3OnDevice dev(pr);
    u8* d_bpl = dev.bpl;
    float *d_sc = dev.sc, *d_x = dev.x, *d_o = dev.out;
    std::vector<float> want(rows);
    for (int r = 0; r < rows; ++r) want[r] = pr.row(r, false);
    const double tbs = copy_tbs();
    const double floor_us = (double)n / (tbs * 1e12) * 1e6;
    printf("d2d copy 1 GiB: %.2f TB/s (read + write); floor of this GEMV at that rate: %.1f us; %d SMs\n", tbs,
           floor_us, sms);
    double shipped = 0.0;
    // Occupancy from the runtime, then 41 timed launches; every row checked against the host.
    auto run = [&](const char* name, const void* fn, int grid_per_sm, size_t smem, auto launch) {
        if (smem > 48 * 1024) CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, GEMV_THREADS, smem));
        const int grid = grid_per_sm > 0 ? per_sm * sms : -grid_per_sm;
        CK(cudaMemset(d_o, 0xFF, rows * 4));
        for (int i = 0; i < 3; ++i) launch(grid);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        const std::vector<float> ms = timed_ms(41, [&] { launch(grid); });
        CK(cudaGetLastError());
        std::vector<float> o(rows);
        CK(cudaMemcpy(o.data(), d_o, rows * 4, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < rows; ++r) bad += memcmp(&o[r], &want[r], 4) != 0;
        const double us = ms[20] * 1000.0;
        if (shipped == 0.0) shipped = us;
        printf("%-44s %d blocks/SM grid %5d smem %6zu  median %6.1f us (min %6.1f max %6.1f) %5.2f TB/s  "
               "%.2fx floor  %.3fx shipped  rows != host: %d of %d\n",
               name, per_sm, grid, smem, us, ms[0] * 1000.0, ms[40] * 1000.0, (double)n / (us * 1e-6) / 1e12,
               us / floor_us, us / shipped, bad, rows);
    };
    run("shipped (720 blocks x 32 rows)", (const void*)rows_shipped, -((rows + rpb - 1) / rpb), 0, [&](int g) {
        rows_shipped<<<g, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw, rpb);
    });
    run("half pairs, shipped grid, 6/SM", (const void*)rows_half<6>, -((rows + rpb - 1) / rpb), 0, [&](int g) {
        rows_half<6><<<g, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw, rpb);
    });
#define PERSIST_VARIANT(NAME, UNIT, MINB)                                                                 \
    run(NAME, (const void*)rows_persist_half<UNIT, MINB>, 1, 0, [&](int g) {                               \
        rows_persist_half<UNIT, MINB><<<g, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw);         \
    })
    PERSIST_VARIANT("persistent, half pairs, 4-row units", 4, 4);
    PERSIST_VARIANT("persistent, half pairs, 8-row units", 8, 4);
    PERSIST_VARIANT("persistent, half pairs, 4-row units, 6/SM", 4, 6);
#define TMA_VARIANT(NAME, UNIT, NBUF, HALF, MINB)                                                              \
    do {                                                                                                        \
        const size_t sm = tma_smem<UNIT, NBUF>(cols);                                                           \
        run(NAME, (const void*)rows_tma<UNIT, NBUF, HALF, MINB>, 1, sm, [&](int g) {                            \
            rows_tma<UNIT, NBUF, HALF, MINB><<<g, GEMV_THREADS, sm>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw); \
        });                                                                                                     \
    } while (0)
    TMA_VARIANT("bulk ring: 8-row units x 2 stages, full pairs", 8, 2, false, 2);
    TMA_VARIANT("bulk ring: 4-row units x 2 stages, half pairs", 4, 2, true, 4);
    TMA_VARIANT("bulk ring: 4-row units x 3 stages, half pairs", 4, 3, true, 3);
    TMA_VARIANT("bulk ring: 4-row units x 4 stages, half pairs", 4, 4, true, 2);
    TMA_VARIANT("bulk ring: 2-row units x 4 stages, half pairs", 2, 4, true, 4);
    TMA_VARIANT("bulk ring: 2-row units x 2 stages, half pairs, 6/SM", 2, 2, true, 6);
    return 0;
}
