// Canonical scalar math and the warp-level dot order: THE device twin of `kernels/src/canon.rs`.
//
// Why this file exists: every kernel of the canonical program must produce the host twin's bits.
// That only holds if the transcendental functions, the in-block dot order and every constant are
// the same on both sides, so they are written once here, operation for operation as in Rust.
//
// Contract (shared with canon.rs):
// - compiled with NVRTC `--fmad=false --prec-div=true --prec-sqrt=true --ftz=false`, so every
//   `a * b + c` below is a rounded product followed by a rounded sum (no contraction), division
//   and square root are IEEE round-to-nearest, and subnormals are kept;
// - no CUDA math intrinsics or libdevice functions (no expf, rsqrtf, __expf, fmaf);
// - every constant is written as its f32 bit pattern (`__uint_as_float(0x...u)`), the same bits
//   as `f32::from_bits(0x...)` in Rust, so no decimal literal can parse to a neighbouring float.
//
// NVRTC compiles one translation unit: canon.cuh is placed first by `cuda_source()` and every .cu
// file after it relies on these definitions (the #include below is only for editors and nvcc).

#ifndef MEMRA_CANON_CUH
#define MEMRA_CANON_CUH

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define MEMRA_FULL_MASK 0xFFFFFFFFu
#define MEMRA_LANES 32

// Lanes of a lane-grid launch (DESIGN.md §3.6; `LanePitch` in the runtime's
// backend/cuda/launch/lane_grid.rs): the lane count and each slice's lane pitch in elements, in
// the op's slice order. A single launch passes lanes = 1 and every pitch 0.
struct LanePitch {
    int lanes;
    int p[11];
};
// Pointer `ptr` (slice `j` of the op, a constant) moved to lane `lane`.
#define LANE_AT(ptr, lp, j, lane) ((ptr) + (size_t)(lane) * (size_t)(lp).p[j])

// The first statement of every kernel. The runtime launches kernels with programmatic stream
// serialization (sm_90 and later; `CudaOptions::programmatic_launch`), which lets a kernel's blocks be
// scheduled while the kernel before it on the stream still runs, so the launch and block dispatch
// overlap that kernel's tail instead of following it. `griddepcontrol.wait` then holds every thread
// until the kernel before has completed and its memory is visible, before this kernel touches
// memory: each kernel still reads and writes only after its predecessor ends, exactly as in a plain
// launch, so no operand and no result can change. `launch_dependents` lets the next kernel be
// scheduled once every block of this one has passed its wait (one kernel ahead, never a chain).
// Launched without the attribute (or before sm_90), both are no-ops.
__device__ __forceinline__ void kernel_entry() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The one exception to "kernel_entry() first": before its wait a kernel may read bytes that no
// kernel writes — the weights, uploaded once before the first launch — so their DRAM round trip
// overlaps the tail of the kernel ahead; every other byte (activations, outputs, anything a kernel
// writes) is read or written only after the wait, so still no operand or result can change. Such
// a kernel's first statement passes this flag as the last template argument of a device function
// template whose flag parameter is `bool WF` (`f<..., WEIGHTS_FIRST>(...)`): on that path the
// function issues its weight loads, then calls kernel_entry() on every path before it touches
// anything else (or hands the flag on to another such function). kernels/src/sources.rs checks
// both the kernels' first statements and those functions' waits.
#define WEIGHTS_FIRST true

// The second exception, for inputs settled two launches back: a kernel whose first statement is
// `f<.., SETTLED_FIRST>(.., ahead);` may skip the wait for some of its blocks when the runtime
// passes `ahead` = 1, which it does only when the kernel ahead of it on the stream touches none of
// those blocks' inputs and outputs (CudaBackend::settled): their last writers and readers are then
// at least two launches back and complete before this kernel can be scheduled, because the kernel
// ahead has passed its own wait. The function's first statement is `if (!(SF && ahead != 0 &&
// ..)) kernel_entry();` (kernels/src/sources/wait_check.rs checks it); every other block waits.
#define SETTLED_FIRST true

// ---- exp_c constants (canon.rs) ----
#define C_LOG2E __uint_as_float(0x3FB8AA3Bu)
#define C_LN2_HI __uint_as_float(0x3F317200u)
#define C_LN2_LO __uint_as_float(0x35BFBE8Eu)
#define C_ROUND_MAGIC __uint_as_float(0x4B400000u)
#define C_EXP_OVERFLOW_X __uint_as_float(0x42B17217u)
#define C_EXP_UNDERFLOW_X __uint_as_float(0xC2D00000u)
#define C_EXP_P0 __uint_as_float(0x39506967u)
#define C_EXP_P1 __uint_as_float(0x3AB743CEu)
#define C_EXP_P2 __uint_as_float(0x3C088908u)
#define C_EXP_P3 __uint_as_float(0x3D2AA9C1u)
#define C_EXP_P4 __uint_as_float(0x3E2AAAAAu)
#define C_EXP_P5 __uint_as_float(0x3F000000u)
#define C_ONE __uint_as_float(0x3F800000u)
#define C_HALF __uint_as_float(0x3F000000u)
#define C_ZERO __uint_as_float(0x00000000u)
#define C_NEG_ZERO __uint_as_float(0x80000000u)
#define C_POS_INF __uint_as_float(0x7F800000u)
#define C_NEG_INF __uint_as_float(0xFF800000u)
// 2^-9 (the E4M3 subnormal quantum) and 2^120 (rebias of an E4M3 code placed in f32 bits).
#define C_TWO_M9 __uint_as_float(0x3B000000u)
#define C_TWO_P120 __uint_as_float(0x7B800000u)

