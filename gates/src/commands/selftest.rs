//! `memra-gates selftest`: every canary, at every TP size and transport the backend offers, must
//! be caught at the place its defect predicts; the f64 reference check must pass on the model
//! and fail on a model with a planted error; and a NUMERIC-CLASS door that turns out
//! bit-identical is reported (its class may be mislabeled).
//!
//! The expected place of each canary is derived from the canary's own definition (where it plants
//! the defect) — for the twin defects, from where the oracle first reached the defect's path (the
//! receipt's coverage) — never from a previous run. The flip canary's element is seeded
//! (`--flip-seed`) and recorded in its receipt (`planted`). selftest runs the `edge` model unless
//! a model is given: it reaches every special path, so every canary has something to catch —
//! except the SEL_DOWN8 slot-order canary, which needs an owner summing three slots (edge routes
//! two): on a generated model it runs again on the same shapes with top_k 4 (`top4/`).

use super::Status;
use crate::args::{Provenance, SelftestArgs};
use crate::error::GateError;
use crate::job::Job;
use crate::matrix::{self, MatrixKind};
use crate::outdir::{OutDir, Reuse};
use crate::plan::{self, ModelPlan};
use crate::registry::{self, DoorClass, TP_SIZES};
use crate::subject::{Builtin, RunSpec, Subject};
use crate::suite::{Progress, Suite, SuiteOptions};
use memra_receipts::schema::{DivergenceAt, Evidence, Gate, Receipt, Verdict};
use memra_runtime::evidence::coverage;
use memra_runtime::record::Seam;
use memra_runtime::{Battery, Canary, Transport};
use std::collections::BTreeSet;

/// Where a canary's defect must show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// The first divergence: (prompt, step, layer, seam), the element where the canary names one,
    /// and for a broken copy its (source, destination) ranks.
    At { place: (usize, usize, usize, Seam), element: Option<u64>, copy: Option<(usize, usize)> },
    /// The first divergence at any place of this seam (a defect whose first place depends on the
    /// values it meets, but never on which seam shows it first).
    AtSeam(Seam),
    /// A race: any divergence, or a failed determinism gate.
    Any,
    /// A silent fallback: the identity holds, and the engagement gate makes the run VOID naming
    /// this door.
    Void(&'static str),
    /// The battery never reaches the defect's path, so nothing can show (the canary is MISSED).
    Unreached(String),
}

/// The first place the oracle reached any of `paths` (the receipt's coverage).
fn first_reach(ev: &Evidence, paths: &[&str]) -> Expected {
    let first = paths
        .iter()
        .filter_map(|p| ev.coverage.get(*p).and_then(|c| c.first.clone()))
        .filter_map(|f| Seam::parse(&f.seam).map(|s| (f.prompt, f.step, f.layer, s)))
        .min_by_key(|&(p, s, l, seam)| (p, s, l, seam));
    match first {
        Some(place) => Expected::At { place, element: None, copy: None },
        None => Expected::Unreached(format!("the battery never reaches {}", paths.join(" / "))),
    }
}

