//! Where the time of a plan goes (docs/DESIGN.md §8): each configuration's time split into
//! phases — uploading weights, computing references it is the first to need, running it, the
//! probe, and the gates (everything else) — as it runs, so progress can say what every worker is
//! doing now and each receipt can carry its phase times (`measurements.extra.phase_*_ms`).
//!
//! Work is attributed to the thread that does it: a worker opens an activity for its job, and
//! every run of the subject on that thread switches the phase (the pool reports when it starts
//! and stops uploading). Work outside a job (the plan's oracle) is timed by its caller.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Instant;

/// A phase of a plan's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Generating or reading the model (once per process).
    Generate,
    /// Opening a backend and placing the weights (once per backend, options and layout).
    Upload,
    /// Reference runs: the oracle, the CUDA TP1 baseline, class baselines, captured oracles.
    Oracle,
    /// The configuration's own runs (the determinism re-run and localisation included).
    Run,
    /// The native-P2P byte-integrity probe.
    Probe,
    /// Comparing records, building and writing the receipt.
    Gates,
}

impl Phase {
    /// The phases a job's time is split into, in receipt order.
    pub const JOB: [Phase; 5] = [Phase::Upload, Phase::Oracle, Phase::Run, Phase::Probe, Phase::Gates];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Generate => "generate",
            Phase::Upload => "upload",
            Phase::Oracle => "oracle",
            Phase::Run => "run",
            Phase::Probe => "probe",
            Phase::Gates => "gates",
        }
    }

    /// The receipt's `measurements.extra` key of this phase's milliseconds.
    pub fn key(self) -> String {
        format!("phase_{}_ms", self.name())
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Milliseconds per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes([f64; 6]);

impl PhaseTimes {
    pub fn get(&self, p: Phase) -> f64 {
        self.0[p.index()]
    }
    fn add(&mut self, p: Phase, ms: f64) {
        self.0[p.index()] += ms;
    }
}

/// What one worker thread is doing.
struct Activity {
    label: String,
    phase: Phase,
    since: Instant,
    started: Instant,
    times: PhaseTimes,
}

impl Activity {
    fn close_phase(&mut self) {
        let now = Instant::now();
        self.times.add(self.phase, now.duration_since(self.since).as_secs_f64() * 1e3);
        self.since = now;
    }
}

/// What a worker is doing now, for progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Now {
    pub label: String,
    pub phase: Phase,
    /// Seconds in this phase, and since the job began.
    pub phase_s: f64,
    pub job_s: f64,
}

/// The activities of every worker thread.
#[derive(Default)]
pub struct Activities {
    map: Mutex<HashMap<ThreadId, Activity>>,
}

impl Activities {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ThreadId, Activity>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This thread starts a job (in the gates phase until a run switches it).
    pub fn begin(&self, label: String) {
        let now = Instant::now();
        let a = Activity { label, phase: Phase::Gates, since: now, started: now, times: PhaseTimes::default() };
        self.lock().insert(std::thread::current().id(), a);
    }

    /// Switch this thread's job to `phase`; returns the phase it was in (`None`: no job here).
    pub fn enter(&self, phase: Phase) -> Option<Phase> {
        let mut map = self.lock();
        let a = map.get_mut(&std::thread::current().id())?;
        a.close_phase();
        Some(std::mem::replace(&mut a.phase, phase))
    }

    /// This thread's job ends: its phase times.
    pub fn end(&self) -> PhaseTimes {
        match self.lock().remove(&std::thread::current().id()) {
            Some(mut a) => {
                a.close_phase();
                a.times
            }
            None => PhaseTimes::default(),
        }
    }

    /// Every job running now, the longest running first.
    pub fn now(&self) -> Vec<Now> {
        let t = Instant::now();
        let mut v: Vec<(Instant, Now)> = self
            .lock()
            .values()
            .map(|a| {
                let now = Now {
                    label: a.label.clone(),
                    phase: a.phase,
                    phase_s: t.duration_since(a.since).as_secs_f64(),
                    job_s: t.duration_since(a.started).as_secs_f64(),
                };
                (a.started, now)
            })
            .collect();
        v.sort_by_key(|(s, _)| *s);
        v.into_iter().map(|(_, n)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn phases_add_up_to_the_job_and_nest() {
        let a = Activities::default();
        assert_eq!(a.enter(Phase::Run), None, "no job on this thread");
        a.begin("host TP2".into());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(a.enter(Phase::Run), Some(Phase::Gates));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(a.enter(Phase::Upload), Some(Phase::Run));
        let now = a.now();
        assert_eq!((now.len(), now[0].phase, now[0].label.as_str()), (1, Phase::Upload, "host TP2"));
        std::thread::sleep(Duration::from_millis(40));
        a.enter(Phase::Run);
        a.enter(Phase::Gates);
        let t = a.end();
        assert!(t.get(Phase::Gates) >= 20.0 && t.get(Phase::Run) >= 30.0 && t.get(Phase::Upload) >= 40.0, "{t:?}");
        assert_eq!(t.get(Phase::Oracle), 0.0);
        assert!(a.now().is_empty(), "the job ended");
        assert_eq!(Phase::Upload.key(), "phase_upload_ms");
    }
}
