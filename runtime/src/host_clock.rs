//! Where a run's host time goes (docs/gpu: the night is host-bound): wall time and calls per
//! backend entry point and per raw driver call, summed over the whole process, for a measurement
//! run. Off unless [`enable`]d (`run` does under `MEMRA_HOST_CLOCK=1`, a setting of
//! gates/doors.toml read where every setting is; off, every timer is one load and a branch);
//! [`report`] gives the table, which `run` prints at the end.
//!
//! Each timer reads the clock twice. Where that read is a system call rather than the vDSO (the
//! lent H100's virtual machine, 2026-12-06: a night shard took 123 s timed against 70 s untimed),
//! the µs per call are inflated by about a microsecond: read the table as shares of the run, and
//! time the plan untimed.
//!
//! The entries nest: `run` (a whole `program::run_prepared`) holds every backend entry point of
//! that run, and the backend's `launch` holds `driver launch` (the `cuLaunchKernelEx` alone) and
//! `bind` (making the stream's context current). So `run` minus the backend entries is the
//! program's own host work, and `launch` minus `driver launch` the launch's own packing and
//! bookkeeping.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// What a timer measures.
#[derive(Debug, Clone, Copy)]
pub enum Entry {
    Run,
    Launch,
    LaunchLanes,
    Copy,
    Read,
    Write,
    Digest,
    Mark,
    Collect,
    PeerStore,
    CopyPacked,
    AllReduce,
    CopyUnfenced,
    Rewind,
    Alloc,
    Upload,
    DriverLaunch,
    Bind,
    Sync,
}

const N: usize = 19;
const NAMES: [&str; N] = [
    "run (program::run_prepared)",
    "launch",
    "launch_lanes",
    "copy",
    "read (synchronizes)",
    "write",
    "digest",
    "mark",
    "collect (end of step)",
    "peer store",
    "copy_packed",
    "all_reduce",
    "copy_unfenced",
    "rewind",
    "alloc",
    "upload_weight",
    "  driver launch (cuLaunchKernelEx)",
    "  bind (context current)",
    "  stream synchronize",
];

static NS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static CALLS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

static ON: AtomicBool = AtomicBool::new(false);

/// Time every run of this process from now on.
pub fn enable() {
    ON.store(true, Relaxed);
}

fn on() -> bool {
    ON.load(Relaxed)
}

/// A running timer: adds its elapsed time to its entry when dropped.
pub struct Timer(Option<(Entry, Instant)>);

/// Start timing `e` (nothing when the clock is off).
pub fn start(e: Entry) -> Timer {
    Timer(on().then(|| (e, Instant::now())))
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((e, t)) = self.0 {
            NS[e as usize].fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
            CALLS[e as usize].fetch_add(1, Relaxed);
        }
    }
}

/// The table of every entry that was called: calls, total ms, µs per call (None when off, or when
/// nothing ran in this process — `run --worker-processes` ran its runs in the workers, whose logs
/// hold their tables).
pub fn report() -> Option<String> {
    if !on() || CALLS.iter().all(|c| c.load(Relaxed) == 0) {
        return None;
    }
    let mut s =
        format!("{:<36} {:>10} {:>11} {:>9}\n", "host clock (MEMRA_HOST_CLOCK)", "calls", "total ms", "µs/call");
    for (i, name) in NAMES.iter().enumerate() {
        let (ns, calls) = (NS[i].load(Relaxed), CALLS[i].load(Relaxed));
        if calls > 0 {
            let ms = ns as f64 / 1e6;
            s += &format!("{name:<36} {calls:>10} {ms:>11.1} {:>9.2}\n", ms * 1e3 / calls as f64);
        }
    }
    Some(s)
}
