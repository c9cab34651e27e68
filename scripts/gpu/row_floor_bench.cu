// How fast can a single-row kernel be on this GPU? (issue 27 asks ≤ 3 µs of ncu's
// gpu__time_duration for rmsnorm, add_rmsnorm, router top-k, argmax and fold_combine.)
//
// Three kernels with no arithmetic worth the name, each one block of 256 threads over a 4096-wide
// f32 row, launched back to back so ncu can time each launch:
// - `empty`: returns at once — the launch's own duration as ncu counts it;
// - `copy_row`: every thread loads its 16 values (all loads in flight), then stores them — one
//   memory round trip and the stores;
// - `norm_shape`: the dependency chain of a block norm without its arithmetic: load 16 values,
//   a warp butterfly and a block barrier to combine 8 warp sums, then store every value scaled by
//   the sum — what rmsnorm must do at the least.
// The row is written by the launch before each (as in the step), so ncu's `--cache-control none`
// reading is the comparable one; both are printed by the call script.
//
// Build and run on the GPU machine (nvcc there):
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
//        -I kernels/cuda -o /tmp/row_floor scripts/gpu/row_floor_bench.cu && /tmp/row_floor
#include <cstdio>
#include <cstdlib>

#include "canon.cuh"
#include "cuda_check.cuh"

#define ROW 4096
#define THREADS 256
#define PER (ROW / THREADS)

__global__ void empty() {}

__global__ void copy_row(const float* __restrict__ x, float* __restrict__ y) {
    float v[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) v[j] = x[threadIdx.x + j * THREADS];
#pragma unroll
    for (int j = 0; j < PER; ++j) y[threadIdx.x + j * THREADS] = v[j];
}

__global__ void norm_shape(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float s_warp[THREADS / 32];
    float v[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) v[j] = x[threadIdx.x + j * THREADS];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j) acc += v[j] * v[j];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = acc;
    __syncthreads();
    float ss = 0.0f;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) ss += s_warp[w];
    const float inv = rsqrt_c(div_c(ss, (float)ROW) + C_ONE);
#pragma unroll
    for (int j = 0; j < PER; ++j) y[threadIdx.x + j * THREADS] = v[j] * inv;
}

int main(int argc, char** argv) {
    // Launches per kernel and round (the call script runs 25 under ncu: 75 launches to profile).
    const int launches = argc > 1 ? atoi(argv[1]) : 200;
    float *a, *b;
    CK(cudaMalloc(&a, ROW * sizeof(float)));
    CK(cudaMalloc(&b, ROW * sizeof(float)));
    CK(cudaMemset(a, 0, ROW * sizeof(float)));
    CK(cudaMemset(b, 0, ROW * sizeof(float)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // Per kernel: `launches` launches in a row, ping-ponging the row; the event time per launch is the
    // back-to-back rate (launch gaps included), ncu's figure the kernel alone.
    const char* names[3] = {"empty", "copy_row", "norm_shape"};
    for (int k = 0; k < 3; ++k) {
        for (int rep = 0; rep < 2; ++rep) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < launches; ++i) {
                const float* x = (i & 1) ? b : a;
                float* y = (i & 1) ? a : b;
                if (k == 0) empty<<<1, THREADS>>>();
                if (k == 1) copy_row<<<1, THREADS>>>(x, y);
                if (k == 2) norm_shape<<<1, THREADS>>>(x, y);
            }
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (rep == 1) printf("%-11s back to back: %6.2f us per launch (events, %d launches)\n", names[k], ms * 1e3f / launches, launches);
        }
    }
    CK(cudaGetLastError());
    return 0;
}
