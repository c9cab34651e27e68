// What does programmatic dependent launch buy on this GPU, outside the runtime? A decode layer is
// a chain of dependent kernels where single-block row kernels (norms, top-k) alternate with
// weight-streaming kernels (GEMVs); this times such a chain captured as one CUDA graph, three ways:
// - `plain`:    ordinary launches: each kernel is scheduled after the one before has completed;
// - `pdl`:      every launch with programmatic stream serialization, every kernel opening with
//               griddepcontrol.wait then launch_dependents (the runtime's `kernel_entry()`), so
//               the next kernel's launch and block dispatch overlap the one before;
// - `pdl+pf`:   as pdl, and each streaming block first prefetches its weight bytes into L2
//               (cp.async.bulk.prefetch.L2) before the wait (branch pdl's `kernel_entry_prefetch`,
//               which lost in the runtime: docs/gpu/2026-12-05-loads/);
// - `pdl+row`:  as pdl with a second row kernel after the first (y2 = row(y), stream reads y2):
//               what one more dependent single-block kernel costs in the chain;
// - `pdl-row`:  as pdl without the row kernels (the stream kernels read x, then o): what the
//               row kernels cost together. The last two compute something else: not compared.
// The chain: 16 pairs of (row kernel: one block normalising a 4096-wide f32 row; stream kernel:
// 1024 blocks, each reading its 8 rows x 4096 bytes of a 32 MiB weight and writing 8 dot products
// with the row). Each pair has its own weight (512 MiB in all, so no weight is in L2 when its turn
// comes). The three variants do the same arithmetic in the same order: their final rows are
// compared bit for bit.
//
// Build and run on the GPU machine (nvcc there):
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
//        -I kernels/cuda -o /tmp/pdl_chain scripts/gpu/pdl_chain_bench.cu && /tmp/pdl_chain
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <vector>

#include "canon.cuh"
#include "cuda_check.cuh"

#define ROW 4096
#define THREADS 256
#define PER (ROW / THREADS)
#define PAIRS 16
#define ROWS_PER_BLOCK 8
#define BLOCKS (ROW / ROWS_PER_BLOCK)
#define WEIGHT_BYTES ((size_t)ROW * ROW)

__device__ __forceinline__ void entry(bool pdl) {
    if (pdl) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
}

// y = x * rsqrt(mean(x^2) + 1), one block (the dependency chain of a norm).
template <bool PDL>
__global__ void row_kernel(const float* __restrict__ x, float* __restrict__ y) {
    entry(PDL);
    __shared__ float s_warp[THREADS / 32];
    float v[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) v[j] = x[threadIdx.x + j * THREADS];
    float acc = C_ZERO;
#pragma unroll
    for (int j = 0; j < PER; ++j) acc = acc + v[j] * v[j];
    for (int o = 16; o > 0; o >>= 1) acc = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = acc;
    __syncthreads();
    float ss = C_ZERO;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) ss = ss + s_warp[w];
    const float inv = rsqrt_c(div_c(ss, (float)ROW) + C_ONE);
#pragma unroll
    for (int j = 0; j < PER; ++j) y[threadIdx.x + j * THREADS] = v[j] * inv;
}

// out[r] = sum over c of w[r][c] * x[c] for this block's 8 rows: each warp one row at a time,
// lanes strided over 16-byte vectors, a fixed butterfly.
template <bool PDL, bool PREFETCH>
__global__ void stream_kernel(const unsigned char* __restrict__ w, const float* __restrict__ x,
                              float* __restrict__ out) {
    const unsigned char* mine = w + (size_t)blockIdx.x * ROWS_PER_BLOCK * ROW;
    if (PREFETCH && threadIdx.x == 0) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(mine), "r"((unsigned)(ROWS_PER_BLOCK * ROW))
                     : "memory");
    }
    entry(PDL);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = warp;  // 8 warps, 8 rows
    const uint4* wr = reinterpret_cast<const uint4*>(mine + (size_t)r * ROW);
    float acc = C_ZERO;
#pragma unroll
    for (int i = 0; i < ROW / 16 / 32; ++i) {
        const uint4 q = wr[lane + 32 * i];
        const unsigned words[4] = {q.x, q.y, q.z, q.w};
        const int c0 = (lane + 32 * i) * 16;
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const float code = (float)((words[k >> 2] >> (8 * (k & 3))) & 0xFFu);
            acc = acc + code * x[c0 + k];
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    if (lane == 0) out[blockIdx.x * ROWS_PER_BLOCK + r] = acc;
}

