//! `matrix --explain --history DIR…`: how long a plan would take, from the receipts of earlier
//! runs (docs/DESIGN.md §8).
//!
//! A receipt's wall time mixes the configuration's own work with work a plan does once: the
//! first job to need a reference computes it, the first job on a weight layout uploads it. Where
//! the receipts carry phase times (`measurements.extra.phase_*_ms`) the estimate keeps them
//! apart: each configuration costs its own time (wall − upload, its census and class baselines
//! included), each distinct weight layout of the plan one upload, and the plan once what an
//! earlier run spent generating the model and its oracle. Host configurations share the cores; CUDA ones run one at a
//! time. Receipts without phase times count their whole wall time per configuration.
//!
//! Nothing is invented: every figure is a mean (configuration times, which
//! add up) or a median (uploads, one-off work) of measured receipts, the output names the
//! directories and the model they came from, a history that mixes models or workloads is refused,
//! and configurations of a backend the history never ran are reported as not estimated.

use crate::error::GateError;
use crate::matrix::Configuration;
use crate::registry::{BackendKind, Registry};
use memra_receipts::{Receipt, ReceiptKind, Verdict};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// One earlier configuration's times.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub config: Configuration,
    /// Which history directory (one earlier run) it came from.
    pub run: usize,
    pub wall_ms: f64,
    /// `measurements.extra` of the receipt.
    pub extra: BTreeMap<String, f64>,
}

impl Sample {
    fn get(&self, key: &str) -> Option<f64> {
        self.extra.get(key).copied()
    }
    /// The configuration's own time: its wall time less the weight upload and the byte-integrity
    /// probe it did first (uploads are counted once per layout, probes once per backend, TP size
    /// and transport: a shard's first job of a lane probes it, and a mean over the shard's jobs
    /// spread that probe over the whole plan's lane — 4 of the 61 minutes estimated for `--matrix
    /// all` from an eighth of it on one H200, 2026-12-01). Its references (`phase_oracle_ms`: census and class
    /// baselines) stay in: they are runs of door combinations of its own — counting them once per
    /// plan made a shard of `--matrix all` on CUDA estimate the whole plan 4× too short (measured
    /// on one H200, 2026-12-01: 27 min estimated, 81 configurations per 150 s measured).
    fn own_ms(&self) -> f64 {
        (self.wall_ms - self.get("phase_upload_ms").unwrap_or(0.0) - self.get("phase_probe_ms").unwrap_or(0.0)).max(0.0)
    }
}

/// Census baseline runs per backend: how many the plan needs, and how many the history's runs
/// needed (`crate::suite::unshared_baselines` of each run's own configurations). A shard needs
/// several times a whole night's count per configuration — the set that provides a neighbour's
/// baseline often lands in another shard (shard 7/200 of tiny's CUDA plan: 355 for 103
/// configurations; the whole plan: 6,672 for 20,240) — so the history's baseline time is a cost
/// per baseline run, and the plan pays its own count. Empty: baselines stay in each
/// configuration's own time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BaselineRuns {
    pub plan: BTreeMap<BackendKind, usize>,
    pub history: BTreeMap<BackendKind, usize>,
}

/// Census baselines per backend among `jobs` that none of their own runs provides.
pub fn baselines_by_backend(jobs: &[crate::job::Job]) -> BTreeMap<BackendKind, usize> {
    let backends: BTreeSet<BackendKind> = jobs.iter().map(|j| j.backend).collect();
    backends
        .into_iter()
        .map(|b| {
            let of_b: Vec<crate::job::Job> = jobs.iter().filter(|j| j.backend == b).cloned().collect();
            (b, crate::suite::unshared_baselines(&of_b))
        })
        .collect()
}

/// The configurations of `plan` that run, and per backend the census baselines no configuration's
/// own run provides (`matrix --explain`'s count of a plan, of each worker's part, of a history).
pub fn runs_of(
    registry: &Registry,
    plan: &crate::matrix::MatrixPlan,
    request: &crate::env::DoorRequest,
) -> Result<(usize, BTreeMap<BackendKind, usize>), GateError> {
    let jobs = crate::plan::jobs_of(registry, plan, request, 1, None)?;
    let runnable = jobs.iter().filter(|j| j.not_run.is_none()).count();
    Ok((runnable, baselines_by_backend(&jobs)))
}

