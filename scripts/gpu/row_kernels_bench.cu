// The single-row kernels of issue 27 (≤ 3 µs each under ncu), timed alone under ncu, and a
// candidate rewrite beside them (same inputs; its output compared with the production kernel's
// bit for bit before anything is timed; a difference is reported and the exit status is 1).
//
// Production kernels come from kernels/cuda (included in NVRTC's order). The rewrites measured on
// 2026-12-06 (docs/gpu/2026-12-06-rowk/): the one-pass norms in registers and fold_combine's
// constant-count path won and are production since (norm.cu, experts.cu); the ones left here lost:
// - `argmax_cluster_f32`: one cluster of 8 blocks of 1024 threads (sm_90 thread-block clusters):
//   every thread reads float4s, the 8 block bests are combined through distributed shared memory
//   after a cluster barrier — no scratch in global memory, no atomic. 8.9 µs against argmax_f32's
//   6.4 (one H100, ncu, caches flushed).
// - `argmax_block_f32` (nineteenth session): one block of 1024 threads, 8 float4 loads per thread in
//   one run, the best as one rank code through shuffles: 6.15 µs against 6.62 (one H100, ncu,
//   flushed) — lost to the form that won: the production grid with its block bests combined by
//   one 64-bit atomic maximum, 4.08 µs alone, argmax_f32 since (moe.cu;
//   docs/gpu/2026-12-06-prefetch/).
//
// Build and run on the GPU machine (nvcc there; the flags are NVRTC's):
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
//        -I kernels/cuda -o /tmp/row_kernels scripts/gpu/row_kernels_bench.cu && /tmp/row_kernels [ROUNDS]
// then ncu for each launch's duration (scripts/gpu/rowk.sh does both).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "canon.cuh"
#include "gemv.cu"
#include "gemv_lanes.cu"
#include "experts.cu"
#include "down8.cu"
#include "norm.cu"
#include "attention.cu"
#include "moe.cu"
#include "cuda_check.cuh"