/// Where canary `c` must first show in a run at `tp` with passes of `columns` columns, over a
/// battery whose first prompt has `first_prompt` tokens, whose receipt evidence is `ev`.
pub fn expected(c: &Canary, tp: usize, columns: usize, first_prompt: usize, ev: &Evidence) -> Expected {
    let at = |place| Expected::At { place, element: None, copy: None };
    match *c {
        Canary::FlipBit { layer, seam, step, element } => {
            Expected::At { place: (0, step, layer, seam), element: Some(element as u64), copy: None }
        }
        // The reversed fold changes the first o_join it touches.
        Canary::ReverseKBlocks => at((0, 0, 0, Seam::OJoin)),
        // The first step has no previous step: the stale read shows at step 1.
        // In passes of several columns the first (prefill) pass already holds steps past the first,
        // so the stale read shows at its first column.
        Canary::StaleBuffer => at((0, usize::from(columns <= 1), 0, Seam::OJoin)),
        Canary::SkipFence => Expected::Any,
        Canary::TieBreak => first_reach(ev, &[coverage::TIE_IN_TOPK, coverage::TIE_AT_BOUNDARY]),
        Canary::SignedZero => first_reach(ev, &[coverage::NEGATIVE_ZERO_SUMS]),
        Canary::Clamp => first_reach(ev, &["swiglu.clamp_silu.routed", "swiglu.clamp_silu.shared"]),
        Canary::SilentFallback => Expected::Void("oproj_direct"),
        // The copy of layer 0's attn_norm to the last rank, at step 0.
        Canary::BrokenBroadcast => {
            Expected::At { place: (0, 0, 0, Seam::AttnNorm), element: None, copy: Some((0, tp - 1)) }
        }
        // Rows (batch 2 or more): lane j takes its first session at pass j, so the
        // first pass of two rows is pass 1 — prompt 0's step 1 beside prompt 1's step 0 — and
        // the reversed fold first shows in prompt 0, step 1, at layer 0's o_join.
        Canary::BatchKSplit => at((0, 1, 0, Seam::OJoin)),
        // The second prompt's first step reads its neighbour's cache at layer 0.
        Canary::NeighbourSession => at((1, 0, 0, Seam::Attn)),
        // Columns: prompt 0's prefill pass holds steps 0..T; partitions of P = 32 >> T positions
        // first differ from one partition at the step whose length is P + 1 (step P).
        Canary::VerifyPartitions => verify_partitions_place(columns, first_prompt),
        // The reversed owner chain leaves the experts seam's partials as they were: it first shows
        // in an owner sum, at the moe_join that consumes it (where an owner sums three slots or
        // more and their reassociation changes a bit: a place only the values decide).
        Canary::Down8SlotOrder => Expected::AtSeam(Seam::MoeJoin),
    }
}

/// Where the verify-partitions canary first shows: step `P = ATTN_PARTITION >> T` of prompt 0
/// (attention over P + 1 positions is the first to span two partitions), when prompt 0's first
/// pass (its prefill, min(T, prompt length) columns) reaches it.
fn verify_partitions_place(t: usize, first_prompt: usize) -> Expected {
    let p = (memra_kernels::twins::attention::ATTN_PARTITION >> t).max(1);
    if t > 1 && p < t.min(first_prompt) {
        Expected::At { place: (0, p, 0, Seam::Attn), element: None, copy: None }
    } else {
        Expected::Unreached(format!(
            "a pass of {t} column(s) over a first prompt of {first_prompt} tokens never spans two partitions of {p}"
        ))
    }
}

/// Whether the receipt shows the canary caught where expected.
fn caught(expected: &Expected, ev: &Evidence) -> bool {
    let failed = |gate| ev.gates.iter().any(|g| g.gate == gate && g.verdict == Verdict::Fail);
    let d = ev.first_divergence.as_ref();
    match expected {
        Expected::At { place: (p, s, l, seam), element, copy } => d.is_some_and(|d| {
            let here = d.prompt == *p && d.step == *s && d.layer == *l && d.seam == seam.name();
            let elem = element.is_none_or(|e| d.reproduced && d.element == Some(e));
            let copied = match copy {
                Some((src, dst)) => d.at == DivergenceAt::Copy && d.src_rank == Some(*src) && d.rank == Some(*dst),
                None => d.at == DivergenceAt::Seam,
            };
            failed(Gate::Identity) && here && elem && copied
        }),
        Expected::AtSeam(seam) => {
            failed(Gate::Identity) && d.is_some_and(|d| d.seam == seam.name() && d.at == DivergenceAt::Seam)
        }
        Expected::Any => failed(Gate::Identity) || failed(Gate::Determinism),
        Expected::Void(door) => {
            ev.verdict == Verdict::Void
                && ev
                    .gates
                    .iter()
                    .any(|g| g.gate == Gate::Engagement && g.verdict == Verdict::Void && g.detail.contains(door))
                && ev.gates.iter().any(|g| g.gate == Gate::Identity && g.verdict == Verdict::Pass)
        }
        Expected::Unreached(_) => false,
    }
}

