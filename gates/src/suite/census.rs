//! Engagement witnessed by the backend (docs/DESIGN.md §4.2): each enabled door's declared census
//! change (`gates/doors.toml` `census`) is checked against the census of the same configuration
//! with that door off — its *census baseline*, run here and cached per configuration, so the
//! doors of a matrix at one TP size and transport share one baseline run. The baseline runs
//! exactly as the gated run does (same teacher-forced tape, same captures), so the only
//! difference between the two censuses is the door. A job's own gated run is the census baseline
//! of every superset that asks for it (the same configuration, tape and captures), so a matrix
//! scheduled subsets first runs few baselines of its own.

use super::{Phase, Suite};
use crate::gate::{self, Outcome};
use crate::job::{CensusDecl, Job};
use crate::subject::RunSpec;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::{DoorSet, ExpertFormat, PassShape, Transport};

/// A census baseline's configuration: backend, TP, transport, door values, expert format, the
/// teacher-forced tape (the tokens of the oracle a NUMERIC job is held to) and the captures — all
/// of its run specification, so one key is one run.
/// The door variables are part of the key: an external subject's doors have no field in the
/// built-in runtime's door values.
pub(super) type BaselineKey = KeyOf<Vec<Vec<u32>>, Vec<CaptureKey>>;

/// A baseline key with the tape and the captures as `T` and `C`: the tokens and capture keys in a
/// run ([`BaselineKey`]); in a plan, before any run, what decides them — the oracle a NUMERIC job
/// is forced with (its expert format) and whether prompt 0 is captured ([`PlanKey`]).
type KeyOf<T, C> = (BackendKind, usize, Transport, PassShape, DoorSet, Vec<String>, ExpertFormat, Option<T>, C);

/// [`BaselineKey`] as a plan knows it: a NUMERIC job is forced with the tokens of the oracle of
/// its expert format and captures all of prompt 0, every other job neither, so two plan keys are
/// equal exactly when the two runs' keys will be.
type PlanKey = KeyOf<ExpertFormat, bool>;

fn key<T, C>(
    job: &Job,
    doors: DoorSet,
    vars: &std::collections::BTreeMap<String, bool>,
    format: ExpertFormat,
    forced: Option<T>,
    capture: C,
) -> KeyOf<T, C> {
    let vars = vars.iter().filter(|(_, on)| **on).map(|(v, _)| v.clone()).collect();
    (job.backend, job.tp, job.transport, job.pass, doors, vars, format, forced, capture)
}

/// The key of a run made with `forced` and `capture` (what [`BaselineKey`] holds of them).
fn run_key(
    job: &Job,
    doors: DoorSet,
    vars: &std::collections::BTreeMap<String, bool>,
    format: ExpertFormat,
    forced: Option<&Record>,
    capture: &[CaptureKey],
) -> BaselineKey {
    key(job, doors, vars, format, forced.map(|r| r.tokens.clone()), capture.to_vec())
}

/// The expert format a door set's banks take (NVFP4_EP2 and NVFP4_DEV_ROUTES imply NVFP4).
pub(super) fn format_of_doors(doors: DoorSet) -> ExpertFormat {
    if doors.nvfp4_banks() {
        ExpertFormat::Nvfp4
    } else {
        ExpertFormat::E4m3
    }
}

/// The runs a whole plan needs beyond its jobs' own two each: the census baselines that no job's
/// own gated run provides (a NUMERIC door switched off can leave a set whose own run is not
/// teacher-forced, or a set no job of the plan has). A lower bound of a real run: a baseline
/// asked for before the job that provides it has run is run twice.
pub fn unshared_baselines(jobs: &[Job]) -> usize {
    let ids = baseline_ids(jobs);
    let provided: std::collections::HashSet<usize> = ids.iter().filter_map(|(own, _)| *own).collect();
    let needed: std::collections::HashSet<usize> = ids.iter().flat_map(|(_, asks)| asks.iter().copied()).collect();
    needed.difference(&provided).count()
}

