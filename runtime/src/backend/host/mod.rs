//! The host backend: every rank is a thread with a private arena, and runs the kernel twins.
//!
//! A rank thread executes the commands queued to it in order, like a CUDA stream. Nothing is
//! shared between arenas: a [`Backend::copy`](crate::backend::Backend::copy) queues a *send* on the source rank (after its
//! earlier work) and a *receive* on the destination rank (before its later work), so the only
//! cross-rank ordering is the one the program asks for. `host-bounce` moves the bytes through a
//! staging arena (a pool of host buffers standing in for pinned staging memory); `native-p2p`
//! hands them from arena to arena. Both only move bytes.
//!
//! No deadlock is possible: every receive waits for a send that was queued earlier in the single
//! issue order of the driver thread, and a send never waits.
//!
//! [`HostRanks::Inline`] runs every command on the issuing thread as it is issued instead. That is
//! one legal schedule of the same streams (each rank's work in its issue order; a receive after
//! the send it waits for, which was issued earlier), so every value is the same: the arenas are
//! private and copies carry the only cross-rank data. It exists for plans whose jobs already fill
//! the cores, where TP rank threads on a core each only add hand-offs (measured in
//! docs/gpu/2026-12-03-performance-history.md).
//!
//! `execute.rs` maps each op onto its twin on a rank's arena (with the coverage counters and
//! planted defects the twins' values feed), `rows.rs` spreads the large GEMVs of one launch over
//! all cores, and `backend.rs` is the [`Backend`](super::Backend) trait on these ranks: uploads, buffers, copies
//! over the transports, peer stores, digests, marks, rewind.

mod backend;
mod execute;
mod rows;
mod simd;

use super::{GroupEntry, Op, Slice};
use crate::backend::census::CensusCounter;
use crate::error::RuntimeError;
use crate::evidence::coverage::{self, Coverage, SeamPoint};
use crate::evidence::defect::TwinDefect;
use crate::model::matrix::MatrixShard;
use crate::Result;
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// One rank's private memory.
struct Arena {
    bufs: Vec<Vec<f32>>,
    weights: Vec<MatrixShard>,
    /// Expert groups: (routed experts, entries).
    groups: Vec<(usize, Vec<Option<GroupEntry>>)>,
    marks_ns: Vec<u64>,
    epoch: Instant,
    /// Coverage counters of the ops this rank ran (`coverage`), and the E4M3 code statistics of
    /// each weight, computed on first use.
    coverage: Coverage,
    code_stats: Vec<Option<(u64, u64, u64)>>,
}

/// What an op's execution observes besides its operands: where the program was when it was
/// issued (coverage's first places) and the planted twin defect, if any.
#[derive(Debug, Clone, Copy)]
struct Observe {
    at: Option<SeamPoint>,
    defect: Option<TwinDefect>,
}

impl Arena {
    fn new() -> Arena {
        Arena {
            bufs: Vec::new(),
            weights: Vec::new(),
            groups: Vec::new(),
            marks_ns: Vec::new(),
            epoch: Instant::now(),
            coverage: coverage::empty(),
            code_stats: Vec::new(),
        }
    }
}

type Command = Box<dyn FnOnce(&mut Arena) + Send>;

/// How the host backend's ranks run their work (docs/DESIGN.md §3.5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HostRanks {
    /// Every rank is a thread that runs its queue in issue order, beside the other ranks.
    #[default]
    Threads,
    /// Every command runs on the issuing thread when it is issued (one schedule of the same
    /// streams: the same values, no concurrency between ranks, no hand-offs).
    Inline,
}

impl HostRanks {
    pub fn name(self) -> &'static str {
        match self {
            HostRanks::Threads => "threads",
            HostRanks::Inline => "inline",
        }
    }
}

/// Where a rank's commands run.
enum Exec {
    /// Queued to the rank's thread; `None` once the backend is dropping.
    Thread { queue: Option<Sender<Command>>, thread: Option<JoinHandle<()>> },
    /// Run at once on the issuing thread. A command that panics poisons the arena's lock, so the
    /// rank then reads as dead, as a rank thread that panicked does.
    Inline(Mutex<Arena>),
}

struct RankWorker {
    exec: Exec,
    /// Driver-side copy of buffer lengths, so slices are checked before anything is queued.
    buf_lens: Vec<usize>,
    /// Driver-side storage names of the rank's weights and expert groups (census kernel names).
    weight_formats: Vec<&'static str>,
    group_formats: Vec<&'static str>,
}

impl RankWorker {
    fn n_weights(&self) -> usize {
        self.weight_formats.len()
    }
}