fn describe(e: &Expected) -> String {
    match e {
        Expected::At { place: (p, s, l, seam), element, copy } => {
            let mut t = format!("L{l}.{} p{p} s{s}", seam.name());
            if let Some(e) = element {
                t += &format!(" [{e}]");
            }
            if let Some((a, b)) = copy {
                t += &format!(" copy r{a}→r{b}");
            }
            t
        }
        Expected::AtSeam(seam) => format!("the first {} reached", seam.name()),
        Expected::Any => "any divergence".into(),
        Expected::Void(door) => format!("VOID: {door} not witnessed"),
        Expected::Unreached(why) => format!("unreachable: {why}"),
    }
}

/// The flip canary's element: the `seed`-th held element of its seam (splitmix64 of the seed,
/// modulo the elements some rank holds).
fn seeded_element(config: &memra_runtime::model::ModelConfig, seam: Seam, seed: u64) -> Result<usize, GateError> {
    let ranges = memra_runtime::program::payloads::seam_elements(config, seam)?;
    let total: usize = ranges.iter().map(|r| r.len()).sum();
    let mut n = (memra_kernels::twins::digest::splitmix64(seed) % total.max(1) as u64) as usize;
    for r in ranges {
        if n < r.len() {
            return Ok(r.start + n);
        }
        n -= r.len();
    }
    Ok(0)
}

