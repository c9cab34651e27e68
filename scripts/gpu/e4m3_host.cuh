// Host side shared by the E4M3 block-per-lane microbenchmarks in this folder (built with nvcc on
// the GPU machine): the exact decode, a random matrix of finite codes in the row-major and the
// block-per-lane layouts (kernels/cuda/gemv.cu, "Storage"), scales and x, the host evaluation of
// one row in the canonical order (or the FMA lane order), median timing with events, and the
// device-to-device copy rate the floors are quoted against.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda_check.cuh"

// Host decode of a finite E4M3 code (bias 7, subnormals m · 2^-9), exact in f32.
static float e4m3_host(unsigned char c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    const float mag = e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.0f + (float)m / 8.0f, e - 7);
    return s ? -mag : mag;
}

// brev5_c of gemv.cu, for the host's layout loop.
static int brev5_host(int m) {
    return ((m & 1) << 4) | ((m & 2) << 2) | (m & 4) | ((m & 8) >> 2) | ((m & 16) >> 4);
}

static unsigned char rand_code(unsigned& s) {
    for (;;) {
        s = s * 1664525u + 1013904223u;
        const unsigned char c = (unsigned char)(s >> 24);
        if ((c & 0x7F) != 0x7F) return c;
    }
}

// One E4M3 matrix of `rows` × `cols` (cols a multiple of 128), its scales (one per 128 × 128
// block) and an x in [−2, 2), all from one seed.
struct E4m3Problem {
    int rows, cols, kw;
    std::vector<unsigned char> rm, bpl;
    std::vector<float> sc, x;
    float lut[256];

    E4m3Problem(int rows_, int cols_, int kw_) : rows(rows_), cols(cols_), kw(kw_) {
        const size_t n = (size_t)rows * cols;
        const int nb = cols / 128;
        rm.resize(n);
        bpl.resize(n);
        for (int c = 0; c < 256; ++c) lut[c] = e4m3_host((unsigned char)c);
        unsigned s = 12345u;
        for (size_t i = 0; i < n; ++i) rm[i] = rand_code(s);
        // Byte 4j + i of vector g of pair q is the code of block column m + 32 i, m = brev5(4g + j).
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) {
                const int b = c / 128, e = c % 128, m = e & 31, i = e >> 5, nn = brev5_host(m);
                const size_t q = (size_t)r * nb + b;
                bpl[(((q / 32) * 8 + nn / 4) * 32 + q % 32) * 16 + 4 * (nn % 4) + i] = rm[(size_t)r * cols + c];
            }
        sc.resize((size_t)((rows + 127) / 128) * nb);
        x.resize(cols);
        for (auto& v : sc) {
            s = s * 1664525u + 1013904223u;
            v = 0.001f + (float)(s >> 8) * 1e-9f;
        }
        for (auto& v : x) {
            s = s * 1664525u + 1013904223u;
            v = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
        }
    }

    size_t bytes() const { return (size_t)rows * cols; }

    // Row r in the canonical E4M3 order (docs/DESIGN.md §3.4 step 7): per 128-column block the 32
    // lane sums (product rounded, then the sum; or one fma when `fma`), the butterfly, the scale,
    // then K-blocks of kw columns folded from +0.0.
    float row(int r, bool fma) const {
        const int nb = cols / 128, bk = kw / 128, nk = cols / kw;
        float acc = 0.0f;
        for (int k = 0; k < nk; ++k) {
            float kacc = 0.0f;
            for (int j = 0; j < bk; ++j) {
                const int b = k * bk + j;
                float v[32];
                for (int l = 0; l < 32; ++l) {
                    float a = 0.0f;
                    for (int i = 0; i < 4; ++i) {
                        const int c = b * 128 + l + 32 * i;
                        const float d = lut[rm[(size_t)r * cols + c]];
                        if (fma) {
                            a = std::fma(d, x[c], a);  // the float overload: one rounding
                        } else {
                            const volatile float p = d * x[c];
                            a = a + p;
                        }
                    }
                    v[l] = a;
                }
                for (int o = 16; o >= 1; o >>= 1)
                    for (int l = 0; l < o; ++l) v[l] = v[l] + v[l + o];
                const volatile float sd = sc[(size_t)(r / 128) * nb + b] * v[0];
                kacc = kacc + sd;
            }
            acc = acc + kacc;
        }
        return acc;
    }
};

// The problem on the device — its block-per-lane codes, scales and x, and `rows` output floats —
// uploaded once: the E4M3 benches' common setup (never freed: a bench's process ends with it).
struct E4m3OnDevice {
    unsigned char* bpl = nullptr;
    float* sc = nullptr;
    float* x = nullptr;
    float* out = nullptr;

    explicit E4m3OnDevice(const E4m3Problem& pr) {
        CK(cudaMalloc(&bpl, pr.bytes()));
        CK(cudaMalloc(&sc, pr.sc.size() * 4));
        CK(cudaMalloc(&x, (size_t)pr.cols * 4));
        CK(cudaMalloc(&out, (size_t)pr.rows * 4));
        CK(cudaMemcpy(bpl, pr.bpl.data(), pr.bytes(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sc, pr.sc.data(), pr.sc.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x, pr.x.data(), (size_t)pr.cols * 4, cudaMemcpyHostToDevice));
    }
};

// Streaming multiprocessors of device 0.
static int sm_count() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    return sms;
}

// `iters` launches, each between two events, sorted (ms).
template <class F>
static std::vector<float> timed_ms(int iters, F launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms;
}

// The device-to-device copy rate of 1 GiB (read + write bytes), TB/s, median of 11.
static double copy_tbs() {
    const size_t big = (size_t)1 << 30;
    unsigned char *p1, *p2;
    CK(cudaMalloc(&p1, big));
    CK(cudaMalloc(&p2, big));
    const std::vector<float> ms = timed_ms(11, [&] { CK(cudaMemcpyAsync(p2, p1, big, cudaMemcpyDeviceToDevice)); });
    CK(cudaFree(p1));
    CK(cudaFree(p2));
    return 2.0 * big / (ms[5] * 1e-3) / 1e12;
}
