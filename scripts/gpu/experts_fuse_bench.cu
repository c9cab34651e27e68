// Would the experts seam gain from ONE launch (twenty-seventh session, issue 27)? On an H200 the
// seam is 1.56× its floor at b1 against the H100's 1.37×: the fixed costs of its two launches —
// ramp, x staging, the last blocks of gate/up, the grid-wide wait before down — weigh more against
// the faster stream. This times, on the `step` shapes (9 slots: 8 routed + shared; gate/up 1280 ×
// 4096 E4M3 each, down 4096 × 1280; the runtime's rows per block, 16 and 51), layers of:
// - `split`: the shipped kernels, expert_gate_up_bpl_f32 then expert_down_bpl_f32, both launched
//   with programmatic stream serialization, as the runtime does;
// - `split, plain launches`: the same without it;
// - `fused`: experts_fused_f32 (experts_fuse_kernels.cuh): one grid, down blocks waiting per slot;
// - `split, 8-row gate/up` and `fused, 8-row gate/up`: gate/up blocks of 8 rows (1,440 blocks,
//   about two waves), so that in the fused grid the first slots' down blocks can start while the
//   last slots' gate/up blocks still read.
// Each form is timed as the runtime runs it: 8 layers back to back captured as one CUDA graph on a
// non-blocking stream (programmatic launches become programmatic edges), each layer on its own
// expert set (4 sets, 566 MB: no layer finds its codes in L2); µs per layer = the median replay / 8.
// Before timing, the fused kernels' act and down partials are compared with the split launches'
// bit for bit, after checking that the split launches' own outputs are a real reference (every
// value written, finite, and not all zero).
//
// Build and run on the GPU machine (nvcc there):
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
//        -I kernels/cuda -I scripts/gpu -o /tmp/experts_fuse scripts/gpu/experts_fuse_bench.cu && /tmp/experts_fuse
#include <cstdint>
#include <vector>

#include "canon.cuh"
#include "gemv.cu"
#include "experts.cu"
#include "experts_fuse_kernels.cuh"

#include "e4m3_host.cuh"

// Finite E4M3 codes from a hash of the byte index (0x7F / 0xFF, the NaN codes, moved off).
__global__ void fill_codes(u8* p, size_t n, u32 seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        u32 h = (u32)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        u8 c = (u8)(h >> 8);
        if ((c & 0x7F) == 0x7F) c ^= 1;
        p[i] = c;
    }
}

