//! Weights placed once, run many times (docs/DESIGN.md §8): [`prepare`] uploads a model to a
//! backend for a [`Layout`] — what decides which shard of which weight sits on which rank, in
//! which storage — and [`super::run_prepared`] decodes a battery on it as often as asked, each
//! run on fresh activation buffers with the backend rewound to the state right after the upload
//! ([`Backend::rewind`]): no run sees another's buffers, marks, graph segments or counters.
//!
//! A run's configuration must ask for exactly the prepared layout; any other door value (the
//! transport, the joins, the canaries, the captures…) changes only what the program issues, never
//! what the ranks hold.

use super::placement::Placement;
use super::weights::{self, Uploaded};
use crate::backend::{Backend, Checkpoint};
use crate::config::{DoorSet, RunConfig, Tp};
use crate::error::RuntimeError;
use crate::model::Model;
use crate::Result;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What the ranks hold for a run: the TP size, the doors that change the stored weights or their
/// placement, the expert storage, and the RoPE rows uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    pub tp: Tp,
    /// F32_MIRROR: BF16 shards stored widened.
    pub f32_mirror: bool,
    /// W8: attention projections stored as their int8 mirror.
    pub w8: bool,
    /// STEP_EP: whole experts on owner ranks.
    pub step_ep: bool,
    /// NVFP4_EP2: NVFP4 experts interleaved over two owners.
    pub nvfp4_ep2: bool,
    /// Routed experts stored as NVFP4 banks.
    pub nvfp4_experts: bool,
    /// RoPE rows in the parameter buffer (the battery's longest prompt, at most the cache).
    pub positions: usize,
}

impl Layout {
    /// The layout a run configuration needs.
    pub fn of(cfg: &RunConfig) -> Layout {
        let d = &cfg.doors;
        let positions = (0..cfg.battery.prompts.len()).map(|i| cfg.battery.steps_of(i)).max().unwrap_or(1);
        Layout {
            tp: cfg.tp,
            f32_mirror: d.f32_mirror,
            w8: d.w8,
            step_ep: d.step_ep,
            nvfp4_ep2: d.nvfp4_ep2,
            nvfp4_experts: cfg.nvfp4_experts(),
            positions,
        }
    }

    /// The door values the upload reads (every other door at its default).
    fn doors(&self) -> DoorSet {
        DoorSet {
            f32_mirror: self.f32_mirror,
            w8: self.w8,
            step_ep: self.step_ep,
            nvfp4_ep2: self.nvfp4_ep2,
            ..DoorSet::default()
        }
    }
}

/// A model placed on a backend's ranks for one [`Layout`].
#[derive(Debug)]
pub struct Prepared {
    pub layout: Layout,
    pub(super) placement: Placement,
    pub(super) uploaded: Uploaded,
    /// The backend right after the upload; `None` where it cannot rewind (one run only).
    checkpoint: Option<Checkpoint>,
    /// Runs started on it.
    runs: AtomicUsize,
}

impl Prepared {
    /// Bytes the upload placed on the ranks (all ranks together).
    pub fn bytes(&self) -> u64 {
        self.uploaded.bytes
    }

    /// Before a run: rewind the backend to the upload (nothing to undo before the first run).
    pub(super) fn begin_run(&self, b: &mut dyn Backend) -> Result<()> {
        let earlier = self.runs.fetch_add(1, Ordering::SeqCst);
        match &self.checkpoint {
            Some(cp) => b.rewind(cp),
            None if earlier == 0 => {
                b.first_run_begins();
                Ok(())
            }
            None => Err(RuntimeError::Unsupported {
                backend: b.describe(),
                mechanism: "rewind",
                rule: format!(
                    "{}: this backend cannot rewind, so its prepared weights serve one run only (prepare again)",
                    b.describe()
                ),
            }),
        }
    }
}

/// Place `model` on the ranks of `b` for `layout`: the placement, every weight shard, the
/// parameter buffers and the expert groups.
pub fn prepare(model: &Model, layout: Layout, b: &mut dyn Backend) -> Result<Prepared> {
    if b.ranks() != layout.tp.get() {
        return Err(RuntimeError::Contract(format!(
            "the backend has {} ranks but the layout asks for TP {}",
            b.ranks(),
            layout.tp
        )));
    }
    model.config.validate()?;
    let doors = layout.doors();
    let placement = Placement::new(model, layout.tp, &doors, layout.nvfp4_experts)?;
    let uploaded = weights::upload(b, model, &placement, &doors, layout.nvfp4_experts, layout.positions)?;
    Ok(Prepared { layout, placement, uploaded, checkpoint: b.checkpoint(), runs: AtomicUsize::new(0) })
}