/// CPU ranks as threads with private arenas.
pub struct HostBackend {
    ranks: Vec<RankWorker>,
    mode: HostRanks,
    /// Bytes allocated in all arenas, and the most this process may take (the memory available
    /// at construction): an allocation beyond it is an out-of-memory error, never an abort.
    allocated_bytes: usize,
    memory_limit_bytes: usize,
    staging_pool: Arc<Mutex<Vec<Vec<f32>>>>,
    digests: Arc<Mutex<Vec<u64>>>,
    n_tickets: usize,
    /// What was issued (the census), where the program is, and the planted defect.
    census: CensusCounter,
    position: Option<SeamPoint>,
    defect: Option<TwinDefect>,
    /// Fault injection ([`HostBackend::corrupt_copies_up_to`]): cross-rank copies of at most this
    /// many bytes arrive with the lowest bit of their first element flipped.
    corrupt_up_to_bytes: usize,
}

impl HostBackend {
    /// `n_ranks` rank threads.
    pub fn new(n_ranks: usize) -> Result<HostBackend> {
        HostBackend::with_ranks(n_ranks, HostRanks::Threads)
    }

    /// `n_ranks` ranks run as `mode` says.
    pub fn with_ranks(n_ranks: usize, mode: HostRanks) -> Result<HostBackend> {
        crate::config::check_tp(n_ranks)?;
        let mut ranks = Vec::with_capacity(n_ranks);
        for r in 0..n_ranks {
            let exec = match mode {
                HostRanks::Inline => Exec::Inline(Mutex::new(Arena::new())),
                HostRanks::Threads => {
                    let (tx, rx) = channel::<Command>();
                    let thread = std::thread::Builder::new()
                        .name(format!("memra-rank{r}"))
                        .spawn(move || {
                            let mut arena = Arena::new();
                            for cmd in rx {
                                cmd(&mut arena);
                            }
                        })
                        .map_err(|e| RuntimeError::Unavailable(format!("cannot start host rank thread {r}: {e}")))?;
                    Exec::Thread { queue: Some(tx), thread: Some(thread) }
                }
            };
            ranks.push(RankWorker {
                exec,
                buf_lens: Vec::new(),
                weight_formats: Vec::new(),
                group_formats: Vec::new(),
            });
        }
        Ok(HostBackend {
            ranks,
            mode,
            allocated_bytes: 0,
            memory_limit_bytes: available_memory_bytes(),
            staging_pool: Arc::new(Mutex::new(Vec::new())),
            digests: Arc::new(Mutex::new(Vec::new())),
            n_tickets: 0,
            census: CensusCounter::new(n_ranks),
            position: None,
            defect: None,
            corrupt_up_to_bytes: 0,
        })
    }

    /// How this backend's ranks run.
    pub fn rank_mode(&self) -> HostRanks {
        self.mode
    }

    /// Fault injection: queue a command on `rank` that panics, as a kernel twin that panics
    /// would. The rank is dead afterwards (threads: from the next call that waits on it; inline:
    /// from this call on).
    pub fn inject_panic(&mut self, rank: usize) -> Result<()> {
        self.check_rank(rank)?;
        self.submit(
            rank,
            Box::new(move |_: &mut Arena| panic!("fault injection: a command on host rank {rank} panics")),
        )
    }

