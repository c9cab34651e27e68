//! Criterion benches of the host twins at `step` shapes (docs/DESIGN.md §8: the host oracle computes
//! every gated run's reference record, so its speed limits gating at real shapes): BF16 GEMV
//! 4096 × 4096, E4M3 GEMV 1280 × 4096, the grouped experts of one step (8 routed slots: gate, up,
//! SwiGLU, down partials), the 4096-wide RMSNorm, decode attention (32 q / 8 kv heads over 256
//! positions) and the 288-expert top-8 router.
//!
//! CI only builds them (`cargo bench -p memra-kernels --no-run`); `cargo bench -p memra-kernels`
//! runs them.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use memra_kernels::formats::bf16_from_f32;
use memra_kernels::twins::attention::decode_attention;
use memra_kernels::twins::digest::splitmix64;
use memra_kernels::twins::experts::gate_up_act;
use memra_kernels::twins::gemv::{gemv_partials, gemv_rows, MatrixView, WeightRef};
use memra_kernels::twins::moe::router_topk;
use memra_kernels::twins::norm::rmsnorm_rows;

const HIDDEN: usize = 4096;
const WIDTH: usize = 1280;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix64(self.0)
    }
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
    /// E4M3 codes without NaN codes, and block scales.
    fn e4m3(&mut self, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
        let codes = (0..rows * cols).map(|_| (self.next() as u8) & 0xF7).collect();
        let scales = (0..rows.div_ceil(128) * (cols / 128)).map(|_| 1.0 / 256.0).collect();
        (codes, scales)
    }
}

fn e4m3_view<'a>(m: &'a (Vec<u8>, Vec<f32>), rows: usize, cols: usize, kw: usize) -> MatrixView<'a> {
    MatrixView {
        w: WeightRef::E4m3 { codes: &m.0, scales: &m.1, row0: 0 },
        out_features: rows,
        in_features: cols,
        kblock_width: kw,
    }
}

fn gemv(c: &mut Criterion) {
    let mut rng = Rng(1);
    // Weights of a real scale (uniform in ±1/64, as BF16): raw random bits would include
    // subnormals, whose products take a slow microcode path on x86 and make the bench measure
    // that instead of the GEMV.
    let bf16: Vec<u16> = (0..HIDDEN * HIDDEN).map(|_| bf16_from_f32(rng.unit() / 64.0)).collect();
    let x = rng.vec(HIDDEN);
    let v =
        MatrixView { w: WeightRef::Bf16(&bf16), out_features: HIDDEN, in_features: HIDDEN, kblock_width: HIDDEN / 8 };
    let mut out = vec![0.0f32; HIDDEN];
    c.bench_function("gemv_rows bf16 4096x4096", |b| b.iter(|| gemv_rows(black_box(&v), black_box(&x), &mut out)));
    let m = rng.e4m3(WIDTH, HIDDEN);
    let v = e4m3_view(&m, WIDTH, HIDDEN, HIDDEN / 8);
    let mut out = vec![0.0f32; WIDTH];
    c.bench_function("gemv_rows e4m3 1280x4096", |b| b.iter(|| gemv_rows(black_box(&v), black_box(&x), &mut out)));
}

fn grouped_experts(c: &mut Criterion) {
    let mut rng = Rng(2);
    let experts: Vec<[(Vec<u8>, Vec<f32>); 3]> =
        (0..8).map(|_| [rng.e4m3(WIDTH, HIDDEN), rng.e4m3(WIDTH, HIDDEN), rng.e4m3(HIDDEN, WIDTH)]).collect();
    let x = rng.vec(HIDDEN);
    let mut act = vec![0.0f32; WIDTH];
    let mut parts = vec![0.0f32; 2 * HIDDEN];
    c.bench_function("grouped experts 8 x (gate, up, swiglu, down) e4m3", |b| {
        b.iter(|| {
            for [g, u, d] in &experts {
                let (g, u) = (e4m3_view(g, WIDTH, HIDDEN, HIDDEN / 8), e4m3_view(u, WIDTH, HIDDEN, HIDDEN / 8));
                gate_up_act(&g, &u, black_box(&x), None, Some(7.0), &mut act);
                gemv_partials(&e4m3_view(d, HIDDEN, WIDTH, WIDTH / 2), &act, &mut parts);
            }
        })
    });
}

fn norm_attention_router(c: &mut Criterion) {
    let mut rng = Rng(3);
    let (x, w) = (rng.vec(HIDDEN), rng.vec(HIDDEN));
    let mut y = vec![0.0f32; HIDDEN];
    c.bench_function("rmsnorm 4096", |b| b.iter(|| rmsnorm_rows(black_box(&x), &w, 1e-6, &mut y)));
    let (qh, kvh, len) = (32, 8, 256);
    let q = rng.vec(qh * 128);
    let (k, v) = (rng.vec(len * kvh * 128), rng.vec(len * kvh * 128));
    let gate = rng.vec(qh);
    let mut out = vec![0.0f32; qh * 128];
    c.bench_function("decode attention 32q/8kv x 256 positions", |b| {
        b.iter(|| decode_attention(black_box(&q), &k, &v, &gate, len, qh, kvh, &mut out))
    });
    let (logits, bias) = (rng.vec(288), rng.vec(288));
    c.bench_function("router 288 top-8", |b| b.iter(|| router_topk(black_box(&logits), &bias, 8, true, 2.5)));
}

criterion_group!(benches, gemv, grouped_experts, norm_attention_router);
criterion_main!(benches);