/// The estimate of a plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Estimate {
    /// Configuration time of host and CUDA configurations (ms), uploads included.
    pub host_ms: f64,
    pub cuda_ms: f64,
    /// Weight layouts the plan uploads, and what they cost (ms, inside host/cuda).
    pub uploads: usize,
    pub upload_ms: f64,
    /// Lanes (backend, TP, transport) the plan probes, and what they cost (ms, inside host/cuda).
    pub probes: usize,
    pub probe_ms: f64,
    /// Once per plan: model generation and reference runs (ms).
    pub once_ms: f64,
    /// Census baseline runs the plan needs where the history says what one costs, and their time
    /// (ms, inside host/cuda).
    pub baselines: usize,
    pub baseline_ms: f64,
    /// Configurations estimated from their own history, from their (backend, TP), from all of
    /// their backend's receipts.
    pub seen: usize,
    pub by_class: usize,
    pub by_all: usize,
    /// Configurations of a backend the history holds no receipt of: not estimated.
    pub unestimated: BTreeMap<BackendKind, usize>,
}

impl Estimate {
    /// Wall time with host configurations spread over `cores`.
    pub fn wall_ms(&self, cores: usize) -> f64 {
        self.once_ms + self.host_ms / cores.max(1) as f64 + self.cuda_ms
    }
}

/// The mean: a plan's duration is a sum of configuration times, and n draws sum to n × mean
/// (the median of a skewed distribution undercounts it).
fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len().checked_sub(1)? / 2).copied()
}

/// The weights a configuration needs: backend, TP, the doors that change the stored weights or
/// their placement, and the backend options (a configuration whose doors do not map counts as
/// its own layout).
fn layout_key(registry: &Registry, c: &Configuration) -> (BackendKind, usize, String) {
    let doors = match registry.to_door_set(&c.doors, None) {
        Ok(d) => format!("{}{}{}{}{}{}", d.f32_mirror, d.w8, d.step_ep, d.nvfp4_ep2, d.nvfp4_banks(), d.rank0_merge),
        Err(_) => c.doors.iter().cloned().collect::<Vec<_>>().join(","),
    };
    (c.backend, c.tp, doors)
}