struct Entry {  // experts.cu's ExpertEntry, 112 bytes
    uint64_t gate, gate_scales, up, up_scales, down, down_scales;
    int fmt, gate_vec, up_vec, down_vec, rows, cols, kw, row0, down_rows, down_cols, down_kw, has_scales;
    float sg, su, sd;
    int pad;
};
static_assert(sizeof(Entry) == 112, "ExpertEntry is 112 bytes");

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const int H = 4096, F = 1280, SLOTS = 9, K = 8, SETS = 4, LAYERS = 8;
    const int rpb_d = 51, dblocks = (H + rpb_d - 1) / rpb_d;
    const int act_pitch = F, out_pitch = H * 2;  // down: 1280 columns = 2 K-blocks of 640
    const size_t mat = (size_t)H * F, per_set = mat * 3 * SLOTS;
    const double tbs = copy_tbs();
    printf("device-to-device copy 1 GiB: %.2f TB/s; %d SMs\n", tbs, sm_count());
    u8* codes;
    CK(cudaMalloc(&codes, per_set * SETS));
    fill_codes<<<1024, 256>>>(codes, per_set * SETS, 0x1234567u);
    CK(cudaGetLastError());
    // Scales: 320 per matrix (gate/up: 10 row blocks × 32; down: 32 × 10), all sets share them.
    std::vector<float> hs(3 * 320), hx(H), hids(K);
    unsigned s = 777u;
    for (auto& v : hs) v = 0.001f + (float)((s = s * 1664525u + 1013904223u) >> 8) * 1e-9f;
    for (auto& v : hx) v = ((float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f) * 4.0f;
    for (int i = 0; i < K; ++i) {
        const u32 id = (u32)i;
        memcpy(&hids[i], &id, 4);
    }
    float *d_sc, *d_x, *d_ids, *d_act, *d_out;
    CK(cudaMalloc(&d_sc, hs.size() * 4));
    CK(cudaMalloc(&d_x, H * 4));
    CK(cudaMalloc(&d_ids, K * 4));
    CK(cudaMalloc(&d_act, (size_t)SLOTS * act_pitch * 4));
    CK(cudaMalloc(&d_out, (size_t)SLOTS * out_pitch * 4));
    CK(cudaMemcpy(d_sc, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_x, hx.data(), H * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ids, hids.data(), K * 4, cudaMemcpyHostToDevice));
    std::vector<ExpertEntry*> tables(SETS);
    for (int set = 0; set < SETS; ++set) {
        std::vector<Entry> t(SLOTS);
        for (int e = 0; e < SLOTS; ++e) {
            u8* base = codes + per_set * set + mat * 3 * e;
            t[e] = Entry{(uint64_t)base, (uint64_t)d_sc, (uint64_t)(base + mat), (uint64_t)(d_sc + 320),
                         (uint64_t)(base + 2 * mat), (uint64_t)(d_sc + 640), FMT_E4M3, E4M3_BPL, E4M3_BPL, E4M3_BPL,
                         F, H, 512, 0, H, F, 640, 0, 1.0f, 1.0f, 1.0f, 0};
        }
        CK(cudaMalloc(&tables[set], sizeof(Entry) * SLOTS));
        CK(cudaMemcpy(tables[set], t.data(), sizeof(Entry) * SLOTS, cudaMemcpyHostToDevice));
    }
    u32* ctl;
    CK(cudaMalloc(&ctl, 64 * 4));
    CK(cudaMemset(ctl, 0, 64 * 4));
    CK(cudaDeviceSynchronize());  // the setup ran on the legacy stream, which `st` does not wait for
    LanePitch lp{};
    lp.lanes = 1;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // Gate/up rows per block: the runtime's 16 (720 blocks, one wave at 6 per SM), or 8 (1,440
    // blocks, about two waves: in the fused grid the first slots' down blocks can then start while
    // the last slots' gate/up blocks still read).
    int rpb_g = 16, gblocks = F / 16;
    auto split = [&](bool pdl, int set) {
        launch_ex(pdl, expert_gate_up_bpl_f32, dim3(gblocks, SLOTS), dim3(GEMV_THREADS), st,
                  (const ExpertEntry*)tables[set], SLOTS, K, (const float*)d_ids, K, 0, (const float*)d_x,
                  SWIGLU_PLAIN, 0.0f, d_act, act_pitch, rpb_g, lp, 0);
        launch_ex(pdl, expert_down_bpl_f32, dim3(dblocks, SLOTS), dim3(GEMV_THREADS), st,
                  (const ExpertEntry*)tables[set], SLOTS, K, (const float*)d_ids, K, 0, (const float*)d_act,
                  act_pitch, d_out, out_pitch, rpb_d, lp);
    };
    auto fused = [&](int set) {
        launch_ex(true, experts_fused_f32, dim3((gblocks + dblocks) * SLOTS),
                  dim3(GEMV_THREADS), st, (const ExpertEntry*)tables[set], SLOTS, K, (const float*)d_ids, K, SLOTS,
                  (const float*)d_x, d_act, act_pitch, d_out, out_pitch, rpb_g, gblocks, rpb_d, dblocks, ctl);
    };
    // Bits: each fused form against the split launches, on every set. Every buffer is poisoned
    // (0xFF bytes: a NaN) before each run, and act and the partials are written whole by both.
    const size_t na = (size_t)SLOTS * act_pitch, no = (size_t)SLOTS * out_pitch;
    std::vector<float> a0(na), o0(no), a1(na), o1(no);
    auto poison = [&] {
        CK(cudaMemsetAsync(d_act, 0xFF, na * 4, st));
        CK(cudaMemsetAsync(d_out, 0xFF, no * 4, st));
    };
    auto fetch = [&](std::vector<float>& a, std::vector<float>& o) {
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(a.data(), d_act, na * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(o.data(), d_out, no * 4, cudaMemcpyDeviceToHost));
    };
    for (int set = 0; set < SETS; ++set) {
        rpb_g = 16;
        gblocks = F / rpb_g;
        poison();
        split(true, set);
        fetch(a0, o0);
        // The reference must be one: a value left unwritten or non-finite, or an all-zero buffer,
        // would let a fused kernel "match" without computing anything.
        size_t bad_ref = 0, nonzero_a = 0, nonzero_o = 0;
        for (float v : a0) {
            bad_ref += !std::isfinite(v);
            nonzero_a += v != 0.0f;
        }
        for (float v : o0) {
            bad_ref += !std::isfinite(v);
            nonzero_o += v != 0.0f;
        }
        printf("reference, set %d: %zu non-finite or unwritten values; %zu of %zu act and %zu of %zu partials nonzero\n",
               set, bad_ref, nonzero_a, na, nonzero_o, no);
        if (bad_ref != 0 || nonzero_a < na / 2 || nonzero_o < no / 2) {
            printf("FAILED: the split launches' outputs are no reference to compare with\n");
            return 1;
        }
        for (int form = 0; form < 2; ++form) {
            rpb_g = form == 1 ? 8 : 16;
            gblocks = F / rpb_g;
            poison();
            fused(set);
            fused(set);  // twice: the counters' reset by the last block is exercised
            fetch(a1, o1);
            int bad_a = 0, bad_o = 0;
            for (size_t i = 0; i < na; ++i) bad_a += memcmp(&a0[i], &a1[i], 4) != 0;
            for (size_t i = 0; i < no; ++i) bad_o += memcmp(&o0[i], &o1[i], 4) != 0;
            printf("bits, set %d, %s: act %d of %zu differ, down partials %d of %zu\n", set,
                   form == 0 ? "fused" : "fused 8-row", bad_a, na, bad_o, no);
            if (bad_a != 0 || bad_o != 0) {
                printf("FAILED: the fused kernel's bits differ from the split launches'\n");
                return 1;
            }
        }
    }
    const double bytes = (double)per_set + 3.0 * 320 * 4;
    const double floor_us = bytes / (tbs * 1e12) * 1e6;
    printf("per layer: %.1f MB, floor %.1f us at the copy rate\n", bytes / 1e6, floor_us);
    printf("%-28s %10s %10s %8s\n", "form", "median us", "min us", "x floor");
    const char* names[] = {"split (programmatic)", "split, plain launches", "fused", "split, 8-row gate/up",
                           "fused, 8-row gate/up"};
    const int FORMS = 5;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<std::vector<float>> all(FORMS);
    for (int round = 0; round < 3; ++round) {
        for (int f = 0; f < FORMS; ++f) {
            rpb_g = f >= 3 ? 8 : 16;
            gblocks = F / rpb_g;
            auto layer = [&](int l) {
                if (f == 0) split(true, l % SETS);
                if (f == 1) split(false, l % SETS);
                if (f == 2) fused(l % SETS);
                if (f == 3) split(true, l % SETS);
                if (f == 4) fused(l % SETS);
            };
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < LAYERS; ++l) layer(l);
            cudaGraph_t g;
            CK(cudaStreamEndCapture(st, &g));
            cudaGraphExec_t ge;
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));  // warm
            std::vector<float> ms(31);
            for (float& m : ms) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&m, e0, e1));
            }
            std::sort(ms.begin(), ms.end());
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            const double us = ms[ms.size() / 2] * 1000.0 / LAYERS, mn = ms[0] * 1000.0 / LAYERS;
            printf("round %d %-24s %10.1f %10.1f %8.2f\n", round, names[f], us, mn, us / floor_us);
            all[f].push_back((float)us);
        }
    }
    printf("summary (median of the rounds' medians, us per layer):");
    for (int f = 0; f < FORMS; ++f) {
        std::sort(all[f].begin(), all[f].end());
        printf(" %s %.1f;", names[f], all[f][1]);
    }
    printf("\n");
    return 0;
}
