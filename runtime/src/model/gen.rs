//! Deterministic weight generation from (preset, seed).
//!
//! CI and the nightly matrix need a model nobody has to download, and two machines (or two
//! threads) must produce the same bytes from the same request. So every tensor is a pure function
//! of (configuration, seed, tensor name): its stream seed is `splitmix64(seed ^ fnv1a64(name))`
//! (the names of [`super::format`]), and element `i` of a tensor uses the `i`-th output of the
//! splitmix64 stream started at that seed. Nothing depends on the order elements are produced in,
//! so large models are generated on all cores (rayon over matrices and, inside a matrix, over
//! bands of 128 rows — the E4M3 scale blocks are 128 rows tall, so a band is quantized on its own
//! with the bytes of the whole matrix), and a band holds only its own f32 scratch (a few MiB)
//! while it quantizes.
//!
//! Distributions (`N` is the standardised sum of four 16-bit uniforms from one 64-bit draw —
//! Irwin–Hall n = 4, mean 0, variance 1, bounded to ±2√3 — and `U(−1,1)` uses the top 23 bits of
//! a draw, centred on the half-quantum so it never returns ±1 or 0 exactly):
//!
//! | tensor | values | stored as |
//! |---|---|---|
//! | `embed.weight` | N(0, 1) | BF16 |
//! | `attn.{q,k,v,gate,o}.weight`, `lm_head.weight` | N(0, 1/in_features) | BF16 |
//! | `router.weight` | N(0, 1/hidden) | BF16 |
//! | `router.bias` | 0.01 · U(−1, 1) | f32 |
//! | `*_norm.weight` (attn, ffn, q, k, final) | 1 + 0.1 · U(−1, 1) | f32 |
//! | `experts.*`, `shared.*` gate / up / down | N(0, 1/in_features) | E4M3, per-128×128 f32 scales (`e4m3_block_quantize`) |
//!
//! BF16 values are rounded once from f32 with `bf16_from_f32`. All arithmetic is IEEE
//! single-precision with correctly rounded operations (the one square root is f64 `sqrt`), so the
//! bytes do not depend on the platform.

use super::format::names;
use super::{Expert, Layer, Matrix, Model, ModelConfig};
use memra_kernels::formats::{bf16_from_f32, e4m3_block_quantize_into, E4M3_BLOCK};
use memra_kernels::twins::digest::splitmix64;
use rayon::prelude::*;

/// Generate a model whose every weight is a pure function of (config, seed).
pub fn generate(config: &ModelConfig, seed: u64) -> Result<Model, crate::RuntimeError> {
    config.validate()?;
    let c = config;
    let (hidden, q_w, kv_w) = (c.hidden, c.q_width(), c.kv_width());

    // Every matrix is one job; vectors are cheap and made inline.
    let mut jobs: Vec<Job> = vec![Job::bf16(names::EMBED.into(), c.vocab, hidden, 1.0)];
    for l in 0..c.layers {
        jobs.push(Job::bf16(names::layer(l, "attn.q.weight"), q_w, hidden, inv_sqrt(hidden)));
        jobs.push(Job::bf16(names::layer(l, "attn.k.weight"), kv_w, hidden, inv_sqrt(hidden)));
        jobs.push(Job::bf16(names::layer(l, "attn.v.weight"), kv_w, hidden, inv_sqrt(hidden)));
        jobs.push(Job::bf16(names::layer(l, "attn.gate.weight"), c.q_heads, hidden, inv_sqrt(hidden)));
        jobs.push(Job::bf16(names::layer(l, "attn.o.weight"), hidden, q_w, inv_sqrt(q_w)));
        jobs.push(Job::bf16(names::layer(l, "router.weight"), c.experts, hidden, inv_sqrt(hidden)));
        let experts = (0..c.experts).map(|e| (names::expert(l, e), c.expert_width));
        for (prefix, width) in experts.chain([(names::shared(l), c.shared_width)]) {
            jobs.push(Job::e4m3(format!("{prefix}.gate.weight"), width, hidden));
            jobs.push(Job::e4m3(format!("{prefix}.up.weight"), width, hidden));
            jobs.push(Job::e4m3(format!("{prefix}.down.weight"), hidden, width));
        }
    }
    jobs.push(Job::bf16(names::LM_HEAD.into(), c.vocab, hidden, inv_sqrt(hidden)));

    let mut matrices = run_jobs(&jobs, seed).into_iter();
    let mut next = || matrices.next().expect("one matrix per job");
    let norm = |name: &str, len: usize| uniform_vec(seed, name, len, 1.0, 0.1);

    let embed = next();
    let mut layers = Vec::with_capacity(c.layers);
    for l in 0..c.layers {
        let (wq, wk, wv, wg, wo, router) = (next(), next(), next(), next(), next(), next());
        let mut expert = || Expert { gate: next(), up: next(), down: next() };
        let experts: Vec<Expert> = (0..c.experts).map(|_| expert()).collect();
        let shared = expert();
        layers.push(Layer {
            attn_norm: norm(&names::layer(l, "attn_norm.weight"), hidden),
            wq,
            wk,
            wv,
            wg,
            q_norm: norm(&names::layer(l, "attn.q_norm.weight"), c.head_dim),
            k_norm: norm(&names::layer(l, "attn.k_norm.weight"), c.head_dim),
            wo,
            ffn_norm: norm(&names::layer(l, "ffn_norm.weight"), hidden),
            router,
            router_bias: uniform_vec(seed, &names::layer(l, "router.bias"), c.experts, 0.0, 0.01),
            experts,
            shared,
        });
    }
    let lm_head = next();
    let mut model =
        Model { config: config.clone(), embed, layers, final_norm: norm(names::FINAL_NORM, hidden), lm_head };
    // The `edge` preset's weights are built on purpose from the generated ones (`model::edge`).
    if config.preset == "edge" {
        super::edge::shape(&mut model, seed)?;
    }
    Ok(model)
}