/// Estimate running `legal` from `history`.
pub fn estimate(registry: &Registry, legal: &[Configuration], history: &[Sample], runs: &BaselineRuns) -> Estimate {
    // The history's baseline time per backend, per baseline run where its count is known.
    let mut oracle: BTreeMap<BackendKind, f64> = BTreeMap::new();
    for s in history {
        *oracle.entry(s.config.backend).or_default() += s.get("phase_oracle_ms").unwrap_or(0.0);
    }
    let unit: BTreeMap<BackendKind, f64> = oracle
        .iter()
        .filter_map(|(b, ms)| {
            let n = runs.history.get(b).copied().unwrap_or(0);
            (n > 0 && *ms > 0.0).then(|| (*b, ms / n as f64))
        })
        .collect();
    let mut by_config: BTreeMap<&Configuration, Vec<f64>> = BTreeMap::new();
    let mut by_class: BTreeMap<(BackendKind, usize), Vec<f64>> = BTreeMap::new();
    let mut uploads: BTreeMap<(BackendKind, usize), Vec<f64>> = BTreeMap::new();
    let mut probes: BTreeMap<(BackendKind, usize), Vec<f64>> = BTreeMap::new();
    let mut once: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for s in history {
        let baselines =
            if unit.contains_key(&s.config.backend) { s.get("phase_oracle_ms").unwrap_or(0.0) } else { 0.0 };
        let own = (s.own_ms() - baselines).max(0.0);
        by_config.entry(&s.config).or_default().push(own);
        by_class.entry((s.config.backend, s.config.tp)).or_default().push(own);
        if let Some(u) = s.get("phase_upload_ms").filter(|u| *u > 0.0) {
            uploads.entry((s.config.backend, s.config.tp)).or_default().push(u);
        }
        if let Some(p) = s.get("phase_probe_ms").filter(|p| *p > 0.0) {
            probes.entry((s.config.backend, s.config.tp)).or_default().push(p);
        }
        // Per earlier run: its one-off work (the same plan-level values on each of its receipts).
        let plan = s.get("phase_generate_ms").unwrap_or(0.0) + s.get("phase_plan_oracle_ms").unwrap_or(0.0);
        let e = once.entry(s.run).or_insert((0.0, 0.0));
        e.0 = e.0.max(plan);
    }
    // A backend's overall median stands in only for its own configurations: host times say
    // nothing about a GPU.
    let of_backend = |m: &BTreeMap<(BackendKind, usize), Vec<f64>>, b: BackendKind| -> Vec<f64> {
        m.iter().filter(|((k, _), _)| *k == b).flat_map(|(_, v)| v.iter().copied()).collect()
    };
    let mut est = Estimate::default();
    for c in legal {
        let own = if let Some(m) = by_config.get(c).and_then(|v| mean(v)) {
            est.seen += 1;
            m
        } else if let Some(m) = by_class.get(&(c.backend, c.tp)).and_then(|v| mean(v)) {
            est.by_class += 1;
            m
        } else if let Some(m) = mean(&of_backend(&by_class, c.backend)) {
            est.by_all += 1;
            m
        } else {
            *est.unestimated.entry(c.backend).or_default() += 1;
            continue;
        };
        match c.backend {
            BackendKind::Host => est.host_ms += own,
            BackendKind::Cuda => est.cuda_ms += own,
        }
    }
    let layouts: BTreeSet<_> = legal.iter().map(|c| layout_key(registry, c)).collect();
    for (backend, tp, _) in &layouts {
        let Some(u) =
            uploads.get(&(*backend, *tp)).and_then(|v| median(v)).or_else(|| median(&of_backend(&uploads, *backend)))
        else {
            continue;
        };
        est.uploads += 1;
        est.upload_ms += u;
        match backend {
            BackendKind::Host => est.host_ms += u,
            BackendKind::Cuda => est.cuda_ms += u,
        }
    }
    // One probe per lane that crosses ranks (TP ≥ 2), at its (backend, TP)'s median probe time.
    let lanes: BTreeSet<_> = legal.iter().filter(|c| c.tp > 1).map(|c| (c.backend, c.tp, c.transport)).collect();
    for (backend, tp, _) in &lanes {
        let Some(p) = probes.get(&(*backend, *tp)).and_then(|v| median(v)) else { continue };
        est.probes += 1;
        est.probe_ms += p;
        match backend {
            BackendKind::Host => est.host_ms += p,
            BackendKind::Cuda => est.cuda_ms += p,
        }
    }
    for (backend, u) in &unit {
        let n = runs.plan.get(backend).copied().unwrap_or(0);
        est.baselines += n;
        est.baseline_ms += n as f64 * u;
        match backend {
            BackendKind::Host => est.host_ms += n as f64 * u,
            BackendKind::Cuda => est.cuda_ms += n as f64 * u,
        }
    }
    let once: Vec<f64> = once.values().map(|(plan, refs)| plan + refs).collect();
    est.once_ms = median(&once).unwrap_or(0.0);
    est
}

/// The samples of one earlier run's receipts, with the model and workload they ran.
struct RunHistory {
    dir: PathBuf,
    samples: Vec<Sample>,
}

