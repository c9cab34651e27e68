//! The subject's model and battery, planned before any work: a model file is read and validated
//! (it is the input), a preset is only configured — generating it is work, done after every flag
//! is checked and the output directory is taken. The battery is checked against the model's
//! cache and vocabulary here, so an impossible request fails in milliseconds, never as a FAIL
//! receipt or a crash after minutes of generation.

use crate::args::ModelArgs;
use crate::error::GateError;
use crate::subject::Builtin;
use memra_receipts::fnv1a64;
use memra_receipts::schema::ModelEvidence;
use memra_runtime::model::{format, gen, Model, ModelConfig};
use memra_runtime::Battery;

/// Where the model will come from, already checked.
pub enum ModelSource {
    /// Read and validated from a file.
    File(Box<Model>),
    /// Generated from a preset configuration and a seed (not yet generated).
    Generated { config: ModelConfig, seed: u64 },
}

/// A planned model: its source, its configuration and its evidence (identity in receipts).
pub struct ModelPlan {
    pub source: ModelSource,
    pub config: ModelConfig,
    pub evidence: ModelEvidence,
    /// Fault injection: bytes held on every CUDA device before each run.
    pub device_reserve_bytes: usize,
}

/// Bytes a model of `c` takes in memory (weights as stored: BF16 attention projections, router,
/// embedding and lm_head; E4M3 experts with one f32 scale per 128×128 block).
pub fn model_bytes(c: &ModelConfig) -> u64 {
    let bf16 = |rows: usize, cols: usize| 2 * rows as u64 * cols as u64;
    let e4m3 = |rows: usize, cols: usize| {
        rows as u64 * cols as u64 + 4 * (rows.div_ceil(128) as u64) * (cols.div_ceil(128) as u64)
    };
    let (h, q, kv) = (c.hidden, c.q_width(), c.kv_width());
    let attention = bf16(q, h) + 2 * bf16(kv, h) + bf16(c.q_heads, h) + bf16(h, q) + bf16(c.experts, h);
    let expert = |w: usize| 2 * e4m3(w, h) + e4m3(h, w);
    let layer = attention + c.experts as u64 * expert(c.expert_width) + expert(c.shared_width);
    2 * bf16(c.vocab, h) + c.layers as u64 * layer
}

/// `MemAvailable` of /proc/meminfo in bytes, where the system reports it.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuse a model that cannot fit: generating it needs the weights once, plus about as much again
/// for the f32 working copies the generator and the host backend's shards hold.
pub fn check_fits(c: &ModelConfig, what: &str) -> Result<(), GateError> {
    let need = 2 * model_bytes(c);
    if let Some(avail) = available_memory() {
        if need > avail {
            return Err(GateError::usage(format!(
                "{what}: the {} preset with {} layers needs about {:.1} GiB of memory (weights {:.1} GiB, twice for generation and shards), but {:.1} GiB are available; use fewer --layers",
                c.preset,
                c.layers,
                need as f64 / (1u64 << 30) as f64,
                model_bytes(c) as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            )));
        }
    }
    Ok(())
}

impl ModelPlan {
    /// Check the model flags: read and validate a file, or configure a preset (validated, and
    /// refused when it cannot fit in memory).
    pub fn from_args(m: &ModelArgs) -> Result<ModelPlan, GateError> {
        let (source, config, preset, digest) = match &m.model {
            Some(path) => {
                // The digest is of the file's bytes: the weights exactly as loaded.
                let bytes = format::read_regular_file(path).map_err(|e| match e {
                    memra_runtime::RuntimeError::Io { source, .. } => {
                        GateError::usage(format!("--model {}: {source}", path.display()))
                    }
                    other => other.into(),
                })?;
                let model = format::from_bytes(&bytes, path)?;
                let config = model.config.clone();
                (ModelSource::File(Box::new(model)), config, "file".to_string(), format!("{:016x}", fnv1a64(&bytes)))
            }
            None => {
                let preset = m.preset.clone().unwrap_or_else(|| "tiny".to_string());
                let config = ModelConfig::preset(&preset, m.layers)?;
                check_fits(&config, &format!("--preset {preset}"))?;
                let plan = ModelPlan::generated(config, m.seed.unwrap_or(1), m.cuda_reserve_gib)?;
                (plan.source, plan.config, preset, plan.evidence.digest)
            }
        };
        let mut plan = ModelPlan {
            source,
            config,
            evidence: ModelEvidence { preset, digest },
            device_reserve_bytes: reserve_bytes(m.cuda_reserve_gib)?,
        };
        if let Some(n) = m.kv_positions {
            plan.config.max_positions = n;
            plan.config.validate()?;
            // A different cache capacity is a different subject: keep run identities apart.
            let d = &plan.evidence.digest;
            plan.evidence.digest = format!("{:016x}", fnv1a64(format!("{d}:kv{n}").as_bytes()));
        }
        Ok(plan)
    }

