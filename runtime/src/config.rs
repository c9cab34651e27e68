//! A run configuration: everything that decides what one run computes. Doors are explicit values
//! here — never process-global state — so one process can run many combinations.

use crate::error::RuntimeError;

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

/// A planted defect (CANARY class): its gate must FAIL (or, for a silent fallback, the run must
/// be VOID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Canary {
    /// Flip the lowest mantissa bit of element `element` (a global index of the seam's logical
    /// tensor) of a seam's tensor at one layer and step.
    FlipBit { layer: usize, seam: crate::record::Seam, step: usize, element: usize },
    /// Row-parallel K-block partials folded in reverse order (only at TP > 1).
    ReverseKBlocks,
    /// The o_join reads the previous step's partials (a stale buffer) at every step after the first.
    StaleBuffer,
    /// A join reads a peer's buffer without waiting for its producer (device only).
    SkipFence,
    /// The router breaks exact key ties towards the higher expert id (a twin defect; host only).
    TieBreak,
    /// GEMV sums and folds start from −0.0 instead of +0.0 (a twin defect; host only).
    SignedZero,
    /// The SwiGLU leaves its silu side unclamped (a twin defect; host only).
    Clamp,
    /// OPROJ_DIRECT falls back to copies while its call site still counts peer stores: the
    /// engagement gate must find no peer store in the census (the run is VOID).
    SilentFallback,
    /// The attn_norm broadcast corrupts the copy to the last rank (one bit of element 0, layer
    /// 0, step 0): the copy check must name that copy.
    BrokenBroadcast,
}

impl Canary {
    /// The twin defect this canary plants in the backend, if it is one.
    pub fn twin_defect(&self) -> Option<crate::backend::defect::TwinDefect> {
        use crate::backend::defect::TwinDefect;
        match self {
            Canary::TieBreak => Some(TwinDefect::RouterTiesToHigherId),
            Canary::SignedZero => Some(TwinDefect::SumsFromNegativeZero),
            Canary::Clamp => Some(TwinDefect::SiluUnclamped),
            _ => None,
        }
    }
}

/// Explicit door values of one run (all `false` = every door at its default-off state).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DoorSet {
    pub bulk_p2p: bool,
    pub oproj_direct: bool,
    pub oproj_tail: bool,
    pub moe_direct: bool,
    pub routes_prestage: bool,
    pub fence_memops: bool,
    pub rank0_merge: bool,
    pub graph: bool,
    pub f32_mirror: bool,
    pub step_ep: bool,
    pub qkv_fused: bool,
    pub dev_router: bool,
    pub w8: bool,
    pub nvfp4_ep2: bool,
    pub nccl_allreduce: bool,
    pub canary: Option<Canary>,
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
    pub tp: usize,
    pub transport: Transport,
    pub doors: DoorSet,
    pub battery: Battery,
    /// Teacher forcing: when set, step inputs after the prompt are these tokens (per prompt)
    /// instead of the run's own argmax (NUMERIC-CLASS gates consume the oracle's tape).
    pub forced_tokens: Option<Vec<Vec<u32>>>,
    /// (prompt, step, layer, seam) whose full logical tensor the record must carry.
    pub capture: Vec<crate::record::CaptureKey>,
    /// Routed-expert storage (NVFP4_EP2 implies NVFP4).
    pub expert_format: ExpertFormat,
    /// Timing marks recorded (default: per seam and per layer).
    pub timing: Timing,
    /// Whether seam digests are computed (default on; off only to measure their cost — a record
    /// without digests cannot pass an identity gate).
    pub digests: bool,
}

impl RunConfig {
    pub fn new(tp: usize, transport: Transport, battery: Battery) -> Result<Self, RuntimeError> {
        check_tp(tp)?;
        Ok(RunConfig {
            tp,
            transport,
            doors: DoorSet::default(),
            battery,
            forced_tokens: None,
            capture: Vec::new(),
            expert_format: ExpertFormat::E4m3,
            timing: Timing::Seams,
            digests: true,
        })
    }

    /// The door rules the program's mechanisms rely on (gates/doors.toml states them too; a run
    /// configured without the registry is refused here, never run as something else).
    pub fn check_doors(&self) -> Result<(), RuntimeError> {
        let d = &self.doors;
        let refuse = |door: &'static str, rule: String| Err(RuntimeError::DoorRefused { door, rule });
        for (on, env) in [(d.oproj_direct, "MEMRA_OPROJ_DIRECT"), (d.moe_direct, "MEMRA_MOE_DIRECT")] {
            if on && self.transport != Transport::NativeP2p {
                return refuse(
                    env,
                    format!(
                        "{env} with transport {}: peer stores write into the root's memory, which needs native-p2p",
                        self.transport.name()
                    ),
                );
            }
        }
        if d.fence_memops && !d.moe_direct {
            return refuse(
                "MEMRA_FENCE_MEMOPS",
                "MEMRA_FENCE_MEMOPS without MEMRA_MOE_DIRECT: the doorbells replace the MOE_DIRECT join's fences, \
                 which do not exist otherwise"
                    .into(),
            );
        }
        if d.bulk_p2p && d.moe_direct {
            return refuse(
                "MEMRA_STEP_TP_BULK_P2P",
                "MEMRA_STEP_TP_BULK_P2P with MEMRA_MOE_DIRECT: peers store their expert partials at the root, \
                 so the moe_join has no copies to pack"
                    .into(),
            );
        }
        if d.bulk_p2p && self.transport != Transport::NativeP2p {
            return refuse(
                "MEMRA_STEP_TP_BULK_P2P",
                format!(
                    "MEMRA_STEP_TP_BULK_P2P with transport {}: the packed copy is one device-to-device copy (native-p2p)",
                    self.transport.name()
                ),
            );
        }
        Ok(())
    }

    /// Whether the routed experts run as NVFP4 banks.
    pub fn nvfp4_experts(&self) -> bool {
        self.doors.nvfp4_ep2 || self.expert_format == ExpertFormat::Nvfp4
    }
}

/// TP must be 1, 2, 4 or 8 (the canonical grid has 8 blocks).
pub fn check_tp(tp: usize) -> Result<(), RuntimeError> {
    if memra_kernels::grid::is_tp_size(tp) {
        Ok(())
    } else {
        Err(RuntimeError::UnsupportedTp { tp })
    }
}
