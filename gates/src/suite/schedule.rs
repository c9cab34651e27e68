//! Scheduling a suite's jobs: host jobs on `workers` threads (the host backend's ranks are
//! threads; several jobs fill the cores), CUDA jobs one at a time; receipts written as each job
//! finishes (so an interrupted matrix loses no finished receipt), complete receipts kept under
//! `--resume`, and progress while it runs — a line rewritten every second on a terminal, a plain
//! line at a steady interval elsewhere (a CI log must not stay silent for an hour) — each naming
//! what every worker runs now and in which phase (upload, oracle, run, probe, gates).
//!
//! Jobs run grouped by the weights they need (backend, TP, the doors that change the stored
//! weights, the backend options), so a prepared backend serves a run of consecutive jobs; the
//! receipts still come back in job order.

use super::Suite;
use crate::job::Job;
use memra_receipts::schema::Verdict;
use memra_receipts::Receipt;
use memra_runtime::backend::BackendKind;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Off,
    /// A line rewritten in place per finished job (stderr is a terminal).
    Terminal,
    /// A plain line every `every` (stderr is a log).
    Lines {
        every: Duration,
    },
}

/// A receipt that could not be written.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteFailure {
    pub path: PathBuf,
    pub error: String,
}

/// What running a suite produced.
#[derive(Debug)]
pub struct SuiteRun {
    /// One receipt per job, in job order.
    pub receipts: Vec<Receipt>,
    /// Receipts that could not be written to the output directory (the run must not pass).
    pub write_failures: Vec<WriteFailure>,
    /// Jobs whose complete receipt was already in the output directory (`--resume`).
    pub kept: usize,
}

/// Counts shared between the workers and the progress printer.
struct Tally {
    finished: AtomicUsize,
    failed: AtomicUsize,
    total: usize,
    start: Instant,
}

impl Tally {
    fn line(&self, now: &[super::phases::Now]) -> String {
        let n = self.finished.load(Ordering::SeqCst);
        let elapsed = self.start.elapsed().as_secs_f64();
        let eta = if n == 0 { "unknown".to_string() } else { clock(elapsed / n as f64 * (self.total - n) as f64) };
        let mut line = format!(
            "{n}/{} done · {} FAIL/VOID/ERROR so far · elapsed {} · ETA {eta}",
            self.total,
            self.failed.load(Ordering::SeqCst),
            clock(elapsed)
        );
        if !now.is_empty() {
            let doing: Vec<String> = now.iter().map(describe_now).collect();
            line.push_str(&format!(" · now: {}", doing.join("; ")));
        }
        line
    }
}

/// `host TP2 host-bounce defaults: upload 12s (job 40s)`.
fn describe_now(n: &super::phases::Now) -> String {
    format!("{}: {} {} (job {})", n.label, n.phase.name(), clock(n.phase_s), clock(n.job_s))
}

/// The order jobs run in: grouped by backend, TP, the doors that decide the stored weights and
/// the backend options, smaller door sets first inside a group (a job's gated run is the census
/// baseline of its supersets); stable, so job order is kept otherwise.
fn run_order(jobs: &[Job]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| {
        let j = &jobs[i];
        let d = &j.doors;
        (j.backend, j.tp, d.f32_mirror, d.w8, d.step_ep, d.nvfp4_ep2, d.nvfp4_banks(), d.rank0_merge, j.doors_env.len())
    });
    order
}

/// `1h02m03s`, `4m05s`, `6s`.
pub fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, sec) => format!("{h}h{m:02}m{sec:02}s"),
    }
}

