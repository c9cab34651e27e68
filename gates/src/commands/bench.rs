//! `memra-gates bench`: is the canonical program fast enough to be worth gating (docs/DESIGN.md §8)?
//!
//! One TP1 decode run on a device, timed per layer × seam with device events, compared with the
//! memory floor (bytes a decode step must read ÷ the device-to-device bandwidth measured in the
//! same process) and with a PyTorch implementation of the same layer run in the same session.
//! The result is a performance receipt (`performance_claim = true`) and a table.

use super::{bench_doors, Status};
use crate::args::{BenchArgs, Provenance};
use crate::error::GateError;
use crate::plan::{self, ModelPlan};
use memra_receipts::schema::{self as rs, Gate, GateResult, Verdict};
use memra_receipts::{Receipt, ReceiptKind};
use memra_runtime::backend::cuda::LaunchOrder;
use memra_runtime::backend::{open_with, BackendKind, OpenOptions};
use memra_runtime::model::{Matrix, Model};
use memra_runtime::record::{Record, Seam};
use memra_runtime::{Battery, RunConfig, Transport};
use std::collections::BTreeMap;
use std::time::Instant;

/// Bytes one decode step reads per layer, by seam (TP1, all weights in their storage format).
#[derive(Debug, Clone, Default)]
pub struct LayerBytes {
    pub qkv: u64,
    pub o_proj: u64,
    pub router: u64,
    /// top_k routed experts + the shared expert: gate, up, down codes and scales.
    pub experts: u64,
    /// One routed expert (gate, up, down), and the shared expert: the parts of `experts`.
    pub routed_one: u64,
    pub shared: u64,
    /// K and V of `positions` cached positions (f32).
    pub kv: u64,
}

impl LayerBytes {
    pub fn total(&self) -> u64 {
        self.qkv + self.o_proj + self.router + self.experts + self.kv
    }
}

fn matrix_bytes(m: &Matrix) -> u64 {
    match m {
        Matrix::Bf16 { bits, .. } => bits.len() as u64 * 2,
        Matrix::E4m3 { codes, scales, .. } => codes.len() as u64 + scales.len() as u64 * 4,
    }
}

/// What layer `l` of `model` reads at a step attending over `positions` cached positions.
pub fn layer_bytes(model: &Model, l: usize, positions: usize) -> LayerBytes {
    let c = &model.config;
    let layer = &model.layers[l];
    let expert = |e: &memra_runtime::model::Expert| matrix_bytes(&e.gate) + matrix_bytes(&e.up) + matrix_bytes(&e.down);
    LayerBytes {
        qkv: matrix_bytes(&layer.wq) + matrix_bytes(&layer.wk) + matrix_bytes(&layer.wv) + matrix_bytes(&layer.wg),
        o_proj: matrix_bytes(&layer.wo),
        router: matrix_bytes(&layer.router),
        experts: c.top_k as u64 * expert(&layer.experts[0]) + expert(&layer.shared),
        routed_one: expert(&layer.experts[0]),
        shared: expert(&layer.shared),
        kv: 2 * (positions * c.kv_heads * c.head_dim * 4) as u64,
    }
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len().checked_sub(1)? / 2).copied()
}

/// Median over the timed steps (after `warmup`) of one layer × seam.
fn seam_median(r: &Record, layer: usize, seam: Seam, warmup: usize) -> Option<u64> {
    let samples = &r.timings_ns[Record::seam_index(r.n_layers, layer, seam)];
    median(samples.iter().skip(warmup).copied().collect())
}