/// Per job, its census-baseline keys as small integers: the key its own gated run provides (none
/// when it does not run) and the keys its census asks for (none when it does not run). Two ids
/// are equal exactly when one run serves both ([`unshared_baselines`]; the workers' parts,
/// `crate::plan::parts`).
pub fn baseline_ids(jobs: &[Job]) -> Vec<(Option<usize>, Vec<usize>)> {
    let plan_key = |j: &Job, doors: DoorSet, vars, format| -> PlanKey {
        let n = super::forced_and_captured(j);
        key(j, doors, vars, format, n.then(|| super::format_of(j)), n)
    };
    let mut index: std::collections::HashMap<PlanKey, usize> = std::collections::HashMap::new();
    let mut id = |k: PlanKey| {
        let next = index.len();
        *index.entry(k).or_insert(next)
    };
    jobs.iter()
        .map(|j| {
            if j.not_run.is_some() {
                return (None, Vec::new());
            }
            let own = id(plan_key(j, j.doors, &j.doors_env, format_of_doors(j.doors)));
            let asks = j.census.iter().map(|d| id(plan_key(j, d.off, &d.off_vars, format_of_doors(d.off)))).collect();
            (Some(own), asks)
        })
        .collect()
}

impl Suite<'_> {
    /// The run of `job`'s configuration with `decl`'s door off (its captures dropped): its census
    /// is the door's engagement baseline, its digests the door's identity baseline.
    pub(super) fn census_baseline(
        &self,
        job: &Job,
        decl: &CensusDecl,
        forced: Option<&Record>,
        capture: &[CaptureKey],
    ) -> Result<Record, String> {
        let off = decl.off;
        // The expert storage is part of the door (NVFP4_EP2 and NVFP4_DEV_ROUTES imply NVFP4
        // banks): the baseline takes the storage its own doors imply.
        let format = format_of_doors(off);
        let key = run_key(job, off, &decl.off_vars, format, forced, capture);
        self.census_baselines.get_or_compute(key, || {
            let spec = RunSpec {
                backend: job.backend,
                tp: job.tp,
                transport: job.transport,
                // The census of a pass of several lanes is compared with the same shape's.
                pass: job.pass,
                doors: off,
                door_vars: decl.off_vars.clone(),
                format,
                forced,
                capture: capture.to_vec(),
                // Only its census and engagement are read (RunSpec::timing).
                timing: memra_runtime::Timing::Off,
            };
            self.subject_as(Phase::Oracle, spec).map(without_captures).map_err(|e| e.to_string())
        })
    }

    /// Keep the census of `run`, the job's gated run (made with `forced` and `capture`), as the
    /// census baseline of its own configuration.
    pub(super) fn keep_census(&self, job: &Job, run: &Record, forced: Option<&Record>, capture: &[CaptureKey]) {
        let key = run_key(job, job.doors, &job.doors_env, super::format_of(job), forced, capture);
        self.census_baselines.offer(key, || Ok(without_captures(run.clone())));
    }

    /// The engagement gate of `run` (the job's gated run, made with `forced` and `capture`).
    pub(super) fn engagement_gate(
        &self,
        job: &Job,
        run: &Record,
        forced: Option<&Record>,
        capture: &[CaptureKey],
    ) -> Outcome {
        let baselines: Vec<_> = job
            .census
            .iter()
            .map(|d| (d, self.census_baseline(job, d, forced, capture).map(|r| r.census.counts().clone())))
            .collect();
        // Whose word the census is goes into the receipt beside it (`census_witness`), not into
        // this detail: the built-in runtime through the protocol keeps its evidence otherwise
        // byte-identical to the same plan in process.
        gate::engagement(run.census.counts(), &baselines)
    }

    /// Each door of `job` that claims to change no number (`CensusDecl::identity`), against the
    /// subject's own run of the same configuration without it (the run its engagement is judged
    /// against): the digests must be equal bit for bit. `None` when no such door is on. A NUMERIC
    /// job is held to the oracle only within a budget, so without this a door declared
    /// BIT-IDENTICAL on a NUMERIC subject could change the numbers unseen.
    pub(super) fn door_identity(
        &self,
        job: &Job,
        run: &Record,
        forced: Option<&Record>,
        capture: &[CaptureKey],
    ) -> Option<Outcome> {
        let mut held = Vec::new();
        let mut broken = Vec::new();
        for decl in job.census.iter().filter(|d| d.identity.is_some()) {
            let class = decl.identity.unwrap_or_default();
            match self.census_baseline(job, decl, forced, capture) {
                Err(e) => broken.push(format!("{} ({class}): its run without the door failed: {e}", decl.door)),
                Ok(off) => match gate::first_digest_divergence(&off, run) {
                    Err(structure) => broken.push(format!("{} ({class}): {structure}", decl.door)),
                    Ok(None) => held.push(decl.door.clone()),
                    Ok(Some(d)) => broken.push(format!(
                        "{} is declared {class} but changes the numbers: this run differs from the subject's own run \
                         without it first at L{}.{} p{} s{}",
                        decl.door,
                        d.layer,
                        d.seam.name(),
                        d.prompt,
                        d.step
                    )),
                },
            }
        }
        if held.is_empty() && broken.is_empty() {
            return None;
        }
        Some(if broken.is_empty() {
            Outcome::Pass(format!("bit-identical to the same configuration without {}", held.join(", ")))
        } else {
            Outcome::Fail(broken.join("; "))
        })
    }
}