impl Suite<'_> {
    /// Complete receipts already in the output directory (under `--resume`), by run id.
    fn resumable(&self) -> BTreeMap<String, Verdict> {
        let (Some(dir), true) = (&self.opts.out_dir, self.opts.resume) else { return BTreeMap::new() };
        match memra_receipts::store::scan_dir(dir) {
            Ok(scan) => {
                // Temp files are writes a killed run never renamed into place: garbage.
                for t in &scan.temp_files {
                    eprintln!("memra-gates: --resume removes an unfinished write {}", t.display());
                    let _ = std::fs::remove_file(t);
                }
                for b in &scan.broken {
                    eprintln!("memra-gates: --resume re-runs a receipt that does not read: {b}");
                }
                scan.complete()
            }
            Err(_) => BTreeMap::new(),
        }
    }

    /// Run every job and return the receipts in job order. Receipts are written as each job
    /// finishes; a receipt that cannot be written is reported in [`SuiteRun::write_failures`].
    pub fn run_all(&self, jobs: &[Job]) -> SuiteRun {
        let done = self.resumable();
        let results: Vec<Mutex<Option<Receipt>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
        let failures: Mutex<Vec<WriteFailure>> = Mutex::new(Vec::new());
        let kept = AtomicUsize::new(0);
        let next = AtomicUsize::new(0);
        let order = run_order(jobs);
        let tally = Tally {
            finished: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            total: jobs.len(),
            start: Instant::now(),
        };
        let work = |host_only: bool| loop {
            let k = next.fetch_add(1, Ordering::SeqCst);
            if k >= jobs.len() {
                break;
            }
            let i = order[k];
            let job = &jobs[i];
            if host_only != (job.backend == BackendKind::Host) {
                continue;
            }
            let receipt = self.receipt_of(job, &done, &kept, &failures);
            if matches!(receipt.evidence.verdict, Verdict::Fail | Verdict::Void | Verdict::Error) {
                tally.failed.fetch_add(1, Ordering::SeqCst);
            }
            tally.finished.fetch_add(1, Ordering::SeqCst);
            *results[i].lock().expect("result slot") = Some(receipt);
        };
        let stop = (Mutex::new(false), Condvar::new());
        let (tally, stop) = (&tally, &stop);
        std::thread::scope(|s| {
            let acts = &self.activities;
            match self.opts.progress {
                Progress::Lines { every } => {
                    s.spawn(move || {
                        progress_lines(tally, every, stop, |t| {
                            let _ = writeln!(std::io::stderr(), "memra-gates: progress {}", t.line(&acts.now()));
                        })
                    });
                }
                Progress::Terminal => {
                    s.spawn(move || {
                        progress_lines(tally, Duration::from_secs(1), stop, |t| {
                            eprint!("\r{:<150}", truncate(&t.line(&acts.now()), 150));
                        })
                    });
                }
                Progress::Off => {}
            }
            std::thread::scope(|w| {
                for _ in 0..self.opts.workers.max(1) {
                    w.spawn(|| work(true));
                }
            });
            next.store(0, Ordering::SeqCst);
            work(false);
            *stop.0.lock().expect("progress stop") = true;
            stop.1.notify_all();
        });
        if self.opts.progress == Progress::Terminal {
            eprintln!("\r{:<150}", truncate(&tally.line(&[]), 150));
        }
        SuiteRun {
            receipts: results
                .into_iter()
                .map(|m| m.into_inner().expect("result slot").expect("every job ran"))
                .collect(),
            write_failures: failures.into_inner().expect("write failures"),
            kept: kept.into_inner(),
        }
    }

    /// The job's receipt: kept from the output directory under `--resume`, else evaluated and
    /// written.
    fn receipt_of(
        &self,
        job: &Job,
        done: &BTreeMap<String, Verdict>,
        kept: &AtomicUsize,
        failures: &Mutex<Vec<WriteFailure>>,
    ) -> Receipt {
        let id = memra_receipts::run_id(&self.config_evidence(job));
        if let (true, Some(dir)) = (done.contains_key(&id), &self.opts.out_dir) {
            if let Ok(r) = memra_receipts::json::read_receipt(&memra_receipts::store::receipt_path(dir, &id)) {
                kept.fetch_add(1, Ordering::SeqCst);
                return r;
            }
        }
        let receipt = self.evaluate(job);
        if let Some(dir) = &self.opts.out_dir {
            if let Err(e) = memra_receipts::store::write_receipt(dir, &receipt) {
                let path = memra_receipts::store::receipt_path(dir, &receipt.run_id);
                eprintln!("memra-gates: cannot write the receipt of {}: {e}", receipt.label());
                failures.lock().expect("write failures").push(WriteFailure { path, error: e.to_string() });
            }
        }
        receipt
    }
}

/// Call `show(tally)` every `every` until `stop` is set.
fn progress_lines(tally: &Tally, every: Duration, stop: &(Mutex<bool>, Condvar), show: impl Fn(&Tally)) {
    let (lock, cvar) = stop;
    let mut stopped = lock.lock().expect("progress stop");
    loop {
        let (guard, timeout) = cvar.wait_timeout(stopped, every).expect("progress stop");
        stopped = guard;
        if *stopped {
            return;
        }
        if timeout.timed_out() {
            show(tally);
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}