pub fn bench(args: &BenchArgs, prov: Provenance) -> Result<Status, GateError> {
    if let (Some(base), Some(new)) = (&args.compare, &args.against) {
        return super::bench_compare::compare_receipts(base, new);
    }
    if let Some(receipt) = &args.targets {
        return super::bench_targets::report(receipt, args.ncu.as_deref());
    }
    // Read the base before the run: an unreadable one is refused before minutes of timing.
    let base = args.compare.as_ref().map(|p| super::bench_compare::read("--compare", p)).transpose()?;
    let registry = plan::load_registry(&None)?;
    let request = bench_doors::request(&registry, &args.doors, args.graph)?;
    if let Some(dir) = args.out.as_ref().filter(|d| d.is_file() || d.extension().is_some_and(|e| e == "json")) {
        return Err(GateError::usage(format!(
            "--out {}: bench writes its receipt as run-<id>.json into a directory; give a directory, not a file name",
            dir.display()
        )));
    }
    let backend = plan::resolve_backend(&args.backend, request.require_gpu(&registry))?;
    if backend != BackendKind::Cuda && !args.allow_host {
        return Err(GateError::NoDevice(
            "bench measures a device: no CUDA device is usable here (pass --allow-host to time the host backend)"
                .into(),
        ));
    }
    let pass = memra_runtime::PassShape::new(args.batch, args.columns)?;
    let doors = bench_doors::resolve(&registry, &request, backend, pass)?;
    let lanes = pass.lanes();
    let warmup = args.warmup;
    if doors.graph() && warmup < 2 {
        return Err(GateError::usage(format!(
            "--graph with --warmup {warmup}: the first two steps record and capture the step, so the timed \
             steps would not all be replays (use --warmup 2 or more)"
        )));
    }
    let steps = warmup + args.steps;
    let t0 = Instant::now();
    let model = ModelPlan::from_args(&args.model)?;
    if steps > model.config.max_positions {
        return Err(GateError::usage(format!(
            "--warmup {warmup} + --steps {}: {steps} decode steps need {steps} cached positions, but the model's KV cache holds {} (use --kv-positions)",
            args.steps, model.config.max_positions
        )));
    }
    // Rows: one session per lane (each its own one-token prompt); columns: one session, its
    // steps computed `lanes` at a time. Either way each timed sample is one pass.
    let sessions = if pass.batch > 1 { pass.batch } else { 1 };
    let prompts = (0..sessions).map(|i| vec![1 + i as u32]).collect();
    let subject = model.load(Battery { prompts, gen_tokens: steps })?;
    eprintln!("memra-gates bench: model ready in {:.1}s", t0.elapsed().as_secs_f64());
    let model = &subject.model;
    if let (Some(path), Some(base)) = (&args.compare, &base) {
        let planned = [
            ("preset", subject.model_evidence.preset.clone()),
            ("model digest", subject.model_evidence.digest.clone()),
            ("layers", model.layers.len().to_string()),
            ("batch", pass.batch.to_string()),
            ("columns", pass.columns.to_string()),
            ("backend", crate::receipt::wire_backend(backend).as_str().to_string()),
            ("graph", if doors.graph() { "on" } else { "off" }.to_string()),
            ("doors", doors.identity.clone()),
        ];
        super::bench_compare::precheck(path, base, &planned)?;
    }
    let launch_order = if args.serialized_launches { LaunchOrder::Serialized } else { LaunchOrder::Programmatic };
    let open_opts = OpenOptions { launch_order, ..Default::default() };
    let mut b = open_with(backend, 1, &open_opts)?;
    // Which launch order is timed: what the backend does, not what was asked (a device before
    // sm_90 launches plainly either way).
    let programmatic = b.programmatic_launches();
    let bandwidth = b.copy_bandwidth(args.copy_bytes)?;
    let mut cfg = RunConfig::new(1, Transport::HostBounce, subject.battery.clone())?;
    cfg.doors = doors.set;
    if pass.columns > 1 {
        // Teacher-forced by the single-token run's own tape: every draft is accepted, so every
        // pass computes `lanes` steps and per-pass ÷ lanes is the cost of a token.
        let single = memra_runtime::program::run(model, &cfg, open_with(backend, 1, &open_opts)?.as_mut())?;
        cfg.forced_tokens = Some(single.tokens.iter().map(|t| t[..t.len().saturating_sub(1)].to_vec()).collect());
    }
    cfg.pass = pass;
    // The weights are placed once; the seam-timed run and the two gating runs share them.
    let t = Instant::now();
    let prepared = memra_runtime::program::prepare(model, memra_runtime::program::Layout::of(&cfg), b.as_mut())?;
    eprintln!("memra-gates bench: weights uploaded in {:.1}s", t.elapsed().as_secs_f64());
    let started = Instant::now();
    let record = memra_runtime::program::run_prepared(model, &cfg, b.as_mut(), &prepared)?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    // The same decode timed per whole layer, digests on and off (what gating costs).
    let gating = super::bench_gating::measure(model, &cfg, b.as_mut(), &prepared, warmup, &record)?;
    // Several lanes per pass: which experts each timed pass selected (its floor).
    let routes = if lanes > 1 {
        Some(super::bench_floor::routes(model, &cfg, b.as_mut(), &prepared, &record, warmup)?)
    } else {
        None
    };
    drop(b);
    // The cache holds between 1 and `steps` positions; the middle of the timed range is typical.
    let positions = warmup + args.steps / 2;
    let torch = if args.no_torch {
        Err("--no-torch".to_string())
    } else {
        // Layer 0's median distinct experts per pass: the anchor reads as many.
        let distinct = routes.as_ref().and_then(|r| r.median_distinct(0));
        super::bench_torch::run_torch(args, model, positions, pass, distinct)
    };

    let mut ratios = BTreeMap::new();
    let mut rows = Vec::new();
    for l in 0..model.layers.len() {
        let bytes = layer_bytes(model, l, positions);
        let layer_ns: u64 = Seam::LAYER.iter().filter_map(|s| seam_median(&record, l, *s, warmup)).sum();
        let qkv_ns = seam_median(&record, l, Seam::Qkv, warmup).unwrap_or(0);
        let exp_ns = seam_median(&record, l, Seam::Experts, warmup).unwrap_or(0);
        let o_ns = seam_median(&record, l, Seam::OProj, warmup).unwrap_or(0);
        let floor = |b: u64| bandwidth.map(|bw| b as f64 / bw * 1e9);
        if let (Some(fq), Some(fe), Some(fl)) = (floor(bytes.qkv), floor(bytes.experts), floor(bytes.total())) {
            ratios.insert(format!("L{l}.qkv_over_floor"), qkv_ns as f64 / fq);
            if let Some(fo) = floor(bytes.o_proj).filter(|_| o_ns > 0) {
                ratios.insert(format!("L{l}.o_proj_over_floor"), o_ns as f64 / fo);
            }
            ratios.insert(format!("L{l}.experts_over_floor"), exp_ns as f64 / fe);
            ratios.insert(format!("L{l}.layer_over_floor"), layer_ns as f64 / fl);
        }
        if let Ok(t) = &torch {
            if let Some(us) = t["layer_eager"]["median_us"].as_f64() {
                ratios.insert(format!("L{l}.layer_over_pytorch_eager"), layer_ns as f64 / (us * 1e3));
            }
        }
        rows.push((l, bytes, layer_ns, qkv_ns, exp_ns));
    }
    let floors: Vec<Option<f64>> =
        rows.iter().map(|(_, bytes, ..)| bandwidth.map(|bw| bytes.total() as f64 / bw * 1e9)).collect();
    let torch_graph_us = torch.as_ref().ok().and_then(|t| t["layer_graph"]["median_us"].as_f64());
    let torch_fastest_us = torch.as_ref().ok().and_then(|t| t["fastest"]["median_us"].as_f64());
    ratios.extend(gating.ratios(&floors, torch_graph_us, torch_fastest_us));
    // Table.
    let bw_text = bandwidth.map(|bw| format!("{:.2} TB/s (read+write)", bw / 1e12)).unwrap_or("not measured".into());
    crate::say!("device-to-device copy bandwidth: {bw_text}; {} timed steps after {warmup} warm-up", args.steps);
    if lanes > 1 {
        crate::say!(
            "passes of {} ({lanes} lanes): every latency below is PER PASS; per token = per pass ÷ {lanes} (last table)",
            pass.label()
        );
    }
    crate::say!("doors timed: {} (graph {})", doors.identity, if doors.graph() { "on" } else { "off" });
    if doors.graph() {
        let counter = doors.engagement.get(bench_doors::GRAPH).map_or("graph.replays", String::as_str);
        let replays = record.engaged.get(counter).copied().unwrap_or(0);
        crate::say!(
            "MEMRA_STEP_TP_GRAPH: the whole step replayed {replays} times (recorded on step 0, captured on step 1)"
        );
    }
    crate::say!(
        "{:<6} {:>10} {:>10} {:>10} {:>12} {:>12} {:>12}",
        "layer",
        "bytes MB",
        "layer µs",
        "floor µs",
        "qkv µs/floor",
        "exp µs/floor",
        "layer/floor"
    );
    for (l, bytes, layer_ns, qkv_ns, exp_ns) in &rows {
        let f = |b: u64| bandwidth.map(|bw| b as f64 / bw * 1e6).unwrap_or(f64::NAN);
        crate::say!(
            "{l:<6} {:>10.1} {:>10.1} {:>10.1} {:>5.1}/{:<6.1} {:>5.1}/{:<6.1} {:>12.2}",
            bytes.total() as f64 / 1e6,
            *layer_ns as f64 / 1e3,
            f(bytes.total()),
            *qkv_ns as f64 / 1e3,
            f(bytes.qkv),
            *exp_ns as f64 / 1e3,
            f(bytes.experts),
            *layer_ns as f64 / 1e3 / f(bytes.total()),
        );
    }
    crate::say!(
        "whole layer, one mark pair per layer (gated: digests on; ungated: digests off; seam events: the run above):"
    );
    for line in gating.lines() {
        crate::say!("{line}");
    }
    if let Some(routes) = &routes {
        let layers: Vec<(usize, LayerBytes, u64)> = rows.iter().map(|(l, b, ns, ..)| (*l, b.clone(), *ns)).collect();
        let (lines, r) = super::bench_floor::per_token(
            &pass.label(),
            lanes,
            pass.batch > 1,
            &layers,
            &gating.gated,
            routes,
            bandwidth,
        );
        for line in lines {
            crate::say!("{line}");
        }
        ratios.extend(r);
    }
    if let Some(o) = gating.overhead() {
        crate::say!("gate overhead (digests on vs off, same process): {:.1} %", o * 100.0);
    }
    if let Some(us) = torch_graph_us {
        crate::say!(
            "PyTorch whole layer under CUDA-graph replay, its fastest form ({}): {us:.1} µs",
            torch.as_ref().ok().and_then(|t| t["layer_graph_form"].as_str()).unwrap_or("?")
        );
    }
    if let (Some(us), Some(ours)) = (torch_fastest_us, gating.gated.first()) {
        crate::say!(
            "PyTorch's fastest form of all ({}, the anchor): {us:.1} µs per pass; layer 0 gated {:.1} µs = {:.2}× it",
            torch.as_ref().ok().and_then(|t| t["fastest"]["form"].as_str()).unwrap_or("?"),
            *ours as f64 / 1e3,
            *ours as f64 / 1e3 / us
        );
    }
    match &torch {
        Ok(t) => {
            crate::say!(
                "PyTorch {} on {}: the same layer in every honest form, one process (experts in {}):",
                t["torch"].as_str().unwrap_or("?"),
                t["device"].as_str().unwrap_or("?"),
                t["expert_dtype"].as_str().unwrap_or("?"),
            );
            for line in super::bench_torch::torch_form_lines(t) {
                crate::say!("{line}");
            }
        }
        Err(e) => crate::say!("PyTorch anchor: not run ({e})"),
    }
    for (k, v) in &ratios {
        crate::say!("  {k} = {v:.3}");
    }

    let mut receipt =
        performance_receipt(&subject, &record, backend, &doors, ratios, bandwidth, &torch, wall_ms, prov)?;
    if backend == BackendKind::Cuda {
        receipt.measurements.extra.insert("launch_programmatic".to_string(), f64::from(u8::from(programmatic)));
        crate::say!("kernel launches: {}", if programmatic { "programmatic (sm_90+)" } else { "serialized" });
    }
    if lanes > 1 {
        // The shape is part of the run identity (docs/DESIGN.md §3.6).
        receipt.evidence.config.batch = (pass.batch > 1).then_some(pass.batch);
        receipt.evidence.config.columns = (pass.columns > 1).then_some(pass.columns);
        receipt.run_id = memra_receipts::run_id(&receipt.evidence.config);
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .map_err(|e| GateError::OutDir { dir: dir.clone(), rule: format!("cannot create the directory: {e}") })?;
        let path = memra_receipts::store::write_receipt(dir, &receipt)?;
        crate::say!("performance receipt: {}", path.display());
    }
    let status = match (&args.compare, &base) {
        (Some(path), Some(base)) => super::bench_compare::report(path, base, &receipt)?,
        _ => Status::Passed,
    };
    if receipt.evidence.verdict != Verdict::Pass {
        crate::say!("bench: FAIL: {}", receipt.evidence.reason.as_deref().unwrap_or("the run was trivial"));
        return Ok(Status::Failed);
    }
    Ok(status)
}

