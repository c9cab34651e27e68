// Host check of the half-pair split in e4m3_tma_bench.cu, runnable without a GPU: two threads per
// (row, 128-column block) pair — leaves 0–15 and 16–31 of the bit-reversed stack, then left +
// right — must give the canonical row of E4m3Problem::row bit for bit. This emulates the index
// math and the operation order on the host (each product rounded, no contraction: build with
// -ffp-contract=off); it cannot check the bulk copies or the barriers, which only the GPU run does.
// Checked 2026-12-04: 0 of 512 rows differ; with the halves' x offsets swapped, 512 of 512 do.
//
//   nvcc -O2 -std=c++17 -Xcompiler -ffp-contract=off -I scripts/gpu -o /tmp/half_check \
//        scripts/gpu/e4m3_half_check.cu && /tmp/half_check
#include "e4m3_host.cuh"

#define PITCH 132  // BPL_XS_PITCH of gemv.cu
static float xs[32 * PITCH];

// bpl_half of e4m3_tma_bench.cu for pair q (block b), half h, reading the block-per-lane bytes.
static float half(const E4m3Problem& pr, size_t q, int h, int b) {
    float st[5];
    int top = 0;
    for (int g = 0; g < 4; ++g) {
        // Vector 4h + g of the pair: uint4 index ((q / 32) * 256 + q % 32) + (4h + g) * 32.
        const unsigned char* vec = pr.bpl.data() + (((q >> 5) * 256 + (q & 31)) + (size_t)(4 * h + g) * 32) * 16;
        for (int j = 0; j < 4; ++j) {
            float v = 0.0f;
            for (int t = 0; t < 4; ++t) {
                const volatile float p = pr.lut[vec[4 * j + t]] * xs[b * PITCH + 64 * h + 16 * g + 4 * j + t];
                v = v + p;
            }
            int n = 4 * g + j;
            for (int lv = 0; lv < 4 && (n & 1); ++lv, n >>= 1) {
                v = st[top - 1] + v;
                --top;
            }
            st[top++] = v;
        }
    }
    return st[0];
}

int main() {
    const int rows = 512, cols = 4096, kw = 512;
    const E4m3Problem pr(rows, cols, kw);
    const int nb = cols / 128, bk = kw / 128, nk = cols / kw;
    for (int c = 0; c < cols; ++c) xs[(c >> 7) * PITCH + 4 * brev5_host(c & 31) + ((c & 127) >> 5)] = pr.x[c];
    int bad = 0;
    for (int r = 0; r < rows; ++r) {
        std::vector<float> sv(nb);
        for (int b = 0; b < nb; ++b) {
            const size_t q = (size_t)r * nb + b;
            const volatile float d = half(pr, q, 0, b) + half(pr, q, 1, b);
            sv[b] = pr.sc[(size_t)(r / 128) * nb + b] * d;
        }
        float acc = 0.0f;
        for (int k = 0; k < nk; ++k) {
            float kacc = 0.0f;
            for (int j = 0; j < bk; ++j) kacc = kacc + sv[k * bk + j];
            acc = acc + kacc;
        }
        const float want = pr.row(r, false);
        bad += memcmp(&acc, &want, 4) != 0;
    }
    printf("rows != host: %d of %d\n", bad, rows);
    return bad != 0;
}
