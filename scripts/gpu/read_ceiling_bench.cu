// How fast can a kernel only READ the bytes of a `step` seam on this card? (issue 27)
//
// PERFORMANCE.md's floors divide a seam's bytes by the 1 GiB device-to-device copy rate. A seam's
// kernel is shorter (20–50 µs) and reads without writing; this measures, on the same buffer, what
// pure reads reach at each seam's size, and how much of the E4M3 block-per-lane GEMV's time
// (the experts) is its loads alone:
// - `stream U`: a grid-stride loop, 8 blocks of 256 threads per SM, U 16-byte loads per thread per
//   iteration issued together, xor-reduced (the loads cannot be elided: the result is stored when
//   it equals a value it never takes);
// - `bpl loads only`: the shipped E4M3 GEMV's grid, blocks, pairs and load order (`gemv_bpl` at
//   6 blocks per SM, the runtime's bound) with the decode and sums replaced by the xor — its
//   memory schedule without its arithmetic;
// - `bpl shipped`: the shipped kernel itself at 6 blocks per SM, its rows checked against the host,
//   and on 8 of the 9 slots' rows (does its time follow its bytes?);
// - `bpl, rows interleaved`: the same blocks computing interleaved rows (each pass of the blocks
//   reads one window of the matrix), with loads only and whole, its rows checked;
// - `variant: …`: the loads-only schedule with x staged by the scalar loop of before 2026-12-06, by
//   gemv.cu's float4 staging, or not at all; with the first codes loaded before the staging, at
//   8 blocks per SM, and with 8-row blocks (a grid of several waves instead of one).
// Sizes: the experts' gate+up codes of 9 slots (23,040 × 4,096 = 94.4 MB), down (47.2 MB),
// qkv's BF16 q/k/v/gate (about 50.3 MB), o_proj (33.6 MB), the router (2.4 MB).
//
// Build and run on the GPU machine (nvcc there):
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
//        -I kernels/cuda -o /tmp/read_ceiling scripts/gpu/read_ceiling_bench.cu && /tmp/read_ceiling
#include "canon.cuh"
#include "gemv.cu"

#include "e4m3_host.cuh"

#define NEVER 0x9E3779B9u

template <int U>
__global__ void __launch_bounds__(256) stream_read(const uint4* __restrict__ p, size_t n16, u32* sink) {
    u32 acc = 0u;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = __ldg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == NEVER) sink[0] = acc;
}

// gemv.cu's staging of x before 2026-12-06 (one scalar load per value, each waited for before the
// next: 16 round trips to L2 per thread at 4,096 columns), kept to compare with today's.
__device__ __forceinline__ void bpl_stage_x_scalar(const float* __restrict__ x, int cols, float* xs) {
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int b = c >> 7, e = c & 127;
        xs[b * BPL_XS_PITCH + 4 * brev5_c(e & 31) + (e >> 5)] = x[c];
    }
}

// Variants of the loads-only schedule below, to separate what makes it slower than a stream:
// STAGE: x staged in shared memory first (1: the scalar loop of before 2026-12-06, 2: gemv.cu's
// bpl_stage_x, float4 loads issued together; 0: not staged); EARLY: the thread's first pair of codes
// loaded before the staging; TWO: two pairs' codes in flight per thread instead of one; MINB: the
// launch bound (blocks per SM). The grid is rows / rpb blocks.
template <int STAGE, bool EARLY, bool TWO, int MINB>
__global__ void __launch_bounds__(GEMV_THREADS, MINB)
    bpl_loads_variant(const u8* codes, const float* x, int rows, int cols, int rpb, u32* sink) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    const int r_first = blockIdx.x * rpb;
    if (r_first >= rows) return;
    const int nb = cols / E4M3_BLOCK, npairs = min(rpb, rows - r_first) * nb;
    const uint4* base = reinterpret_cast<const uint4*>(codes);
    const size_t q0 = (size_t)r_first * nb;
    auto at = [&](int ql) { const size_t q = q0 + (size_t)ql; return base + (q >> 5) * 256 + (q & 31); };
    u32 acc = 0u;
    int ql = threadIdx.x;
    if (EARLY && ql < npairs) {
        uint4 c[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) c[g] = __ldg(at(ql) + g * 32);
#pragma unroll
        for (int g = 0; g < 8; ++g) acc ^= c[g].x ^ c[g].y ^ c[g].z ^ c[g].w;
        ql += blockDim.x;
    }
    if (STAGE != 0) {
        if (STAGE == 1) bpl_stage_x_scalar(x, cols, xs);
        if (STAGE == 2) bpl_stage_x(x, cols, xs);
        __syncthreads();
        acc ^= __float_as_uint(xs[threadIdx.x % (nb * BPL_XS_PITCH)]);
    }
    if (TWO) {
        for (; ql + (int)blockDim.x < npairs; ql += 2 * blockDim.x) {
            uint4 c[16];
#pragma unroll
            for (int g = 0; g < 8; ++g) c[g] = __ldg(at(ql) + g * 32);
#pragma unroll
            for (int g = 0; g < 8; ++g) c[8 + g] = __ldg(at(ql + blockDim.x) + g * 32);
#pragma unroll
            for (int g = 0; g < 16; ++g) acc ^= c[g].x ^ c[g].y ^ c[g].z ^ c[g].w;
        }
    }
    for (; ql < npairs; ql += blockDim.x) {
        uint4 c[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) c[g] = __ldg(at(ql) + g * 32);
#pragma unroll
        for (int g = 0; g < 8; ++g) acc ^= c[g].x ^ c[g].y ^ c[g].z ^ c[g].w;
    }
    if (acc == NEVER) sink[3] = acc;
}

