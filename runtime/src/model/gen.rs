//! Deterministic weight generation from (preset, seed).
//!
//! CI and the nightly matrix need a model nobody has to download, and two machines (or two
//! threads) must produce the same bytes from the same request. So every tensor is a pure function
//! of (configuration, seed, tensor name): its stream seed is `splitmix64(seed ^ fnv1a64(name))`
//! (the names of [`super::format`]), and element `i` of a tensor uses the `i`-th output of the
//! splitmix64 stream started at that seed. Nothing depends on the order tensors are produced in,
//! so large models are generated on all cores (one job per matrix, `std::thread::scope`), and a
//! job holds only its own f32 scratch while it quantizes.
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
use memra_kernels::formats::{bf16_from_f32, e4m3_block_quantize};
use memra_kernels::twins::digest::splitmix64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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

    fn run(&self, seed: u64) -> Matrix {
        let (out_features, in_features) = (self.out_features, self.in_features);
        let n = out_features * in_features;
        match self.kind {
            JobKind::Bf16 { std } => {
                let bits = normal_stream(seed, &self.name, n).map(|z| bf16_from_f32(z * std)).collect();
                Matrix::Bf16 { out_features, in_features, bits }
            }
            JobKind::E4m3 => {
                let std = inv_sqrt(in_features);
                let w: Vec<f32> = normal_stream(seed, &self.name, n).map(|z| z * std).collect();
                let (codes, scales) = e4m3_block_quantize(&w, out_features, in_features);
                Matrix::E4m3 { out_features, in_features, codes, scales }
            }
        }
    }
}

/// Run every job on up to `available_parallelism` threads; results in job order. Threads take
/// the next job from a shared counter, so one large matrix does not hold up the rest.
fn run_jobs(jobs: &[Job], seed: u64) -> Vec<Matrix> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len()).max(1);
    let next_job = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<Matrix>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let work = || loop {
        let i = next_job.fetch_add(1, Ordering::Relaxed);
        let Some(job) = jobs.get(i) else { break };
        let m = job.run(seed);
        slots.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(m);
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    slots.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().map(|m| m.expect("every job ran")).collect()
}

/// `1 / sqrt(n)`, rounded once to f32.
fn inv_sqrt(n: usize) -> f32 {
    (1.0 / (n as f64).sqrt()) as f32
}

/// FNV-1a 64-bit hash of a tensor name.
fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3))
}

/// The splitmix64 stream of tensor `name`: element `i` is `splitmix64(s + i·γ)` with
/// `s = splitmix64(seed ^ fnv1a64(name))` (the classic splitmix64 sequence started at `s`).
fn stream(seed: u64, name: &str, n: usize) -> impl Iterator<Item = u64> {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    let start = splitmix64(seed ^ fnv1a64(name));
    (0..n as u64).map(move |i| splitmix64(start.wrapping_add(i.wrapping_mul(GAMMA))))
}

/// Approximately standard normal values: the four 16-bit fields of a draw, each a uniform
/// `(k + 0.5) / 65536`, summed, centred and scaled by √3 (Irwin–Hall n = 4 has variance 1/3).
fn normal_stream(seed: u64, name: &str, n: usize) -> impl Iterator<Item = f32> {
    const SQRT3: f32 = 1.732_050_8;
    stream(seed, name, n).map(|u| {
        let k = (u & 0xFFFF) + ((u >> 16) & 0xFFFF) + ((u >> 32) & 0xFFFF) + (u >> 48);
        // (k + 2) / 65536 − 2 is exact in f32 (k + 2 < 2^18); only the √3 product rounds.
        ((k as f32 + 2.0) * (1.0 / 65536.0) - 2.0) * SQRT3
    })
}

/// `base + spread · U(−1, 1)` per element; U from the top 23 bits `k` of a draw as
/// `(k + 0.5) / 2^22 − 1` (exact in f32).
fn uniform_vec(seed: u64, name: &str, n: usize, base: f32, spread: f32) -> Vec<f32> {
    stream(seed, name, n).map(|u| base + spread * (((u >> 41) as f32 + 0.5) * (1.0 / 4_194_304.0) - 1.0)).collect()
}
