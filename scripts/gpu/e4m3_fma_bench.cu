// What would an FMA lane order buy the E4M3 expert GEMV? (issue 27; docs/gpu/2026-12-04-staging/)
//
// The canonical dot32 (docs/DESIGN.md §3.4 step 1) rounds each product and then each sum: per code
// one FMUL and one FADD. docs/DESIGN.md §3.4 would allow a new canonical order with an explicit fused
// multiply-add on both sides (the host twin's `mul_add`, the device's `__fmaf_rn`), one FFMA per
// code. This microbenchmark times the shipped block-per-lane kernel (`gemv_bpl`, rows mode, from
// kernels/cuda/gemv.cu) against the same kernel with `v = fma(d, x, v)` lane sums, at the `step`
// expert gate/up shape (23,040 × 4,096 E4M3, the 9 slots' gate and up), and checks each against a
// host evaluation of its own order (the shipped one: product, then sum; the FMA one: std::fmaf),
// bit for bit on every row. Nothing here is shipped: it measures before the canonical order moves.
//
// Build and run on the GPU machine (nvcc there):
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
//        -I kernels/cuda -o /tmp/e4m3_fma scripts/gpu/e4m3_fma_bench.cu && /tmp/e4m3_fma
#include "canon.cuh"
#include "gemv.cu"

#include "e4m3_host.cuh"

// bpl_dot with fused lane sums: v_m = fma(d_{m+96}, x, fma(d_{m+64}, x, fma(… fma(d_m, x, +0.0))))
// then the same butterfly stack.
__device__ __forceinline__ float bpl_dot_fma(const uint4 (&c)[8], const float* xsb) {
    float st[6];
    int top = 0;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
        const u32 wd[4] = {c[g].x, c[g].y, c[g].z, c[g].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float d[4];
            e4m3x4_decode_finite(wd[j], d);
            const float4 xv = *reinterpret_cast<const float4*>(xsb + 16 * g + 4 * j);
            float v = C_ZERO;
            v = __fmaf_rn(d[0], xv.x, v);
            v = __fmaf_rn(d[1], xv.y, v);
            v = __fmaf_rn(d[2], xv.z, v);
            v = __fmaf_rn(d[3], xv.w, v);
            int n = 4 * g + j;
#pragma unroll
            for (int lv = 0; lv < 5; ++lv) {
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

// gemv_bpl<false> (rows mode) with the lane sums as FMA chains: one block of rows r_first ...
__global__ void __launch_bounds__(GEMV_THREADS, 3)
    rows_fma(const u8* codes, const float* scales, const float* __restrict__ x, float* __restrict__ out, int rows,
             int cols, int kw, int rpb) {
    __shared__ float xs[BPL_MAX_NB * BPL_XS_PITCH];
    __shared__ float sv[BPL_SV];
    const int r_first = blockIdx.x * rpb;
    if (r_first >= rows) return;
    const int nrows = min(rpb, rows - r_first);
    const int nb = cols / E4M3_BLOCK, bk = kw / E4M3_BLOCK, nk = cols / kw;
    bpl_stage_x(x, cols, xs);
    __syncthreads();
    const uint4* base = reinterpret_cast<const uint4*>(codes);
    const int npairs = nrows * nb;
    const size_t q0 = (size_t)r_first * nb;
    for (int ql = threadIdx.x; ql < npairs; ql += blockDim.x) {
        const size_t q = q0 + (size_t)ql;
        const uint4* v = base + (q >> 5) * 256 + (q & 31);
        uint4 c[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) c[g] = __ldg(v + g * 32);
        const int rl = ql / nb;
        const int b = ql - rl * nb;
        const float d = bpl_dot_fma(c, xs + b * BPL_XS_PITCH);
        sv[ql] = __ldg(scales + (size_t)((r_first + rl) / E4M3_BLOCK) * nb + b) * d;
    }
    __syncthreads();
    for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) out[r_first + rl] = bpl_row(sv + rl * nb, nk, bk);
}

// The shipped kernel, rows mode.
__global__ void __launch_bounds__(GEMV_THREADS, 3)
    rows_shipped(const u8* codes, const float* scales, const float* x, float* out, int rows, int cols, int kw,
                 int rpb) {
    gemv_bpl<false>(codes, scales, 0, x, out, rows, cols, kw, rpb, blockIdx.x);
}

int main() {
    const int rows = 23040, cols = 4096, kw = 512, rpb = 32;
    const E4m3Problem pr(rows, cols, kw);
    const size_t n = pr.bytes();
    const E4m3OnDevice dev(pr);
    u8* d_bpl = dev.bpl;
    float *d_sc = dev.sc, *d_x = dev.x, *d_o = dev.out;
    const int grid = (rows + rpb - 1) / rpb;
    auto run = [&](const char* name, bool fma, auto launch) {
        CK(cudaMemset(d_o, 0xFF, rows * 4));
        for (int i = 0; i < 3; ++i) launch();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        const std::vector<float> ms = timed_ms(41, launch);
        std::vector<float> o(rows);
        CK(cudaMemcpy(o.data(), d_o, rows * 4, cudaMemcpyDeviceToHost));
        int bad = 0, differ = 0;
        for (int r = 0; r < rows; ++r) {
            const float h = pr.row(r, fma);
            bad += memcmp(&o[r], &h, 4) != 0;
            const float other = pr.row(r, !fma);
            differ += memcmp(&o[r], &other, 4) != 0;
        }
        const double us = ms[20] * 1000.0;
        printf("%-34s median %7.1f us (min %7.1f, max %7.1f) %5.2f TB/s  rows != own host order: %d of %d;"
               " != the other order: %d\n",
               name, us, ms[0] * 1000.0, ms[40] * 1000.0, (double)n / (us * 1e-6) / 1e12, bad, rows, differ);
        return us;
    };
    const double t0 = run("shipped (FMUL + FADD per code)", false, [&] {
        rows_shipped<<<grid, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw, rpb);
    });
    const double t1 = run("fma lanes (FFMA per code)", true, [&] {
        rows_fma<<<grid, GEMV_THREADS>>>(d_bpl, d_sc, d_x, d_o, rows, cols, kw, rpb);
    });
    const double tbs = copy_tbs();
    printf("d2d copy 1 GiB: %.2f TB/s (read + write); floor of this GEMV at that rate: %.1f us\n", tbs,
           (double)n / (tbs * 1e12) * 1e6);
    printf("fma / shipped: %.3f\n", t1 / t0);
    return 0;
}