template <typename K, typename... A>
static void launch(bool pdl, K kernel, int grid, cudaStream_t s, A... args) {
    launch_ex(pdl, kernel, dim3(grid), dim3(THREADS), s, args...);
}

int main(int argc, char** argv) {
    const int replays = argc > 1 ? atoi(argv[1]) : 20;
    unsigned char* w;
    float *x, *y, *y2, *o;
    CK(cudaMalloc(&w, WEIGHT_BYTES * PAIRS));
    CK(cudaMalloc(&x, ROW * sizeof(float)));
    CK(cudaMalloc(&y, ROW * sizeof(float)));
    CK(cudaMalloc(&y2, ROW * sizeof(float)));
    CK(cudaMalloc(&o, ROW * sizeof(float)));
    {
        std::vector<unsigned char> hw(WEIGHT_BYTES);
        for (size_t i = 0; i < hw.size(); ++i) hw[i] = (unsigned char)((i * 2654435761u) >> 24);
        for (int p = 0; p < PAIRS; ++p) CK(cudaMemcpy(w + WEIGHT_BYTES * p, hw.data(), WEIGHT_BYTES, cudaMemcpyHostToDevice));
        std::vector<float> hx(ROW);
        for (int i = 0; i < ROW; ++i) hx[i] = (float)((i % 7) + 1);
        CK(cudaMemcpy(x, hx.data(), ROW * sizeof(float), cudaMemcpyHostToDevice));
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const char* names[5] = {"plain", "pdl", "pdl+pf", "pdl+row", "pdl-row"};
    std::vector<float> first(ROW), got(ROW);
    float base_us = 0.0f;
    for (int v = 0; v < 5; ++v) {
        const bool pdl = v > 0;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        // Pair p: y = row(p == 0 ? x : o); o = stream(w_p, y).
        for (int p = 0; p < PAIRS; ++p) {
            const float* in = p == 0 ? x : o;
            const unsigned char* wp = w + WEIGHT_BYTES * p;
            if (v == 4) {
                launch(true, stream_kernel<true, false>, BLOCKS, s, wp, in, o);
                continue;
            }
            if (pdl) launch(true, row_kernel<true>, 1, s, in, y);
            else launch(false, row_kernel<false>, 1, s, in, y);
            if (v == 3) launch(true, row_kernel<true>, 1, s, (const float*)y, y2);
            if (v == 0) launch(false, stream_kernel<false, false>, BLOCKS, s, wp, (const float*)y, o);
            if (v == 1) launch(true, stream_kernel<true, false>, BLOCKS, s, wp, (const float*)y, o);
            if (v == 2) launch(true, stream_kernel<true, true>, BLOCKS, s, wp, (const float*)y, o);
            if (v == 3) launch(true, stream_kernel<true, false>, BLOCKS, s, wp, (const float*)y2, o);
        }
        cudaGraph_t g;
        CK(cudaStreamEndCapture(s, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));  // warm-up
        std::vector<float> ms(replays);
        for (int i = 0; i < replays; ++i) {
            CK(cudaEventRecord(e0, s));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms[i], e0, e1));
        }
        std::sort(ms.begin(), ms.end());
        const float med_us = ms[replays / 2] * 1e3f;
        if (v == 0) base_us = med_us;
        CK(cudaMemcpy(v == 0 ? first.data() : got.data(), o, ROW * sizeof(float), cudaMemcpyDeviceToHost));
        const bool same = v == 0 || memcmp(first.data(), got.data(), ROW * sizeof(float)) == 0;
        printf("%-7s chain of %d pairs: median %8.1f us (%6.2f us per pair, %.3fx plain)  final row %s\n", names[v],
               PAIRS, med_us, med_us / PAIRS, med_us / base_us,
               v >= 3 ? "(another computation: not compared)" : same ? "identical to plain" : "DIFFERS from plain");
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    printf("weight bytes per chain %.1f MiB (floor at 4.1 TB/s: %.1f us)\n", WEIGHT_BYTES * PAIRS / 1048576.0,
           WEIGHT_BYTES * PAIRS / 4.1e12 * 1e6);
    return 0;
}