#[allow(clippy::too_many_arguments)]
fn performance_receipt(
    subject: &crate::subject::Builtin,
    record: &Record,
    backend: BackendKind,
    doors: &bench_doors::BenchDoors,
    ratios: BTreeMap<String, f64>,
    bandwidth: Option<f64>,
    torch: &Result<serde_json::Value, String>,
    wall_ms: f64,
    prov: Provenance,
) -> Result<Receipt, GateError> {
    let job = crate::job::Job {
        subject: crate::subject::BUILTIN_NAME.to_string(),
        doors_env: doors.env.clone(),
        doors: doors.set,
        class: crate::job::JobClass::Identity,
        engagement: doors.engagement.clone(),
        census: Vec::new(),
        tp: 1,
        transport: Transport::HostBounce,
        backend,
        baseline_tp: 1,
        baseline_transport: Transport::HostBounce,
        not_run: None,
        canary_held_to_doors: false,
        pass: memra_runtime::PassShape::SINGLE,
    };
    let nt = crate::gate::non_triviality(record);
    let idle = doors.not_engaged(record);
    let verdict = if nt.passed() && idle.is_empty() { Verdict::Pass } else { Verdict::Fail };
    let mut extra = BTreeMap::new();
    if let Some(bw) = bandwidth {
        extra.insert("copy_bandwidth_bytes_per_s".to_string(), bw);
    }
    if let Ok(t) = torch {
        extra.extend(super::bench_torch::torch_extra(t));
    }
    let mut r = crate::receipt::receipt_for_record(
        prov.kernel_digest,
        crate::subject::BUILTIN_VERSION,
        &job,
        &subject.model_evidence,
        &subject.battery,
        record,
        wall_ms,
    );
    r.kind = ReceiptKind::Performance;
    r.evidence.verdict = verdict;
    r.evidence.reason = if !idle.is_empty() {
        Some(format!("door(s) not engaged, so the timing is not theirs: {}", idle.join(", ")))
    } else {
        (!nt.passed()).then(|| nt.detail().to_string())
    };
    r.evidence.gates = vec![GateResult { gate: Gate::NonTriviality, verdict, detail: nt.detail().to_string() }];
    r.evidence.performance = Some(rs::PerformanceClaim { performance_claim: true, ratios });
    r.measurements.extra = extra;
    Ok(r)
}