    /// A model generated from `config` and `seed` (not yet generated), named by its config's
    /// preset. A generated model is a pure function of (config, seed): its identity is their
    /// digest (serializing the `step` preset just to hash it would cost gigabytes).
    pub fn generated(config: ModelConfig, seed: u64, cuda_reserve_gib: f64) -> Result<ModelPlan, GateError> {
        config.validate()?;
        let identity = format!("generated:{}:{}", serde_json::to_string(&config).unwrap_or_default(), seed);
        let digest = format!("{:016x}", fnv1a64(identity.as_bytes()));
        Ok(ModelPlan {
            evidence: ModelEvidence { preset: config.preset.clone(), digest },
            source: ModelSource::Generated { config: config.clone(), seed },
            config,
            device_reserve_bytes: reserve_bytes(cuda_reserve_gib)?,
        })
    }

    /// What [`ModelPlan::load`] will do, for progress: generate which preset, or read which file.
    pub fn describe(&self) -> String {
        match &self.source {
            ModelSource::File(_) => {
                format!("model file ({}, {} layers), validated", self.config.preset, self.config.layers)
            }
            ModelSource::Generated { config, seed } => format!(
                "generating the {} preset ({} layers, seed {seed}, {:.1} GiB) on {} thread(s)",
                config.preset,
                config.layers,
                model_bytes(config) as f64 / (1u64 << 30) as f64,
                std::thread::available_parallelism().map_or(1, |n| n.get())
            ),
        }
    }

    /// [`ModelPlan::load`], timed (milliseconds), with a line before and after unless `quiet`.
    pub fn load_timed(self, battery: Battery, quiet: bool) -> Result<(Builtin, f64), GateError> {
        if !quiet {
            eprintln!("memra-gates: model: {} …", self.describe());
        }
        let t = std::time::Instant::now();
        let subject = self.load(battery)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if !quiet {
            eprintln!("memra-gates: model ready in {}", crate::suite::clock(ms / 1e3));
        }
        Ok((subject, ms))
    }

    /// Generate (or take) the model and make the built-in runtime that decodes it.
    pub fn load(self, battery: Battery) -> Result<Builtin, GateError> {
        let mut model = match self.source {
            ModelSource::File(m) => *m,
            ModelSource::Generated { config, seed } => gen::generate(&config, seed)?,
        };
        model.config.max_positions = self.config.max_positions;
        Ok(Builtin {
            model,
            model_evidence: self.evidence,
            battery,
            device_reserve_bytes: self.device_reserve_bytes,
            dist: None,
            pool: memra_runtime::program::pool::Pool::new(memra_runtime::program::pool::Budget::for_this_machine()),
            host_ranks: crate::subject::HostRankPolicy::Fixed(memra_runtime::backend::HostRanks::Threads),
        })
    }
}

fn reserve_bytes(gib: f64) -> Result<usize, GateError> {
    if !(gib.is_finite() && gib >= 0.0) {
        return Err(GateError::usage(format!("--cuda-reserve-gib {gib}: use a finite number of GiB ≥ 0")));
    }
    Ok((gib * (1u64 << 30) as f64) as usize)
}

/// The battery of a run: the documented default for the model's vocabulary, optionally
/// shortened, checked against the model — every prompt's steps must fit the KV cache, with no
/// arithmetic that could wrap.
pub fn battery_for(
    config: &ModelConfig,
    seed: u64,
    prompts: Option<usize>,
    gen_tokens: Option<usize>,
) -> Result<Battery, GateError> {
    let mut b = Battery::default_for(config.vocab, seed);
    let available = b.prompts.len();
    match prompts {
        Some(0) => {
            return Err(GateError::NothingToTest(format!(
                "--prompts 0 selects no prompt: nothing would be tested (use 1 to {available})"
            )))
        }
        Some(n) if n > available => {
            return Err(GateError::usage(format!(
                "--prompts {n}: the battery has {available} prompts (use 1 to {available})"
            )))
        }
        Some(n) => b.prompts.truncate(n),
        None => {}
    }
    if let Some(g) = gen_tokens {
        if g == 0 {
            return Err(GateError::NothingToTest("--gen-tokens 0 generates no token: nothing would be tested".into()));
        }
        b.gen_tokens = g;
    }
    for (i, p) in b.prompts.iter().enumerate() {
        let steps = p.len().checked_add(b.gen_tokens - 1);
        if steps.is_none_or(|s| s > config.max_positions) {
            return Err(GateError::usage(format!(
                "--gen-tokens {}: prompt {i} has {} tokens, so it needs {} positions, but the model's KV cache holds {} (use --gen-tokens {} or fewer, or --kv-positions)",
                b.gen_tokens,
                p.len(),
                steps.map_or_else(|| "more than 2^64".to_string(), |s| s.to_string()),
                config.max_positions,
                (config.max_positions + 1).saturating_sub(b.prompts.iter().map(Vec::len).max().unwrap_or(0))
            )));
        }
    }
    Ok(b)
}