    fn submit(&self, rank: usize, cmd: Command) -> Result<()> {
        let dead = || RuntimeError::Device {
            location: format!("host rank {rank}"),
            detail: "the rank died (a kernel twin panicked); see stderr".into(),
        };
        match &self.ranks[rank].exec {
            Exec::Thread { queue, .. } => {
                queue.as_ref().expect("rank queue lives until drop").send(cmd).map_err(|_| dead())
            }
            Exec::Inline(arena) => {
                // A panic unwinds through the held guard, which poisons the lock: this rank's
                // later commands, reads and barriers then fail as a dead rank thread's do.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut a = arena.lock().map_err(|_| ())?;
                    cmd(&mut a);
                    Ok::<(), ()>(())
                }));
                match ran {
                    Ok(Ok(())) => Ok(()),
                    _ => Err(dead()),
                }
            }
        }
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        super::check_rank(rank, self.ranks.len())
    }

    fn check_slice(&self, rank: usize, s: Slice, what: &str) -> Result<()> {
        self.check_rank(rank)?;
        let lens = &self.ranks[rank].buf_lens;
        match lens.get(s.buf as usize) {
            Some(&len) if s.offset + s.len <= len => Ok(()),
            Some(&len) => Err(RuntimeError::Contract(format!(
                "{what}: slice {}+{} of buffer {} on rank {rank} exceeds its {len} elements",
                s.offset, s.len, s.buf
            ))),
            None => Err(RuntimeError::Contract(format!("{what}: buffer {} does not exist on rank {rank}", s.buf))),
        }
    }

    fn check_op(&self, rank: usize, op: &Op) -> Result<()> {
        self.check_op_at(rank, op, rank)
    }

    /// Like `check_op`, with the op's store target (listed last by `op_slices`) checked on
    /// `target_rank` (a peer store's destination).
    fn check_op_at(&self, rank: usize, op: &Op, target_rank: usize) -> Result<()> {
        let name = op.name();
        let slices = op.slices();
        let n = slices.len();
        for (i, s) in slices.into_iter().enumerate() {
            let at = if i + 1 == n && op.store_target().is_some() { target_rank } else { rank };
            self.check_slice(at, s, name)?;
        }
        match op {
            Op::GemvRows { w, .. } | Op::GemvPartials { w, .. } if *w as usize >= self.ranks[rank].n_weights() => {
                Err(RuntimeError::Contract(format!("{name}: weight {w} does not exist on rank {rank}")))
            }
            Op::GemvRowsBatch { items, .. } if items.iter().any(|i| i.0 as usize >= self.ranks[rank].n_weights()) => {
                Err(RuntimeError::Contract(format!("{name}: a weight of {items:?} does not exist on rank {rank}")))
            }
            Op::ExpertGateUp { group, .. }
            | Op::ExpertGateUpRows { group, .. }
            | Op::ExpertDown { group, .. }
            | Op::FoldSlots { scales: Some(group), .. }
            | Op::ExpertDownCombine { group, .. }
                if *group as usize >= self.ranks[rank].group_formats.len() =>
            {
                Err(RuntimeError::Contract(format!("{name}: expert group {group} does not exist on rank {rank}")))
            }
            Op::SetU32 { out: pos, .. }
            | Op::QkNormRopeAt { pos, .. }
            | Op::AttentionAt { pos, .. }
            | Op::AttentionRows { pos, .. }
            | Op::IncU32 { out: pos, .. }
            | Op::AppendAt { pos, .. }
            | Op::RopeAppend { pos, .. }
                if pos.len == 0 =>
            {
                Err(RuntimeError::Contract(format!("{name}: the position slice is empty; it must hold one u32")))
            }
            Op::MirrorSel { src, out } if src.len != out.len => Err(RuntimeError::Contract(format!(
                "{name}: a mirror copies bit for bit, but its source has {} elements and its destination {}",
                src.len, out.len
            ))),
            _ => Ok(()),
        }
    }

    /// Fault injection: from now on every cross-rank copy of at most `bytes` bytes arrives with the
    /// lowest bit of its first element flipped — a transport that breaks small payloads (route
    /// ids, one rank's share of a row) while every large copy is intact. 0 turns it off.
    pub fn corrupt_copies_up_to(&mut self, bytes: usize) {
        self.corrupt_up_to_bytes = bytes;
    }

    /// The census name of `op`'s kernel on `rank` (checked ops only).
    fn kernel(&self, rank: usize, op: &Op) -> String {
        let w = &self.ranks[rank];
        op.kernel(
            |id| w.weight_formats.get(id as usize).copied().unwrap_or("unknown"),
            |g| w.group_formats.get(g as usize).copied().unwrap_or("unknown"),
        )
    }

    /// The planted defect as it applies to `op` (counted in the census when it does).
    fn defect_for(&mut self, op: &Op) -> Option<TwinDefect> {
        let d = self.defect?;
        let applies = match d {
            TwinDefect::RouterTiesToHigherId => matches!(op, Op::Router { device_variant: false, .. }),
            TwinDefect::SumsFromNegativeZero => {
                matches!(op, Op::GemvRows { .. } | Op::GemvRowsBatch { .. } | Op::GemvPartials { .. } | Op::Fold { .. })
            }
            TwinDefect::SiluUnclamped => matches!(op, Op::ExpertGateUp { .. }),
        };
        if applies {
            self.census.mechanism(&format!("defect.{}", d.name()), 1);
        }
        applies.then_some(d)
    }

    /// Wait until every rank has executed everything queued so far.
    fn barrier(&self) -> Result<Vec<Vec<u64>>> {
        let mut replies = Vec::new();
        for r in 0..self.ranks.len() {
            let (tx, rx) = sync_channel::<Vec<u64>>(1);
            self.submit(
                r,
                Box::new(move |a: &mut Arena| {
                    let _ = tx.send(std::mem::take(&mut a.marks_ns));
                }),
            )?;
            replies.push(rx);
        }
        replies
            .into_iter()
            .enumerate()
            .map(|(r, rx)| {
                rx.recv().map_err(|_| RuntimeError::Device {
                    location: format!("host rank {r}"),
                    detail: "the rank thread died before reaching the barrier (a kernel twin panicked)".into(),
                })
            })
            .collect()
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        for w in &mut self.ranks {
            if let Exec::Thread { queue, thread } = &mut w.exec {
                queue.take();
                if let Some(t) = thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}

/// `MemAvailable` of /proc/meminfo (all of the address space where it cannot be read).
pub(crate) fn available_memory_bytes() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map(|kib| kib.saturating_mul(1024))
        .unwrap_or(usize::MAX)
}

fn read_slice(a: &Arena, s: Slice) -> &[f32] {
    &a.bufs[s.buf as usize][s.offset..s.offset + s.len]
}

fn write_slice(a: &mut Arena, s: Slice, data: &[f32]) {
    a.bufs[s.buf as usize][s.offset..s.offset + s.len].copy_from_slice(data);
}