// v[j] = p[base + j * stride] for j < B (+0.0 where base + j * stride >= n): the B loads of a batch
// are issued before any value is used (a loop that used each value as it arrived paid a memory
// round trip per value). Moves loads only: the values are the same.
template <int B>
__device__ __forceinline__ void load_batch(const float* __restrict__ p, int base, int stride, int n, float (&v)[B]) {
#pragma unroll
    for (int j = 0; j < B; ++j) {
        const int i = base + j * stride;
        v[j] = i < n ? p[i] : C_ZERO;
    }
}

__device__ __forceinline__ bool is_nan_c(float x) { return x != x; }

// 2^k for -126 <= k <= 127, from exponent bits (exact).
__device__ __forceinline__ float pow2i_c(int k) { return __uint_as_float(((u32)(k + 127)) << 23); }

// canon.rs `exp_c`, step for step.
__device__ float exp_c(float x) {
    if (is_nan_c(x)) return x;
    if (x > C_EXP_OVERFLOW_X) return C_POS_INF;
    if (x < C_EXP_UNDERFLOW_X) return C_ZERO;
    float t = x * C_LOG2E;
    float nf = (t + C_ROUND_MAGIC) - C_ROUND_MAGIC;
    int n = (int)nf;
    float r = (x - nf * C_LN2_HI) - nf * C_LN2_LO;
    float z = r * r;
    float p = C_EXP_P0;
    p = p * r + C_EXP_P1;
    p = p * r + C_EXP_P2;
    p = p * r + C_EXP_P3;
    p = p * r + C_EXP_P4;
    p = p * r + C_EXP_P5;
    float y = ((p * z) + r) + C_ONE;
    int n1 = n / 2;
    int n2 = n - n1;
    return (y * pow2i_c(n1)) * pow2i_c(n2);
}

// canon.rs `rsqrt_c`: 1 / sqrt(x), both correctly rounded (the _rn forms are IEEE operations,
// identical to `/` and sqrt under --prec-div/--prec-sqrt, spelled out so no flag can change them).
__device__ __forceinline__ float rsqrt_c(float x) { return __fdiv_rn(C_ONE, __fsqrt_rn(x)); }

__device__ __forceinline__ float div_c(float a, float b) { return __fdiv_rn(a, b); }

// canon.rs `sigmoid_c` = 1 / (1 + exp_c(-x)).
__device__ __forceinline__ float sigmoid_c(float x) { return div_c(C_ONE, C_ONE + exp_c(-x)); }

// canon.rs `silu_c` = x / (1 + exp_c(-x)); -inf -> -0.0.
__device__ __forceinline__ float silu_c(float x) {
    if (x == C_NEG_INF) return C_NEG_ZERO;
    return div_c(x, C_ONE + exp_c(-x));
}

// canon.rs `swiglu_c`: clamps written as comparisons so NaN propagates.
__device__ __forceinline__ float swiglu_c(float gate, float up, int has_limit, float limit) {
    float s = silu_c(gate);
    if (!has_limit) return s * up;
    if (s > limit) s = limit;
    float u = up;
    if (u > limit) {
        u = limit;
    } else if (u < -limit) {
        u = -limit;
    }
    return s * u;
}

// canon.rs `swiglu_folded` (NVFP4_DEV_ROUTES, an unclamped layer): the up scale after the product.
__device__ __forceinline__ float swiglu_folded_c(float gate, float up, float up_scale) {
    return (silu_c(gate) * up) * up_scale;
}

// The xor-butterfly of `dot32` (canon.rs `butterfly32`): v = v + v[lane ^ o] for o = 16..1.
// IEEE addition is commutative, so every lane ends with lane 0's value (the host's result).
__device__ __forceinline__ float butterfly32(float v) {
    v = v + __shfl_xor_sync(MEMRA_FULL_MASK, v, 16);
    v = v + __shfl_xor_sync(MEMRA_FULL_MASK, v, 8);
    v = v + __shfl_xor_sync(MEMRA_FULL_MASK, v, 4);
    v = v + __shfl_xor_sync(MEMRA_FULL_MASK, v, 2);
    v = v + __shfl_xor_sync(MEMRA_FULL_MASK, v, 1);
    return v;
}