pub fn selftest(args: &SelftestArgs, prov: Provenance) -> Result<Status, GateError> {
    let registry = plan::load_registry(&None)?;
    let req = plan::door_request(&registry, &[])?;
    let backend = plan::resolve_backend(&args.backend, req.require_gpu(&registry))?;
    let transports: Vec<Transport> = match backend {
        registry::BackendKind::Host => vec![Transport::HostBounce, Transport::NativeP2p],
        registry::BackendKind::Cuda => Transport::ALL.to_vec(),
    };
    let mut canaries = matrix::enumerate(&registry, &MatrixKind::Canaries, &TP_SIZES, &transports, &[backend])?;
    // Rows and columns (docs/DESIGN.md §3.6): on request every canary must be caught at each
    // shape too, named at its place and lane; without the flags each canary runs single-token,
    // and the rows and columns canaries at the first shape their registry `passes` allow.
    let passes = if args.batch.is_some() || args.columns.is_some() {
        matrix::Passes::from_flags(None, args.batch.as_deref(), args.columns.as_deref())?
    } else {
        matrix::Passes::doors_own_shapes()
    };
    canaries = passes.apply(canaries, &BTreeSet::new(), &registry);
    let mut jobs = plan::jobs_of(&registry, &canaries, &req, 1, None)?;
    let mut model_args = args.model.clone();
    if model_args.model.is_none() && model_args.preset.is_none() {
        model_args.preset = Some("edge".to_string());
    }
    let model = ModelPlan::from_args(&model_args)?;
    let (model_config, generated) = (model.config.clone(), args.model.model.is_none());
    for job in jobs.iter_mut() {
        if let Some(Canary::FlipBit { layer, seam, step, .. }) = job.doors.canary {
            let element = match req.canary_flip_at(&registry).and_then(|a| a.element) {
                Some(e) => e,
                None => seeded_element(&model.config, seam, args.flip_seed)?,
            };
            job.doors.canary = Some(Canary::FlipBit { layer, seam, step, element });
        }
    }
    if let Some(id) = &args.disarm {
        let mut found = false;
        for job in jobs.iter_mut().filter(|j| j.doors.canary.map(|c| registry::canary_id(&c)) == Some(id.as_str())) {
            job.doors.canary = None;
            found = true;
        }
        if !found {
            return Err(GateError::usage(format!("--disarm {id}: no such canary in this selftest")));
        }
        eprintln!("memra-gates: selftest with canary {id} DISARMED (its defect is not planted)");
    }
    let battery = plan::battery_for(&model.config, 1, Some(args.prompts), None)?;
    let out = take_out(&args.out, &jobs, &model, &battery)?;
    let first_prompt = battery.prompts.first().map_or(0, Vec::len);
    let (subject, generate_ms) = model.load_timed(battery, true)?;
    let (suite, mut receipts) = run_into(&subject, &jobs, &out, generate_ms, &prov)?;
    // The rows the slot-order model ran instead of the selftest model (they are not its reference).
    let mut elsewhere = BTreeSet::new();
    if generated && model_config.top_k < SLOT_ORDER_MIN_TOP_K {
        let rows: Vec<usize> = (0..jobs.len())
            .filter(|&i| {
                jobs[i].engagement.contains_key(SLOT_ORDER_CANARY)
                    && receipts[i].evidence.verdict == Verdict::NotApplicable
            })
            .collect();
        if !rows.is_empty() {
            let subset: Vec<_> = rows.iter().map(|&i| jobs[i].clone()).collect();
            let again = slot_order_receipts(args, &model_config, &subset, out.path(), &prov)?;
            for (&i, r) in rows.iter().zip(again) {
                receipts[i] = r;
                elsewhere.insert(i);
            }
        }
    }

    let mut all_caught = true;
    let mut ran = 0;
    let mut reference = BTreeSet::new();
    crate::say!("{:<24} {:<16} {:<14} {:<38} observed", "canary", "configuration", "verdict", "expected");
    for (i, (job, r)) in jobs.iter().zip(&receipts).enumerate() {
        let ev = &r.evidence;
        let name = job.engagement.keys().find(|k| k.starts_with("canary_")).cloned().unwrap_or_default();
        let mut config = format!("tp{} {}", job.tp, job.transport.name());
        if elsewhere.contains(&i) {
            config.push_str(&format!(":top{SLOT_ORDER_TOP_K}"));
        }
        if ev.verdict == Verdict::NotApplicable {
            crate::say!(
                "{name:<24} {config:<16} {:<14} {:<38} {}",
                "NOT-APPLICABLE",
                "-",
                ev.reason.clone().unwrap_or_default()
            );
            continue;
        }
        ran += 1;
        if let Some(g) = ev.gates.iter().find(|g| g.gate == Gate::Reference).filter(|_| !elsewhere.contains(&i)) {
            reference.insert((g.verdict, g.detail.clone()));
        }
        // The canary as planted (a disarmed job has none: its definition still says where to look).
        let canary = job.doors.canary.or_else(|| {
            registry
                .to_door_set(&BTreeSet::from([name.clone()]), req.canary_flip_at(&registry))
                .ok()
                .and_then(|d| d.canary)
        });
        let exp = canary
            .map(|c| expected(&c, job.tp, job.pass.columns, first_prompt, ev))
            .unwrap_or(Expected::Unreached("no canary".into()));
        let ok = caught(&exp, ev);
        all_caught &= ok;
        let obs = match &ev.first_divergence {
            Some(d) => d.short(),
            None => format!("{}: {}", ev.verdict, ev.reason.clone().unwrap_or("no divergence".into())),
        };
        crate::say!(
            "{name:<24} {config:<16} {:<14} {:<38} {obs}",
            if ok { "CAUGHT" } else { "MISSED" },
            describe(&exp)
        );
    }
    if ran == 0 {
        return Err(GateError::NothingToTest("selftest ran no canary: nothing was tested".into()));
    }
    let reference_ok = reference_checks(&suite, &subject, &reference);
    numeric_mislabel_warnings(&registry, backend, &suite, &subject)?;
    if all_caught && reference_ok {
        crate::say!("selftest: every canary was caught");
        Ok(Status::Passed)
    } else {
        crate::say!("selftest: FAILED — a planted defect went unnoticed");
        Ok(Status::Failed)
    }
}

/// The canary whose defect needs an NVFP4_EP2 owner summing three slots or more: a reversed chain
/// of two addends has the canonical bits (IEEE addition commutes), and `edge` routes two.
const SLOT_ORDER_CANARY: &str = "canary_down8_slot_order";
const SLOT_ORDER_MIN_TOP_K: usize = 3;
/// The top-k of the model selftest generates for it: the selftest model's shapes, top_k 4.
const SLOT_ORDER_TOP_K: usize = 4;