/// One matrix to generate.
struct Job {
    name: String,
    out_features: usize,
    in_features: usize,
    kind: JobKind,
}

enum JobKind {
    /// BF16 of N(0, std²).
    Bf16 { std: f32 },
    /// E4M3 block-quantized N(0, 1/in_features).
    E4m3,
}

impl Job {
    fn bf16(name: String, out_features: usize, in_features: usize, std: f32) -> Job {
        Job { name, out_features, in_features, kind: JobKind::Bf16 { std } }
    }
    fn e4m3(name: String, out_features: usize, in_features: usize) -> Job {
        Job { name, out_features, in_features, kind: JobKind::E4m3 }
    }

    /// The matrix, band by band on the rayon pool: band b holds rows `b·128 ..` and elements
    /// from `b·128·in_features` of the tensor's stream.
    fn run(&self, seed: u64) -> Matrix {
        let (out_features, in_features) = (self.out_features, self.in_features);
        assert!(in_features > 0, "a validated configuration has no empty matrix ({})", self.name);
        let n = out_features * in_features;
        let band = BAND_ROWS * in_features;
        match self.kind {
            JobKind::Bf16 { std } => {
                let mut bits = vec![0u16; n];
                bits.par_chunks_mut(band).enumerate().for_each(|(b, out)| {
                    let values = normal_stream(seed, &self.name, b * band, out.len());
                    for (o, z) in out.iter_mut().zip(values) {
                        *o = bf16_from_f32(z * std);
                    }
                });
                Matrix::Bf16 { out_features, in_features, bits }
            }
            JobKind::E4m3 => {
                let std = inv_sqrt(in_features);
                let col_blocks = in_features.div_ceil(E4M3_BLOCK);
                let mut codes = vec![0u8; n];
                let mut scales = vec![0.0f32; out_features.div_ceil(E4M3_BLOCK) * col_blocks];
                codes.par_chunks_mut(band).zip(scales.par_chunks_mut(col_blocks)).enumerate().for_each(
                    |(b, (codes, scales))| {
                        let w: Vec<f32> =
                            normal_stream(seed, &self.name, b * band, codes.len()).map(|z| z * std).collect();
                        e4m3_block_quantize_into(&w, codes.len() / in_features, in_features, codes, scales);
                    },
                );
                Matrix::E4m3 { out_features, in_features, codes, scales }
            }
        }
    }
}