// ---- argmax over one cluster of 8 blocks ----
// Block-wide arg-best of (key, id) under key_better; every thread returns the winner (argmax_f32's
// block step until the nineteenth session).
__device__ __forceinline__ void block_best(float& key, u32& id, bool higher_id, float* s_key, u32* s_id) {
    warp_best(key, id, higher_id);
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

#define AC_BLOCKS 8
#define AC_THREADS 1024

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The 32-bit word at shared address `p` of block `rank` of this cluster.
__device__ __forceinline__ u32 ld_cluster_u32(const void* p, u32 rank) {
    const u32 local = (u32)__cvta_generic_to_shared(p);
    u32 remote, v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
    return v;
}

extern "C" __global__ void __cluster_dims__(AC_BLOCKS, 1, 1) __launch_bounds__(AC_THREADS)
    argmax_cluster_f32(const float* x, int n, float* out) {
    kernel_entry();
    __shared__ float s_val[AC_THREADS / 32];
    __shared__ u32 s_idx[AC_THREADS / 32];
    __shared__ float c_val;
    __shared__ u32 c_idx;
    float best = C_ZERO;
    u32 idx = NO_INDEX;
    const int t = blockIdx.x * AC_THREADS + threadIdx.x;
    const int stride = AC_BLOCKS * AC_THREADS * 4;
    const int n4 = n & ~3;
    for (int base = 4 * t; base < n4; base += stride) {
        const float4 q = *reinterpret_cast<const float4*>(x + base);
        const float vs[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if (!is_nan_c(vs[c]) && key_better(vs[c], (u32)(base + c), best, idx, false)) {
                best = vs[c];
                idx = (u32)(base + c);
            }
        }
    }
    for (int i = n4 + t; i < n; i += AC_BLOCKS * AC_THREADS) {
        const float v = x[i];
        if (!is_nan_c(v) && key_better(v, (u32)i, best, idx, false)) {
            best = v;
            idx = (u32)i;
        }
    }
    block_best(best, idx, false, s_val, s_idx);
    if (threadIdx.x == 0) {
        c_val = best;
        c_idx = idx;
    }
    cluster_barrier();
    if (cluster_rank() == 0 && threadIdx.x < 32) {
        float b = C_ZERO;
        u32 bi = NO_INDEX;
        if (threadIdx.x < AC_BLOCKS) {
            b = __uint_as_float(ld_cluster_u32(&c_val, threadIdx.x));
            bi = ld_cluster_u32(&c_idx, threadIdx.x);
        }
        warp_best(b, bi, false);
        if (threadIdx.x == 0) out[0] = __uint_as_float(bi == NO_INDEX ? 0u : bi);
    }
    cluster_barrier();  // every block's shared words stay alive until block 0 has read them
}

// ---- argmax in one block of 1024 threads ----
// Every thread issues all its loads (AB_LOADS float4s: 32,768 values) before its first compare, one
// run; the block's best as one rank code (moe.cu's rank_code: a plain unsigned maximum) through
// warp shuffles and one shared-memory round (moe.cu's argmax_code and warp_max_code); no scratch, no
// atomic, no second launch-wide step.
#define AB_THREADS 1024
#define AB_LOADS 8

extern "C" __global__ void __launch_bounds__(AB_THREADS) argmax_block_f32(const float* x, int n, float* out) {
    kernel_entry();
    __shared__ unsigned long long s_code[AB_THREADS / 32];
    unsigned long long best = 0ull;
    const int n4 = n & ~3;
    for (int base = 4 * threadIdx.x; base < n4; base += AB_LOADS * 4 * AB_THREADS) {
        float4 q[AB_LOADS];
#pragma unroll
        for (int j = 0; j < AB_LOADS; ++j) {
            const int i = base + j * 4 * AB_THREADS;
            q[j] = i < n4 ? *reinterpret_cast<const float4*>(x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < AB_LOADS; ++j) {
            const int i = base + j * 4 * AB_THREADS;
            if (i >= n4) break;
            best = max_u64(best, argmax_code(q[j].x, i));
            best = max_u64(best, argmax_code(q[j].y, i + 1));
            best = max_u64(best, argmax_code(q[j].z, i + 2));
            best = max_u64(best, argmax_code(q[j].w, i + 3));
        }
    }
    for (int i = n4 + threadIdx.x; i < n; i += AB_THREADS) best = max_u64(best, argmax_code(x[i], i));
    best = warp_max_code(best);
    if ((threadIdx.x & 31) == 0) s_code[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x < 32) {
        best = warp_max_code(s_code[threadIdx.x]);
        if (threadIdx.x == 0) out[0] = __uint_as_float(best == 0ull ? 0u : rank_id(best, false));
    }
}

// ---- harness ----
static float frand(unsigned& s) {
    s = s * 1664525u + 1013904223u;
    return ((int)(s >> 8) - (1 << 23)) / (float)(1 << 22);
}

static std::vector<float> fill(size_t n, unsigned seed) {
    std::vector<float> v(n);
    for (auto& f : v) f = frand(seed);
    return v;
}

static float* dev(const std::vector<float>& h) {
    float* d;
    CK(cudaMalloc(&d, h.size() * sizeof(float)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> back(const float* d, size_t n) {
    std::vector<float> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static int failures = 0;
static void same(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        u32 x, y;
        memcpy(&x, &a[i], 4);
        memcpy(&y, &b[i], 4);
        if (x != y && diff++ == 0) first = i;
    }
    printf("%-28s %s (%zu values%s)\n", what, diff ? "DIFFERS" : "bit-identical", a.size(),
           diff ? (", first at " + std::to_string(first) + ", " + std::to_string(diff) + " differ").c_str() : "");
    if (diff) ++failures;
}

// The runtime's launch: programmatic stream serialization.
template <typename Kf, typename... A>
static void go(Kf kernel, int grid, int block, size_t smem, cudaStream_t st, A... args) {
    launch_smem(true, kernel, dim3(grid), dim3(block), smem, st, args...);
}

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 20;
    const int N = 4096, V = 32768, K = 8, NP = 2, AM_BLOCKS = V / ARGMAX_THREADS;
    const float eps = 1e-6f;
    LanePitch lp = {};
    lp.lanes = 1;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    float *x = dev(fill(N, 1)), *a = dev(fill(N, 2)), *w = dev(fill(N, 3));
    float *h = dev(fill(N, 0)), *y = dev(fill(N, 0)), *z = dev(fill(N, 0));
    std::vector<float> logits = fill(V, 4);
    logits[777] = 9.0f;
    logits[31000] = 9.0f;  // a tie: the lower index wins
    float* lg = dev(logits);
    float *am0 = dev(fill(1, 0)), *am1 = dev(fill(1, 0)), *am2 = dev(fill(1, 0));
    std::vector<unsigned> zero(1 + 2 * AM_BLOCKS, 0u);
    u32* scratch;
    CK(cudaMalloc(&scratch, zero.size() * 4));
    CK(cudaMemcpy(scratch, zero.data(), zero.size() * 4, cudaMemcpyHostToDevice));
    const int pitch = NP * N;
    float *parts = dev(fill((size_t)(K + 1) * pitch, 5)), *fw = dev(fill(K, 6)), *fc = dev(fill(2 * N, 0));
    const size_t smem = N * sizeof(float);
    const float *cx = x, *ca = a, *cw = w, *clg = lg, *cparts = parts, *cfw = fw;
    // `rounds` rounds of every kernel, each into its own outputs: ncu times every launch.
    for (int r = 0; r < rounds; ++r) {
        go(rmsnorm_f32, 1, NORM_LANES, smem, st, cx, cw, eps, y, N, 1, lp);
        go(add_rmsnorm_f32, 1, NORM_LANES, smem, st, cx, ca, cw, eps, h, z, N, 1, lp);
        go(argmax_f32, AM_BLOCKS, ARGMAX_THREADS, 0, st, clg, V, am0, scratch);
        go(argmax_cluster_f32, AC_BLOCKS, AC_THREADS, 0, st, clg, V, am1);
        go(argmax_block_f32, 1, AB_THREADS, 0, st, clg, V, am2);
        go(fold_combine_f32, N / 256, 256, 0, st, cparts, pitch, NP, cfw, K, N, fc, lp);
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    same("argmax (cluster)", back(am0, 1), back(am1, 1));
    same("argmax (one block)", back(am0, 1), back(am2, 1));
    for (const float* d : {am0, am1, am2}) {
        const float got = back(d, 1)[0];
        u32 gi;
        memcpy(&gi, &got, 4);
        printf("argmax index %u (planted: 9.0 at 777 and 31000, the lower index wins)\n", gi);
        if (gi != 777u) ++failures;
    }
    return failures ? 1 : 0;
}