/// `jobs` (the slot-order canary's rows, NOT-APPLICABLE on the selftest model) run again on a model
/// of the selftest model's shapes with top_k [`SLOT_ORDER_TOP_K`], generated plainly (`edge`'s
/// edits are defined for top_k 2), receipts under `out/top4`: so the default selftest catches
/// this canary instead of listing it NOT-APPLICABLE.
fn slot_order_receipts(
    args: &SelftestArgs,
    shapes: &memra_runtime::model::ModelConfig,
    jobs: &[Job],
    out: &std::path::Path,
    prov: &Provenance,
) -> Result<Vec<Receipt>, GateError> {
    let mut config = shapes.clone();
    (config.preset, config.top_k) = (format!("{}-shaped-top{SLOT_ORDER_TOP_K}", shapes.preset), SLOT_ORDER_TOP_K);
    let model = ModelPlan::generated(config, args.model.seed.unwrap_or(1), args.model.cuda_reserve_gib)?;
    let battery = plan::battery_for(&model.config, 1, Some(args.prompts), None)?;
    let out = take_out(&out.join(format!("top{SLOT_ORDER_TOP_K}")), jobs, &model, &battery)?;
    let (subject, generate_ms) = model.load_timed(battery, true)?;
    Ok(run_into(&subject, jobs, &out, generate_ms, prov)?.1)
}

/// The output folder `path`, taken for the receipts of `jobs` on `model` with `battery`.
fn take_out(path: &std::path::Path, jobs: &[Job], model: &ModelPlan, battery: &Battery) -> Result<OutDir, GateError> {
    let ids: BTreeSet<String> = jobs
        .iter()
        .map(|j| memra_receipts::run_id(&crate::receipt::config_evidence(j, &model.evidence, battery)))
        .collect();
    OutDir::take(path, &ids, Reuse::Fresh)
}

/// `jobs` run on `subject`, their receipts written into `out`: the suite (its oracle) and the
/// receipts in job order.
fn run_into<'a>(
    subject: &'a Builtin,
    jobs: &[Job],
    out: &OutDir,
    generate_ms: f64,
    prov: &Provenance,
) -> Result<(Suite<'a>, Vec<Receipt>), GateError> {
    let opts = SuiteOptions {
        out_dir: Some(out.path().to_path_buf()),
        resume: false,
        workers: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        kernel_digest: prov.kernel_digest.to_string(),
        progress: Progress::Off,
        generate_ms,
    };
    let suite = Suite::new(subject, subject, opts)?;
    let done = suite.run_all(jobs);
    let (_, mut failed) = out.write_outputs("selftest", &done.receipts, &[]);
    failed.extend(done.write_failures.into_iter().map(|w| (w.path, w.error)));
    if !failed.is_empty() {
        return Err(GateError::ReceiptsNotWritten { dir: out.path().to_path_buf(), failed });
    }
    Ok((suite, done.receipts))
}