// gemv_bpl's memory schedule (rows mode): x staged, then each thread's pairs, 8 vectors each.
__global__ void __launch_bounds__(GEMV_THREADS, 6)
    bpl_loads_only(const u8* codes, const float* x, float* out, int rows, int cols, int rpb, u32* sink) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ u32 sv[BPL_SV];
    const int r_first = blockIdx.x * rpb;
    if (r_first >= rows) return;
    const int nrows = min(rpb, rows - r_first);
    const int nb = cols / E4M3_BLOCK;
    bpl_stage_x(x, cols, xs);
    __syncthreads();
    const uint4* base = reinterpret_cast<const uint4*>(codes);
    const size_t q0 = (size_t)r_first * nb;
    for (int ql = threadIdx.x; ql < nrows * nb; ql += blockDim.x) {
        const size_t q = q0 + (size_t)ql;
        const uint4* v = base + (q >> 5) * 256 + (q & 31);
        uint4 c[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) c[g] = __ldg(v + g * 32);
        u32 acc = __float_as_uint(xs[(ql % nb) * BPL_XS_PITCH]);
#pragma unroll
        for (int g = 0; g < 8; ++g) acc ^= c[g].x ^ c[g].y ^ c[g].z ^ c[g].w;
        sv[ql] = acc;
    }
    __syncthreads();
    for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) {
        u32 acc = 0u;
        for (int b = 0; b < nb; ++b) acc ^= sv[rl * nb + b];
        if (acc == NEVER) sink[1] = acc;
        out[r_first + rl] = 0.0f;
    }
}

// The shipped GEMV with its rows interleaved across blocks (branch inter's BplRows): block-local
// row rl of block blk is row (rl / 8) · 8 · nblk + blk · 8 + rl % 8 (8 = 256 threads / 32 pairs
// per row: one pass of the block), so at any moment the blocks read one window of the matrix.
// LOADS_ONLY: the xor in place of the decode and sums.
template <bool LOADS_ONLY>
__global__ void __launch_bounds__(GEMV_THREADS, 6)
    bpl_interleaved(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw,
                    int rpb, u32* sink) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ float sv[BPL_SV];
    const int nb = cols / E4M3_BLOCK, bk = kw / E4M3_BLOCK, nk = cols / kw;
    const int nblk = (rows + rpb - 1) / rpb, q = GEMV_THREADS / nb, blk = blockIdx.x;
    auto row_of = [&](int rl) { return (rl / q) * q * nblk + blk * q + rl % q; };
    bpl_stage_x(x, cols, xs);
    __syncthreads();
    const uint4* base = reinterpret_cast<const uint4*>(codes);
    for (int ql = threadIdx.x; ql < rpb * nb; ql += blockDim.x) {
        const int rl = ql / nb, b = ql - rl * nb, r = row_of(rl);
        if (r >= rows) continue;
        const size_t qq = (size_t)r * nb + b;
        const uint4* v = base + (qq >> 5) * 256 + (qq & 31);
        uint4 c[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) c[g] = __ldg(v + g * 32);
        if (LOADS_ONLY) {
            u32 acc = __float_as_uint(xs[b * BPL_XS_PITCH]);
#pragma unroll
            for (int g = 0; g < 8; ++g) acc ^= c[g].x ^ c[g].y ^ c[g].z ^ c[g].w;
            sv[ql] = __uint_as_float(acc);
        } else {
            const float d = bpl_dot(c, xs + b * BPL_XS_PITCH);
            sv[ql] = __ldg(scales + (size_t)(r / E4M3_BLOCK) * nb + b) * d;
        }
    }
    __syncthreads();
    for (int rl = threadIdx.x; rl < rpb; rl += blockDim.x) {
        const int r = row_of(rl);
        if (r >= rows) continue;
        if (LOADS_ONLY) {
            u32 acc = 0u;
            for (int b = 0; b < nb; ++b) acc ^= __float_as_uint(sv[rl * nb + b]);
            if (acc == NEVER) sink[2] = acc;
            out[r] = 0.0f;
        } else {
            out[r] = bpl_row(sv + rl * nb, nk, bk);
        }
    }
}

