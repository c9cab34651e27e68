//! A run configuration: everything that decides what one run computes. Doors are explicit values
//! here — never process-global state — so one process can run many combinations.

pub use crate::door::{Canary, Door, DoorSet};
use crate::error::RuntimeError;
pub use memra_kernels::grid::Tp;

/// How bytes move between ranks (docs/DESIGN.md §3.5). A transport never does arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transport {
    /// rank → (pinned) host staging → destination: the exactness reference.
    HostBounce,
    /// Direct peer copies between rank memories.
    NativeP2p,
    /// NCCL moves the bytes (one device per rank).
    Nccl,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::HostBounce, Transport::NativeP2p, Transport::Nccl];

    pub fn name(self) -> &'static str {
        match self {
            Transport::HostBounce => "host-bounce",
            Transport::NativeP2p => "native-p2p",
            Transport::Nccl => "nccl",
        }
    }

    pub fn parse(s: &str) -> Result<Self, RuntimeError> {
        Transport::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| RuntimeError::UnknownTransport { name: s.to_string() })
    }
}

/// The prompts a run decodes and how many tokens it generates after each.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Battery {
    pub prompts: Vec<Vec<u32>>,
    pub gen_tokens: usize,
}

impl Battery {
    /// The documented default battery: 8 prompts of 4..=7 tokens drawn from a splitmix64 stream
    /// seeded with `seed`, token ids uniform over `0..vocab`, and 8 generated tokens each.
    pub fn default_for(vocab: usize, seed: u64) -> Battery {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_add(1);
            memra_kernels::twins::digest::splitmix64(state)
        };
        let prompts = (0..8)
            .map(|_| {
                let len = 4 + (next() % 4) as usize;
                (0..len).map(|_| (next() % vocab as u64) as u32).collect()
            })
            .collect();
        Battery { prompts, gen_tokens: 8 }
    }

    /// Decode steps one prompt takes: every prompt token is fed, then `gen_tokens − 1` generated
    /// ones (the last generated token is produced, not fed).
    pub fn steps_of(&self, prompt: usize) -> usize {
        self.prompts[prompt].len() + self.gen_tokens - 1
    }
}

/// Storage of the routed experts: the model's E4M3 banks, or NVFP4 banks re-quantized from them
/// at load (docs/DESIGN.md §3.3; the NVFP4_EP2 door runs on NVFP4 banks, and its oracle is the
/// canonical program on the same banks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ExpertFormat {
    #[default]
    E4m3,
    Nvfp4,
}

/// Which device timing marks a run records (gating cost: every mark is an event on every rank).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Timing {
    /// A begin/end pair around every seam and every layer (the per-seam latency table).
    #[default]
    Seams,
    /// Only a begin/end pair around every layer (and the head).
    Layers,
    /// No marks at all.
    Off,
}

/// Everything that decides one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    pub tp: Tp,
    pub transport: Transport,
    pub doors: DoorSet,
    pub battery: Battery,
    /// Teacher forcing: when set, step inputs after the prompt are these tokens (per prompt)
    /// instead of the run's own argmax (NUMERIC-CLASS gates consume the oracle's tape).
    pub forced_tokens: Option<Vec<Vec<u32>>>,
    /// (prompt, step, layer, seam) whose full logical tensor the record must carry.
    pub capture: Vec<crate::evidence::record::CaptureKey>,
    /// Routed-expert storage (NVFP4_EP2 implies NVFP4).
    pub expert_format: ExpertFormat,
    /// Timing marks recorded (default: per seam and per layer).
    pub timing: Timing,
    /// Whether seam digests are computed (default on; off only to measure their cost — a record
    /// without digests cannot pass an identity gate).
    pub digests: bool,
    /// Rows and columns of a pass (docs/DESIGN.md §3.6): how sessions and tokens share one pass.
    pub pass: PassShape,
}