/// The f64 reference gate of the receipts must pass (one result for the model and battery), and
/// the reference check itself must fail on a model with a planted 1 % error in layer 0's output
/// projection (its negative control).
fn reference_checks(suite: &Suite, subject: &Builtin, seen: &BTreeSet<(Verdict, String)>) -> bool {
    let passed = seen.len() == 1 && seen.iter().all(|(v, _)| *v == Verdict::Pass);
    for (v, detail) in seen {
        crate::say!("{:<24} {:<16} {:<14} {detail}", "reference (f64)", "oracle", v.as_str());
    }
    let mut model = subject.model.clone();
    if let memra_runtime::model::Matrix::Bf16 { bits, .. } = &mut model.layers[0].wo {
        for b in bits.iter_mut() {
            let v = memra_kernels::formats::bf16_to_f32(*b) * 1.01;
            *b = memra_kernels::formats::bf16_from_f32(v);
        }
    }
    let oracle = suite.oracle();
    // `Some(place)` when the reference disagrees: the first failure as the reference gate names it
    // (layer, seam, prompt, step and element), so the canary shows the gate's location too.
    let caught = match memra_runtime::reference::reference_run(&model, &subject.battery, &oracle.tokens, None) {
        Ok(reference) => {
            let mut spec = RunSpec::oracle(registry::BackendKind::Host, memra_runtime::ExpertFormat::E4m3);
            spec.capture = crate::gate::all_keys_of_prompt(oracle, 0);
            match subject.run(spec) {
                Ok(record) => {
                    let report = memra_runtime::reference::compare(
                        &reference,
                        &record,
                        memra_runtime::reference::REFERENCE_REL_BOUND,
                    );
                    (!report.passed()).then(|| {
                        crate::suite::reference_first_failure(&report, record.n_layers)
                            .unwrap_or_else(|| "unlocated".to_string())
                    })
                }
                Err(_) => None,
            }
        }
        Err(_) => None,
    };
    crate::say!(
        "{:<24} {:<16} {:<14} the f64 reference of a model with layer 0's o_proj scaled by 1.01 must disagree{}",
        "reference canary",
        "oracle",
        if caught.is_some() { "CAUGHT" } else { "MISSED" },
        caught.as_deref().map(|p| format!(": {p}")).unwrap_or_default()
    );
    let caught = caught.is_some();
    passed && caught
}

/// NUMERIC-CLASS doors that change nothing may be mislabeled. Each door is compared with the
/// canonical program on the expert storage it implies (NVFP4_EP2 and NVFP4_DEV_ROUTES run on NVFP4
/// banks: against the E4M3 oracle they would always "change arithmetic", whatever they did).
fn numeric_mislabel_warnings(
    registry: &registry::Registry,
    backend: registry::BackendKind,
    suite: &Suite,
    subject: &Builtin,
) -> Result<(), GateError> {
    // The canonical program on NVFP4 banks, run once for every NVFP4 door (TP1 host-bounce: TP
    // size and transport change no bit of it).
    let mut nvfp4: Option<Result<memra_runtime::record::Record, String>> = None;
    for door in registry.doors().iter().filter(|d| d.class == DoorClass::Numeric && d.backends.contains(&backend)) {
        let tp = if door.tp.contains(&1) { 1 } else { door.tp.allowed.first().copied().unwrap_or(2) };
        let transport = if door.transports.contains(&Transport::HostBounce) {
            Transport::HostBounce
        } else {
            door.transports.allowed[0]
        };
        let doors = registry.to_door_set(&BTreeSet::from([door.id.clone()]), None)?;
        let format =
            if doors.nvfp4_banks() { memra_runtime::ExpertFormat::Nvfp4 } else { memra_runtime::ExpertFormat::E4m3 };
        let canonical = match format {
            memra_runtime::ExpertFormat::E4m3 => Ok(suite.oracle()),
            memra_runtime::ExpertFormat::Nvfp4 => nvfp4
                .get_or_insert_with(|| {
                    let mut base = RunSpec::oracle(backend, format);
                    base.forced = Some(suite.oracle());
                    subject.run_canonical(base).map_err(|e| e.to_string())
                })
                .as_ref()
                .map_err(Clone::clone),
        };
        let mut spec = RunSpec::oracle(backend, format);
        (spec.tp, spec.transport, spec.doors, spec.forced) = (tp, transport, doors, Some(suite.oracle()));
        match (subject.run_canonical(spec).map_err(|e| e.to_string()), canonical) {
            (Ok(r), Ok(c)) if r.digests == c.digests => {
                let on = match format {
                    memra_runtime::ExpertFormat::E4m3 => "the oracle",
                    memra_runtime::ExpertFormat::Nvfp4 => "the canonical program on the same NVFP4 banks",
                };
                crate::say!(
                    "{:<24} WARNING: bit-identical to {on} at TP{tp} {} on this model: its NUMERIC class may be mislabeled",
                    door.id,
                    transport.name()
                );
            }
            (Ok(_), Ok(_)) => crate::say!("{:<24} changes arithmetic as its NUMERIC class says", door.id),
            (Err(e), _) | (_, Err(e)) => crate::say!("{:<24} could not run: {e}", door.id),
        }
    }
    Ok(())
}