/// Rows of one band: the height of an E4M3 scale block.
const BAND_ROWS: usize = E4M3_BLOCK;

/// Every matrix, in job order (rayon over jobs and, inside each, over bands).
fn run_jobs(jobs: &[Job], seed: u64) -> Vec<Matrix> {
    jobs.par_iter().map(|job| job.run(seed)).collect()
}

/// `1 / sqrt(n)`, rounded once to f32.
fn inv_sqrt(n: usize) -> f32 {
    (1.0 / (n as f64).sqrt()) as f32
}

/// FNV-1a 64-bit hash of a tensor name.
fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3))
}

/// Elements `first .. first + n` of the splitmix64 stream of tensor `name`: element `i` is
/// `splitmix64(s + i·γ)` with `s = splitmix64(seed ^ fnv1a64(name))` (the classic splitmix64
/// sequence started at `s`), so any range can be produced on its own.
fn stream(seed: u64, name: &str, first: usize, n: usize) -> impl Iterator<Item = u64> {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    let start = splitmix64(seed ^ fnv1a64(name));
    // s + i·γ advanced by one addition per element (the same wrapping value as the product).
    let mut state = start.wrapping_add((first as u64).wrapping_mul(GAMMA));
    (0..n).map(move |_| {
        let x = splitmix64(state);
        state = state.wrapping_add(GAMMA);
        x
    })
}

/// Approximately standard normal values: the four 16-bit fields of a draw, each a uniform
/// `(k + 0.5) / 65536`, summed, centred and scaled by √3 (Irwin–Hall n = 4 has variance 1/3).
fn normal_stream(seed: u64, name: &str, first: usize, n: usize) -> impl Iterator<Item = f32> {
    const SQRT3: f32 = 1.732_050_8;
    stream(seed, name, first, n).map(|u| {
        let k = (u & 0xFFFF) + ((u >> 16) & 0xFFFF) + ((u >> 32) & 0xFFFF) + (u >> 48);
        // (k + 2) / 65536 − 2 is exact in f32 (k + 2 < 2^18); only the √3 product rounds.
        ((k as f32 + 2.0) * (1.0 / 65536.0) - 2.0) * SQRT3
    })
}