// dot32 of two f32 vectors of length n by one warp (lane l: elements l, l+32, ... in order, then
// the butterfly). Every lane returns the result.
__device__ __forceinline__ float dot32_warp(const float* a, const float* b, int n, int lane) {
    float acc = C_ZERO;
    for (int i = lane; i < n; i += MEMRA_LANES) acc = acc + a[i] * b[i];
    return butterfly32(acc);
}

// canon.rs `rmsnorm_c` of one row by one warp: ss = dot32(x, x); inv = rsqrt_c(ss / n + eps);
// y[i] = (x[i] * inv) * w[i]. Each lane reads back only the elements it read for the sum, so
// `y` may alias `x`.
__device__ __forceinline__ void rmsnorm_warp(const float* x, const float* w, float eps, float* y, int n, int lane) {
    if (n <= 0) return;
    float ss = dot32_warp(x, x, n, lane);
    float inv = rsqrt_c(div_c(ss, (float)n) + eps);
    for (int i = lane; i < n; i += MEMRA_LANES) y[i] = (x[i] * inv) * w[i];
}

// ---- weight formats (kernels/src/formats) ----

// bf16 bits -> f32 (exact).
__device__ __forceinline__ float bf16_to_f32_c(u32 b) { return __uint_as_float(b << 16); }

// formats/e4m3.rs `e4m3_decode`, exact, NaN codes (S.1111.111) -> sign | 0x7FC00000.
__device__ __forceinline__ float e4m3_decode_c(u32 code) {
    u32 sign = (code & 0x80u) << 24;
    u32 e = (code >> 3) & 0xFu;
    u32 m = code & 0x7u;
    u32 mag;
    if (e == 0xFu && m == 0x7u) {
        mag = 0x7FC00000u;
    } else if (e == 0u) {
        mag = __float_as_uint((float)m * C_TWO_M9);
    } else {
        mag = ((e + 127u - 7u) << 23) | (m << 20);
    }
    return __uint_as_float(sign | mag);
}

// The same value for a code that is NOT a NaN code (weights checked at upload): the 7 magnitude
// bits placed at f32 bit 20 give value * 2^-120 for normal and subnormal codes alike (an E4M3
// subnormal lands on an f32 subnormal), and one exact multiplication by 2^120 restores it.
__device__ __forceinline__ float e4m3_decode_finite(u32 code) {
    return __uint_as_float(((code & 0x7Fu) << 20) | ((code & 0x80u) << 24)) * C_TWO_P120;
}

// The four finite E4M3 codes of a word (byte t at bits 8t) as exact f32 values, d[t] =
// e4m3_decode_finite(byte t). On sm_89 and later the hardware converts two codes at once to
// f16x2 and each f16 to f32: E4M3 values are a subset of f16 values and f16 of f32, so both
// conversions are exact (no rounding happens; -0.0 stays -0.0) and the result is the same value,
// in fewer instructions than the bit construction. Set MEMRA_E4M3_CVT to 0 to use the bit path.
#ifndef MEMRA_E4M3_CVT
#define MEMRA_E4M3_CVT 1
#endif
__device__ __forceinline__ void e4m3x4_decode_finite(u32 w, float* d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && MEMRA_E4M3_CVT
    u32 lo, hi;
    asm("{\n\t.reg .b16 c0, c1;\n\tmov.b32 {c0, c1}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, c0;\n\t"
        "cvt.rn.f16x2.e4m3x2 %1, c1;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
    const unsigned short h[4] = {(unsigned short)(lo & 0xFFFFu), (unsigned short)(lo >> 16),
                                 (unsigned short)(hi & 0xFFFFu), (unsigned short)(hi >> 16)};
#pragma unroll
    for (int t = 0; t < 4; ++t) asm("cvt.f32.f16 %0, %1;" : "=f"(d[t]) : "h"(h[t]));
#else
#pragma unroll
    for (int t = 0; t < 4; ++t) d[t] = e4m3_decode_finite((w >> (8 * t)) & 0xFFu);
#endif
}

// formats/e4m3.rs `ue4m3_decode`: the top bit is ignored.
__device__ __forceinline__ float ue4m3_decode_c(u32 code) { return e4m3_decode_c(code & 0x7Fu); }

// formats/nvfp4.rs `e2m1_decode`: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
__device__ __forceinline__ float e2m1_decode_c(u32 nib) {
    u32 m = nib & 0x7u;
    u32 bits;
    switch (m) {
        case 0: bits = 0x00000000u; break;
        case 1: bits = 0x3F000000u; break;
        case 2: bits = 0x3F800000u; break;
        case 3: bits = 0x3FC00000u; break;
        case 4: bits = 0x40000000u; break;
        case 5: bits = 0x40400000u; break;
        case 6: bits = 0x40800000u; break;
        default: bits = 0x40C00000u; break;
    }
    float v = __uint_as_float(bits);
    return (nib & 0x8u) ? -v : v;
}

#endif  // MEMRA_CANON_CUH