/// What the receipts were run on: the model (preset and digest) and the battery.
fn workload(r: &Receipt) -> (String, String, String) {
    let c = &r.evidence.config;
    (c.model.preset.clone(), c.model.digest.clone(), c.battery_digest.clone())
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

/// Earlier runs' receipts, loaded once for `matrix --explain`: every sample, the census
/// baselines each run's own configurations needed (per backend), and the line naming them.
pub struct History {
    samples: Vec<Sample>,
    baselines: BTreeMap<BackendKind, usize>,
    header: String,
}

/// The receipts of the directories `history` (one per earlier run); none when no directory is
/// given. Refused when the directories hold no run receipt, or receipts of more than one model or
/// battery.
pub fn load_history(registry: &Registry, history: &[PathBuf]) -> Result<Option<History>, GateError> {
    if history.is_empty() {
        return Ok(None);
    }
    let mut runs = Vec::new();
    let mut workloads: BTreeMap<(String, String, String), PathBuf> = BTreeMap::new();
    for (run, dir) in history.iter().enumerate() {
        let mut samples = Vec::new();
        for r in super::load_receipts(dir)? {
            if r.kind != ReceiptKind::Run || r.evidence.verdict == Verdict::NotApplicable {
                continue;
            }
            workloads.entry(workload(&r)).or_insert_with(|| dir.clone());
            samples.push(Sample {
                config: crate::receipt::configuration_of(registry, &r),
                run,
                wall_ms: r.measurements.wall_ms,
                extra: r.measurements.extra.clone(),
            });
        }
        runs.push(RunHistory { dir: dir.clone(), samples });
    }
    let names = |v: &[PathBuf]| v.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let ((preset, digest, battery), _) = match workloads.len() {
        0 => {
            return Err(GateError::usage(format!(
                "matrix --history: no run receipt in {} to estimate from; give the receipt directories of earlier runs",
                names(history)
            )))
        }
        1 => workloads.iter().next().expect("one workload"),
        _ => {
            let seen: Vec<String> = workloads
                .iter()
                .map(|((p, d, b), dir)| format!("{p} model {} battery {} (in {})", short(d), short(b), dir.display()))
                .collect();
            return Err(GateError::usage(format!(
                "matrix --history: the receipts mix {} workloads: {}; their times do not add up to one plan — \
                 estimate from the receipts of one model and battery",
                workloads.len(),
                seen.join("; ")
            )));
        }
    };
    let used: Vec<String> = runs
        .iter()
        .map(|r| match r.samples.len() {
            0 => format!("{} (no run receipt)", r.dir.display()),
            n => format!("{} ({n} run receipt(s))", r.dir.display()),
        })
        .collect();
    // What each earlier run's own configurations needed in census baselines.
    let mut baselines = BTreeMap::new();
    for r in &runs {
        let configs: BTreeSet<Configuration> = r.samples.iter().map(|s| s.config.clone()).collect();
        let plan = crate::matrix::MatrixPlan {
            legal: configs.into_iter().collect(),
            excluded: Vec::new(),
            not_applicable: Vec::new(),
            smallest_sets_only: false,
            pass_notes: Vec::new(),
        };
        for (b, n) in runs_of(registry, &plan, &crate::env::DoorRequest::default())?.1 {
            *baselines.entry(b).or_default() += n;
        }
    }
    let samples: Vec<Sample> = runs.into_iter().flat_map(|r| r.samples).collect();
    let header = format!(
        "estimate from {} run receipt(s) of the {preset} model {} (battery {}) in {}",
        samples.len(),
        short(digest),
        short(battery),
        used.join(", ")
    );
    Ok(Some(History { samples, baselines, header }))
}

/// Wall time (ms) of one process running `legal`, which needs `baselines` census baseline runs
/// per backend (`runs_of`), estimated from `history`: what each part of `run --worker-processes
/// N` costs.
pub fn wall_of(
    registry: &Registry,
    legal: &[Configuration],
    baselines: BTreeMap<BackendKind, usize>,
    history: &History,
) -> f64 {
    let counts = BaselineRuns { plan: baselines, history: history.baselines.clone() };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    estimate(registry, legal, &history.samples, &counts).wall_ms(cores)
}

/// The estimate of running `legal` from `history` ([`load_history`]), as lines for `matrix
/// --explain`: which receipts it used, then the figures. `plan_baselines`: the census baseline
/// runs the plan needs, per backend (`baselines_by_backend` of its jobs).
pub fn explain(
    registry: &Registry,
    legal: &[Configuration],
    history: Option<&History>,
    plan_baselines: &BTreeMap<BackendKind, usize>,
) -> String {
    let Some(history) = history else {
        return "estimated duration: not estimated — no receipts of earlier runs given (--history DIR… names \
                the receipt directories of earlier runs)"
            .into();
    };
    let counts = BaselineRuns { plan: plan_baselines.clone(), history: history.baselines.clone() };
    let e = estimate(registry, legal, &history.samples, &counts);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let clock = |ms: f64| crate::suite::clock(ms / 1e3);
    let mut out = format!("{}\n", history.header);
    let missing: usize = e.unestimated.values().sum();
    out += &format!(
        "estimated duration: {}{} wall on {cores} core(s) — host {} of configuration time (sharing the cores), CUDA {} (one at a time), {} weight upload(s) {} and {} probe(s) {} included, model and references {} once; {} of {} configurations seen before, {} estimated from their backend and TP, {} from their backend's median",
        if missing > 0 { "at least " } else { "" },
        clock(e.wall_ms(cores)),
        clock(e.host_ms),
        clock(e.cuda_ms),
        e.uploads,
        clock(e.upload_ms),
        e.probes,
        clock(e.probe_ms),
        clock(e.once_ms),
        e.seen,
        legal.len(),
        e.by_class,
        e.by_all
    );
    if e.baselines > 0 {
        let history: usize = counts.history.values().sum();
        out += &format!(
            "; census baselines: the plan's {} run(s), {} at the history's cost per baseline run (its {history} \
             baseline run(s), not its per-configuration share: a shard needs more per configuration than a whole plan)",
            e.baselines,
            clock(e.baseline_ms)
        );
    }
    for (backend, n) in &e.unestimated {
        out += &format!(
            "\n{n} {} configuration(s) not estimated: the history holds no {} run receipt",
            backend.name(),
            backend.name()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_runtime::Transport;

    fn config(backend: BackendKind, tp: usize, doors: &[&str]) -> Configuration {
        Configuration::single(backend, tp, Transport::HostBounce, doors.iter().map(|d| d.to_string()).collect())
    }

    fn sample(c: Configuration, wall: f64, phases: &[(&str, f64)]) -> Sample {
        Sample { config: c, run: 0, wall_ms: wall, extra: phases.iter().map(|(k, v)| (k.to_string(), *v)).collect() }
    }

    #[test]
    fn uploads_and_the_plan_oracle_are_counted_once_not_per_configuration() {
        let r = Registry::builtin().unwrap();
        let plan = |tp| config(BackendKind::Cuda, tp, &[]);
        let p2p = |tp| Configuration { transport: Transport::NativeP2p, ..plan(tp) };
        // An earlier night: TP1 uploaded (40 s) and computed the CUDA baseline (20 s); TP1 p2p
        // reused both.
        let once = [("phase_generate_ms", 30_000.0), ("phase_plan_oracle_ms", 10_000.0)];
        let history = vec![
            sample(
                plan(1),
                62_000.0,
                &[&once[..], &[("phase_upload_ms", 40_000.0), ("phase_oracle_ms", 20_000.0)]].concat(),
            ),
            sample(p2p(1), 2_000.0, &once),
        ];
        // Four TP1 configurations on one layout (two of them seen), one of another layout (F32 mirror).
        let f32m = config(BackendKind::Cuda, 1, &["f32_mirror"]);
        let legal = vec![plan(1), p2p(1), plan(1), p2p(1), f32m];
        let e = estimate(&r, &legal, &history, &BaselineRuns::default());
        assert_eq!((e.seen, e.by_class, e.by_all), (4, 1, 0));
        assert_eq!(e.uploads, 2, "two weight layouts");
        assert_eq!(e.upload_ms, 80_000.0);
        // Own times: 22 s (62 − 40: its references are its own) and 2 s; the unseen one takes
        // the class mean, 12 s.
        assert_eq!(e.cuda_ms, 2.0 * 22_000.0 + 2.0 * 2_000.0 + 12_000.0 + 80_000.0);
        assert_eq!(e.once_ms, 30_000.0 + 10_000.0);
        assert_eq!(e.wall_ms(8), e.once_ms + e.cuda_ms, "CUDA configurations do not share cores");
    }

    /// A probe is paid once per lane (backend, TP, transport) of the plan, not by every
    /// configuration: a shard's first job of a lane carries it, and the mean must not spread it.
    #[test]
    fn probes_are_counted_once_per_lane() {
        let r = Registry::builtin().unwrap();
        let hb = |doors: &[&str]| config(BackendKind::Cuda, 2, doors);
        let p2p = |doors: &[&str]| Configuration { transport: Transport::NativeP2p, ..hb(doors) };
        // The sample: the first TP2 job probed (3 s) and took 1 s of its own; the next took 1 s.
        let history =
            vec![sample(hb(&[]), 4_000.0, &[("phase_probe_ms", 3_000.0)]), sample(hb(&["graph"]), 1_000.0, &[])];
        // A plan of two lanes at TP2 (two probes) and a TP1 one (no probe), ten configurations.
        let mut legal: Vec<Configuration> = (0..4).map(|_| hb(&["graph"])).chain((0..4).map(|_| p2p(&[]))).collect();
        legal.extend([config(BackendKind::Cuda, 1, &[]), config(BackendKind::Cuda, 1, &[])]);
        let history = [history, vec![sample(config(BackendKind::Cuda, 1, &[]), 500.0, &[])]].concat();
        let e = estimate(&r, &legal, &history, &BaselineRuns::default());
        assert_eq!((e.probes, e.probe_ms), (2, 6_000.0));
        assert_eq!(e.cuda_ms, 8.0 * 1_000.0 + 2.0 * 500.0 + 6_000.0, "own times 1 s, 0.5 s; probes once per lane");
    }

    /// A shard's baselines are a cost per baseline run: the plan pays its own count of them, not
    /// the shard's share per configuration.
    #[test]
    fn census_baselines_are_paid_per_baseline_run_of_the_plan() {
        let r = Registry::builtin().unwrap();
        let c = |doors: &[&str]| config(BackendKind::Cuda, 2, doors);
        // A shard of two configurations that needed 6 baseline runs, 600 ms in all (100 ms each);
        // each configuration's own runs took 200 ms.
        let history = vec![
            sample(c(&["graph"]), 500.0, &[("phase_oracle_ms", 300.0)]),
            sample(c(&["dcw"]), 500.0, &[("phase_oracle_ms", 300.0)]),
        ];
        let legal: Vec<Configuration> = (0..10).map(|_| c(&["graph"])).collect();
        let runs = BaselineRuns {
            plan: BTreeMap::from([(BackendKind::Cuda, 4)]),
            history: BTreeMap::from([(BackendKind::Cuda, 6)]),
        };
        let e = estimate(&r, &legal, &history, &runs);
        assert_eq!((e.baselines, e.baseline_ms), (4, 400.0));
        assert_eq!(e.cuda_ms, 10.0 * 200.0 + 400.0);
        // Without counts the baselines stay in each configuration's time (the shard's share).
        let e = estimate(&r, &legal, &history, &BaselineRuns::default());
        assert_eq!((e.baselines, e.cuda_ms), (0, 10.0 * 500.0));
        // A host history says nothing about CUDA baselines.
        let host_only = BaselineRuns { history: BTreeMap::from([(BackendKind::Host, 6)]), ..runs };
        assert_eq!(estimate(&r, &legal, &history, &host_only).cuda_ms, 10.0 * 500.0);
    }

    #[test]
    fn receipts_without_phases_count_their_wall_time() {
        let r = Registry::builtin().unwrap();
        let c = config(BackendKind::Host, 2, &[]);
        let e = estimate(&r, &[c.clone(), c.clone()], &[sample(c, 3_000.0, &[])], &BaselineRuns::default());
        assert_eq!((e.host_ms, e.uploads, e.once_ms), (6_000.0, 0, 0.0));
        assert_eq!(e.wall_ms(2), 3_000.0);
    }

    #[test]
    fn a_backend_without_receipts_is_not_estimated_from_another() {
        let r = Registry::builtin().unwrap();
        let host = config(BackendKind::Host, 1, &[]);
        let cuda = config(BackendKind::Cuda, 1, &[]);
        let e =
            estimate(&r, &[host.clone(), cuda.clone(), cuda], &[sample(host, 5_000.0, &[])], &BaselineRuns::default());
        assert_eq!((e.seen, e.by_class, e.by_all, e.host_ms, e.cuda_ms), (1, 0, 0, 5_000.0, 0.0));
        assert_eq!(e.unestimated, BTreeMap::from([(BackendKind::Cuda, 2)]));
    }

    #[test]
    fn no_history_is_said_and_an_empty_one_refused() {
        let r = Registry::builtin().unwrap();
        let legal = [config(BackendKind::Host, 1, &[])];
        assert!(load_history(&r, &[]).unwrap().is_none());
        let said = explain(&r, &legal, None, &BTreeMap::new());
        assert!(said.contains("not estimated") && !said.contains("estimated duration: 0"), "{said}");
        let empty = std::env::temp_dir().join(format!("memra-estimate-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let refused = load_history(&r, std::slice::from_ref(&empty)).err().expect("refused").to_string();
        std::fs::remove_dir_all(&empty).unwrap();
        assert!(refused.contains("no run receipt") && refused.contains(&empty.display().to_string()), "{refused}");
    }
}