__global__ void __launch_bounds__(GEMV_THREADS, 6)
    bpl_shipped(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw,
                int rpb) {
    gemv_bpl<false>(codes, scales, 0, x, out, rows, cols, kw, rpb, blockIdx.x);
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const int rows = 23040, cols = 4096, kw = 512, rpb = 32;
    const E4m3Problem pr(rows, cols, kw);
    const size_t n = pr.bytes();
    const int sms = sm_count();
    const E4m3OnDevice dev(pr);
    u8* d_bpl = dev.bpl;
    float *d_sc = dev.sc, *d_x = dev.x, *d_o = dev.out;
    u32* d_sink;
    CK(cudaMalloc(&d_sink, 64));
    std::vector<float> want(rows);
    for (int r = 0; r < rows; ++r) want[r] = pr.row(r, false);
    // A 1 GiB buffer the timed reads rotate through, so no seam-sized read finds its bytes in L2.
    const size_t big = (size_t)1 << 30;
    u8* d_big;
    CK(cudaMalloc(&d_big, big));
    CK(cudaMemset(d_big, 0x5A, big));
    const double tbs = copy_tbs();
    printf("device-to-device copy 1 GiB: %.2f TB/s (read + write); %d SMs\n", tbs, sms);
    printf("%-34s %10s %9s %9s %9s %8s %s\n", "what", "MB", "median us", "min us", "TB/s", "x floor", "note");
    auto report = [&](const char* name, size_t bytes, const std::vector<float>& ms, const char* note) {
        const double us = ms[ms.size() / 2] * 1000.0;
        const double floor_us = (double)bytes / (tbs * 1e12) * 1e6;
        printf("%-34s %10.1f %9.1f %9.1f %9.2f %8.2f %s\n", name, bytes / 1e6, us, ms[0] * 1000.0,
               (double)bytes / (us * 1e-6) / 1e12, us / floor_us, note);
    };
    const struct {
        const char* seam;
        size_t bytes;
    } sizes[] = {{"experts gate+up (9 slots)", n},
                 {"experts down (9 slots)", n / 2},
                 {"qkv q/k/v/gate BF16", (size_t)(4096 + 1024 + 1024 + 32) * 4096 * 2},
                 {"o_proj BF16", (size_t)4096 * 4096 * 2},
                 {"router BF16", (size_t)288 * 4096 * 2}};
    for (const auto& s : sizes) {
        for (int u : {2, 4, 8}) {
            size_t off = 0;
            const size_t n16 = s.bytes / 16;
            const int grid = sms * 8;
            auto launch = [&] {
                const uint4* p = reinterpret_cast<const uint4*>(d_big + off);
                if (u == 2) stream_read<2><<<grid, 256>>>(p, n16, d_sink);
                if (u == 4) stream_read<4><<<grid, 256>>>(p, n16, d_sink);
                if (u == 8) stream_read<8><<<grid, 256>>>(p, n16, d_sink);
                off = (off + ((s.bytes + 4095) & ~(size_t)4095)) % (big - s.bytes);
                off &= ~(size_t)4095;
            };
            for (int i = 0; i < 3; ++i) launch();
            CK(cudaDeviceSynchronize());
            const std::vector<float> ms = timed_ms(41, launch);
            CK(cudaGetLastError());
            char name[64];
            snprintf(name, sizeof name, "stream U=%d: %s", u, s.seam);
            report(name, s.bytes, ms, "");
        }
    }
    // Loads-only variants of the GEMV's schedule on its own buffer (94.4 MB, larger than L2).
    {
        auto variant = [&](const char* name, auto kernel, int rows_per_block) {
            const int g = (rows + rows_per_block - 1) / rows_per_block;
            std::vector<float> ms = timed_ms(41, [&] { kernel<<<g, GEMV_THREADS>>>(d_bpl, d_x, rows, cols, rows_per_block, d_sink); });
            CK(cudaGetLastError());
            report(name, n, ms, "");
        };
        for (int round = 0; round < 2; ++round) {
            variant("variant: staged scalar, 6/SM (before 2026-12-06)", bpl_loads_variant<1, false, false, 6>, rpb);
            variant("variant: staged float4, 6/SM (as shipped)", bpl_loads_variant<2, false, false, 6>, rpb);
            variant("variant: no x staging, 6/SM", bpl_loads_variant<0, false, false, 6>, rpb);
            variant("variant: float4, first codes before staging", bpl_loads_variant<2, true, false, 6>, rpb);
            variant("variant: staged float4, 8/SM", bpl_loads_variant<2, false, false, 8>, rpb);
            variant("variant: staged float4, 8 rows/block, 6/SM", bpl_loads_variant<2, false, false, 6>, 8);
            variant("variant: staged scalar, 8 rows/block, 6/SM", bpl_loads_variant<1, false, false, 6>, 8);
            variant("variant: no staging, 8 rows/block", bpl_loads_variant<0, false, false, 8>, 8);
        }
    }
    // The E4M3 GEMV's own buffer (94.4 MB, larger than L2): reads only, then the shipped kernel.
    const int grid = (rows + rpb - 1) / rpb;
    for (int round = 0; round < 2; ++round) {
        std::vector<float> ms = timed_ms(41, [&] {
            bpl_loads_only<<<grid, GEMV_THREADS>>>(d_bpl, d_x, d_o, rows, cols, rpb, d_sink);
        });
        CK(cudaGetLastError());
        report("bpl loads only, 6/SM", n, ms, "the shipped grid and load order");
        CK(cudaMemset(d_o, 0xFF, rows * 4));
        ms = timed_ms(41, [&] { bpl_shipped<<<grid, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw, rpb); });
        CK(cudaGetLastError());
        std::vector<float> o(rows);
        CK(cudaMemcpy(o.data(), d_o, rows * 4, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < rows; ++r) bad += memcmp(&o[r], &want[r], 4) != 0;
        char note[64];
        snprintf(note, sizeof note, "rows != host: %d of %d", bad, rows);
        report("bpl shipped, 6/SM", n, ms, note);
        // 8 of the 9 slots' rows: does the kernel's time scale with its bytes (bandwidth-bound),
        // or stay (one wave, latency-bound)? What moving one slot off the kernel would give.
        const int rows8 = rows / 9 * 8;
        ms = timed_ms(41, [&] {
            bpl_shipped<<<(rows8 + rpb - 1) / rpb, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows8, cols, kw, rpb);
        });
        CK(cudaGetLastError());
        report("bpl shipped, 6/SM, 8 of 9 slots", (size_t)rows8 * cols, ms, "");
        ms = timed_ms(41, [&] {
            bpl_interleaved<true><<<grid, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw, rpb, d_sink);
        });
        CK(cudaGetLastError());
        report("bpl loads only, rows interleaved", n, ms, "");
        CK(cudaMemset(d_o, 0xFF, rows * 4));
        ms = timed_ms(41, [&] {
            bpl_interleaved<false><<<grid, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw, rpb, d_sink);
        });
        CK(cudaGetLastError());
        CK(cudaMemcpy(o.data(), d_o, rows * 4, cudaMemcpyDeviceToHost));
        bad = 0;
        for (int r = 0; r < rows; ++r) bad += memcmp(&o[r], &want[r], 4) != 0;
        snprintf(note, sizeof note, "rows != host: %d of %d", bad, rows);
        report("bpl, rows interleaved", n, ms, note);
        for (int u : {4, 8}) {
            ms = timed_ms(41, [&] {
                const uint4* p = reinterpret_cast<const uint4*>(d_bpl);
                if (u == 4) stream_read<4><<<sms * 8, 256>>>(p, n / 16, d_sink);
                if (u == 8) stream_read<8><<<sms * 8, 256>>>(p, n / 16, d_sink);
            });
            char name[64];
            snprintf(name, sizeof name, "stream U=%d: the GEMV's buffer", u);
            report(name, n, ms, "");
        }
    }
    return 0;
}