/// A baseline kept for its census and digests: captures are large and never read from it.
fn without_captures(mut r: Record) -> Record {
    r.captures.clear();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn job(doors: DoorSet, vars: &[&str]) -> Job {
        Job { doors_env: vars.iter().map(|v| (v.to_string(), true)).collect(), ..crate::suite::test_job(2, doors) }
    }

    fn tape(t: u32) -> Record {
        Record { tokens: vec![vec![t, t + 1]], ..Record::default() }
    }

    /// The key is the whole run specification: the subset job's own run is exactly the baseline
    /// its superset asks for, and a different forced tape, captures, format or door set is another
    /// key (one key, one run).
    #[test]
    fn a_baseline_key_is_one_run_specification() {
        let with_ep = DoorSet { step_ep: true, ..DoorSet::default() };
        let superset = job(DoorSet { oproj_direct: true, ..with_ep }, &["MEMRA_STEP_EP", "MEMRA_OPROJ_DIRECT"]);
        let subset = job(with_ep, &["MEMRA_STEP_EP"]);
        let off_vars: BTreeMap<String, bool> = BTreeMap::from([("MEMRA_STEP_EP".to_string(), true)]);
        let (a, b) = (tape(3), tape(4));
        let cap = [CaptureKey { prompt: 0, step: 0, layer: 0, seam: memra_runtime::record::Seam::LAYER[0] }];
        let asked = |forced, capture: &[CaptureKey]| {
            run_key(&superset, with_ep, &off_vars, ExpertFormat::E4m3, forced, capture)
        };
        let own = |forced, capture: &[CaptureKey]| {
            run_key(&subset, subset.doors, &subset.doors_env, ExpertFormat::E4m3, forced, capture)
        };
        assert_eq!(asked(None, &[]), own(None, &[]));
        assert_eq!(asked(Some(&a), &cap), own(Some(&a), &cap));
        assert_ne!(asked(Some(&a), &cap), own(Some(&b), &cap), "another forced tape is another run");
        assert_ne!(asked(Some(&a), &[]), own(Some(&a), &cap), "captures are part of the run");
        assert_ne!(asked(None, &[]), own(Some(&a), &[]), "a forced run is not a free one");
        assert_ne!(
            asked(None, &[]),
            run_key(&subset, subset.doors, &subset.doors_env, ExpertFormat::Nvfp4, None, &[]),
            "the expert storage is part of the run"
        );
        assert_ne!(asked(None, &[]), own_key_of(&superset), "the superset's own run is not its baseline");
    }

    fn own_key_of(j: &Job) -> BaselineKey {
        run_key(j, j.doors, &j.doors_env, ExpertFormat::E4m3, None, &[])
    }
}