/// `base + spread · U(−1, 1)` per element; U from the top 23 bits `k` of a draw as
/// `(k + 0.5) / 2^22 − 1` (exact in f32).
fn uniform_vec(seed: u64, name: &str, n: usize, base: f32, spread: f32) -> Vec<f32> {
    stream(seed, name, 0, n).map(|u| base + spread * (((u >> 41) as f32 + 0.5) * (1.0 / 4_194_304.0) - 1.0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a over every stored byte of a model, tensor by tensor in a fixed order.
    fn weights_digest(m: &Model) -> u64 {
        fn eat(h: &mut u64, bytes: impl IntoIterator<Item = u8>) {
            for b in bytes {
                *h = (*h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
            }
        }
        fn matrix(h: &mut u64, m: &Matrix) {
            match m {
                Matrix::Bf16 { bits, .. } => eat(h, bits.iter().flat_map(|b| b.to_le_bytes())),
                Matrix::E4m3 { codes, scales, .. } => {
                    eat(h, codes.iter().copied());
                    eat(h, scales.iter().flat_map(|s| s.to_bits().to_le_bytes()));
                }
            }
        }
        let mut h = 0xCBF2_9CE4_8422_2325u64;
        let vec = |h: &mut u64, v: &[f32]| eat(h, v.iter().flat_map(|s| s.to_bits().to_le_bytes()));
        matrix(&mut h, &m.embed);
        for l in &m.layers {
            vec(&mut h, &l.attn_norm);
            for w in [&l.wq, &l.wk, &l.wv, &l.wg, &l.wo, &l.router] {
                matrix(&mut h, w);
            }
            vec(&mut h, &l.q_norm);
            vec(&mut h, &l.k_norm);
            vec(&mut h, &l.ffn_norm);
            vec(&mut h, &l.router_bias);
            for e in l.experts.iter().chain([&l.shared]) {
                for w in [&e.gate, &e.up, &e.down] {
                    matrix(&mut h, w);
                }
            }
        }
        vec(&mut h, &m.final_norm);
        matrix(&mut h, &m.lm_head);
        h
    }

    /// Today's generation done the plain way, one matrix after another: the whole tensor's
    /// stream, then `e4m3_block_quantize` of the whole matrix.
    fn sequential_reference(c: &ModelConfig, seed: u64) -> Model {
        let plain = |job: Job| -> Matrix {
            let n = job.out_features * job.in_features;
            match job.kind {
                JobKind::Bf16 { std } => Matrix::Bf16 {
                    out_features: job.out_features,
                    in_features: job.in_features,
                    bits: normal_stream(seed, &job.name, 0, n).map(|z| bf16_from_f32(z * std)).collect(),
                },
                JobKind::E4m3 => {
                    let std = inv_sqrt(job.in_features);
                    let w: Vec<f32> = normal_stream(seed, &job.name, 0, n).map(|z| z * std).collect();
                    let (codes, scales) =
                        memra_kernels::formats::e4m3_block_quantize(&w, job.out_features, job.in_features);
                    Matrix::E4m3 { out_features: job.out_features, in_features: job.in_features, codes, scales }
                }
            }
        };
        let mut m = generate(c, seed).expect("valid config");
        let (h, q_w, kv_w) = (c.hidden, c.q_width(), c.kv_width());
        m.embed = plain(Job::bf16(names::EMBED.into(), c.vocab, h, 1.0));
        for (l, layer) in m.layers.iter_mut().enumerate() {
            layer.wq = plain(Job::bf16(names::layer(l, "attn.q.weight"), q_w, h, inv_sqrt(h)));
            layer.wk = plain(Job::bf16(names::layer(l, "attn.k.weight"), kv_w, h, inv_sqrt(h)));
            layer.wv = plain(Job::bf16(names::layer(l, "attn.v.weight"), kv_w, h, inv_sqrt(h)));
            layer.wg = plain(Job::bf16(names::layer(l, "attn.gate.weight"), c.q_heads, h, inv_sqrt(h)));
            layer.wo = plain(Job::bf16(names::layer(l, "attn.o.weight"), h, q_w, inv_sqrt(q_w)));
            layer.router = plain(Job::bf16(names::layer(l, "router.weight"), c.experts, h, inv_sqrt(h)));
            let prefixes = (0..c.experts).map(|e| (names::expert(l, e), c.expert_width));
            let experts = layer.experts.iter_mut().chain([&mut layer.shared]);
            for ((prefix, width), e) in prefixes.chain([(names::shared(l), c.shared_width)]).zip(experts) {
                e.gate = plain(Job::e4m3(format!("{prefix}.gate.weight"), width, h));
                e.up = plain(Job::e4m3(format!("{prefix}.up.weight"), width, h));
                e.down = plain(Job::e4m3(format!("{prefix}.down.weight"), h, width));
            }
        }
        m.lm_head = plain(Job::bf16(names::LM_HEAD.into(), c.vocab, h, inv_sqrt(h)));
        m
    }

    /// Parallel generation (rayon over matrices and bands) gives the bytes of the sequential
    /// procedure, on `tiny` and on shapes whose matrices end in a partial band (384 rows) or are
    /// shorter than one band (the 8-row attention gate).
    #[test]
    fn parallel_generation_equals_the_sequential_procedure() {
        let tiny = ModelConfig::preset("tiny", None).unwrap();
        let mut odd = tiny.clone();
        (odd.expert_width, odd.shared_width, odd.hidden, odd.vocab) = (384, 640, 1152, 1000);
        odd.validate().expect("the odd shapes are on the grid");
        for (c, seed) in [(tiny, 1), (odd, 5)] {
            let got = generate(&c, seed).unwrap();
            let want = sequential_reference(&c, seed);
            assert!(got == want, "{} seed {seed}: generated weights differ from the sequential procedure", c.preset);
        }
    }

    /// The bytes of `tiny` (seed 1) as the sequential generator produced them before generation
    /// was parallelised: any change to the weights of a seed shows here.
    #[test]
    fn tiny_weights_are_pinned() {
        let m = generate(&ModelConfig::preset("tiny", None).unwrap(), 1).unwrap();
        assert_eq!(weights_digest(&m), 0x166e_c70b_20ce_24d7);
    }
}