/// The shape of one pass of the program (docs/DESIGN.md §3.6): `batch` sessions advance one
/// token each (rows), or `columns` consecutive tokens of one session are computed together
/// (verify and prefill). `1 × 1` is single-token decode. Both are 1, 2, 4 or 8, and one of them is
/// 1: a pass of several sessions' several columns is not a shape this program defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PassShape {
    pub batch: usize,
    pub columns: usize,
}

impl Default for PassShape {
    fn default() -> Self {
        PassShape::SINGLE
    }
}

impl PassShape {
    /// One token of one session per pass.
    pub const SINGLE: PassShape = PassShape { batch: 1, columns: 1 };

    /// The shape, or the refusal naming the value and the rule.
    pub fn new(batch: usize, columns: usize) -> Result<PassShape, RuntimeError> {
        for (axis, n) in [("batch", batch), ("columns", columns)] {
            if ![1, 2, 4, 8].contains(&n) {
                return Err(RuntimeError::Contract(format!(
                    "--{axis} {n}: a pass holds 1, 2, 4 or 8 {}",
                    if axis == "batch" { "sessions (rows)" } else { "consecutive tokens (columns)" }
                )));
            }
        }
        if batch > 1 && columns > 1 {
            return Err(RuntimeError::Contract(format!(
                "--batch {batch} with --columns {columns}: a pass is rows (several sessions, one token each) or columns (one session, several tokens), not both"
            )));
        }
        Ok(PassShape { batch, columns })
    }

    /// Lanes of a pass: rows or columns, whichever is above 1.
    pub fn lanes(self) -> usize {
        self.batch.max(self.columns)
    }

    /// `b4`, `t2`, or `` for single-token decode (run labels).
    pub fn label(self) -> String {
        match (self.batch, self.columns) {
            (1, 1) => String::new(),
            (b, 1) => format!("b{b}"),
            (_, t) => format!("t{t}"),
        }
    }
}

impl RunConfig {
    pub fn new(tp: usize, transport: Transport, battery: Battery) -> Result<Self, RuntimeError> {
        Ok(RunConfig {
            tp: check_tp(tp)?,
            transport,
            doors: DoorSet::default(),
            battery,
            forced_tokens: None,
            capture: Vec::new(),
            expert_format: ExpertFormat::E4m3,
            timing: Timing::Seams,
            digests: true,
            pass: PassShape::SINGLE,
        })
    }

    /// The registry's rules the program's mechanisms rely on — every door's `requires`,
    /// `conflicts` and `transports` in gates/doors.toml, generated into [`Door`] — so a run
    /// configured without the registry is refused here, never run as something else. (TP sizes
    /// and backends are the matrix's business: a door outside them runs, but is NOT-APPLICABLE or
    /// VOID there.)
    pub fn check_doors(&self) -> Result<(), RuntimeError> {
        let d = &self.doors;
        for door in Door::ALL.into_iter().filter(|&door| d.get(door)) {
            let refuse = |rule: String| Err(RuntimeError::DoorRefused { door: door.env(), rule });
            for &(needed, why) in door.requires() {
                if !d.get(needed) {
                    return refuse(format!("{} without {}: {why}", door.env(), needed.env()));
                }
            }
            for &(other, why) in door.conflicts() {
                if d.get(other) {
                    return refuse(format!("{} with {}: {why}", door.env(), other.env()));
                }
            }
            let (transports, why) = door.transports();
            if !transports.contains(&self.transport.name()) {
                return refuse(format!("{} with transport {}: {why}", door.env(), self.transport.name()));
            }
        }
        Ok(())
    }

    /// Whether the routed experts run as NVFP4 banks.
    pub fn nvfp4_experts(&self) -> bool {
        self.doors.nvfp4_banks() || self.expert_format == ExpertFormat::Nvfp4
    }
}

/// `tp` as a [`Tp`] (1, 2, 4 or 8: the canonical grid has 8 blocks), or the typed refusal. The
/// one place a bare TP size becomes a `Tp` in the runtime.
pub fn check_tp(tp: usize) -> Result<Tp, RuntimeError> {
    Tp::new(tp).map_err(|e| RuntimeError::UnsupportedTp { tp: e.0 })
}
