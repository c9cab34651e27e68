//! `bench --batch 4` on the host backend (METRICS.md, "bench", "pass floor"): the receipt's
//! `L<l>.distinct_experts` — distinct routed experts a pass of four rows selected, the lower median
//! over the timed passes — equals the count made here independently: the routes of each session
//! from a single-token run of the same model and battery (rows are batch-invariant: the
//! rows-and-columns gate), grouped by the passes of a four-row run's `Record::lanes`. It lies
//! between one row's `top_k` and four times it.

use memra_gating::args::{parse_from, Command, Provenance};
use memra_gating::plan::ModelPlan;
use memra_gating::Status;
use memra_runtime::backend::{open, BackendKind};
use memra_runtime::record::{CaptureKey, Seam};
use memra_runtime::{Battery, PassShape, RunConfig, Transport};
use std::collections::{BTreeMap, BTreeSet};

const PROV: Provenance = Provenance { git_rev: "test", kernel_digest: "00", rustc: "test" };
const ROWS: usize = 4;
const WARMUP: usize = 4;
const STEPS: usize = 8;

fn lower_median(mut v: Vec<usize>) -> usize {
    v.sort_unstable();
    v[(v.len() - 1) / 2]
}

#[test]
fn distinct_experts_of_a_four_row_pass_are_the_routes_counted_independently() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, warmup, steps) = (ROWS.to_string(), WARMUP.to_string(), STEPS.to_string());
    let argv = [
        "memra-gates",
        "bench",
        "--backend",
        "host",
        "--allow-host",
        "--no-torch",
        "--preset",
        "small",
        "--batch",
        &rows,
        "--warmup",
        &warmup,
        "--steps",
        &steps,
        "--out",
        dir.path().to_str().unwrap(),
    ];
    let status = memra_gating::run(parse_from(argv, PROV).unwrap(), PROV).unwrap();
    assert_eq!(status, Status::Passed);
    let receipts = memra_receipts::store::load_dir(dir.path()).unwrap();
    let ratios = &receipts[0].evidence.performance.as_ref().expect("a performance receipt").ratios;

    // The same model and battery as bench's: one one-token prompt per row.
    let Command::Bench(args) = parse_from(argv, PROV).unwrap().into_command() else { panic!("not bench") };
    let battery = Battery { prompts: (0..ROWS).map(|i| vec![1 + i as u32]).collect(), gen_tokens: WARMUP + STEPS };
    let model = ModelPlan::from_args(&args.model).unwrap().load(battery.clone()).unwrap().model;
    let (n_layers, k) = (model.layers.len(), model.config.top_k);
    // Each session's routes, from single-token decode.
    let mut single = RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap();
    for prompt in 0..ROWS {
        for step in 0..WARMUP + STEPS {
            for layer in 0..n_layers {
                single.capture.push(CaptureKey { prompt, step, layer, seam: Seam::Router });
            }
        }
    }
    let routes = memra_runtime::program::run(&model, &single, open(BackendKind::Host, 1).unwrap().as_mut()).unwrap();
    // Which pass of a four-row run computed each session's step.
    let mut four = RunConfig::new(1, Transport::HostBounce, battery).unwrap();
    four.pass = PassShape::new(ROWS, 1).unwrap();
    let lanes = memra_runtime::program::run(&model, &four, open(BackendKind::Host, 1).unwrap().as_mut()).unwrap().lanes;
    assert_eq!(lanes.len(), ROWS, "the four-row run recorded no lanes");

    for layer in 0..n_layers {
        let mut per_pass: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for (key, cap) in routes.captures.iter().filter(|(key, _)| key.layer == layer) {
            let (pass, _) = lanes[key.prompt][key.step];
            per_pass.entry(pass).or_default().extend(&cap.bits[..k]);
        }
        let timed: Vec<usize> =
            per_pass.iter().filter(|(pass, _)| **pass as usize >= WARMUP).map(|(_, s)| s.len()).collect();
        assert!(!timed.is_empty());
        let want = lower_median(timed);
        let got = ratios.get(&format!("L{layer}.distinct_experts")).copied();
        assert_eq!(got, Some(want as f64), "L{layer}: the receipt's distinct experts\n{ratios:?}");
        assert!(k <= want && want <= ROWS * k, "L{layer}: {want} distinct of {k} per row × {ROWS} rows");
    }
    // Four rows of `small` do not all pick the same experts, nor all different ones, in every
    // layer: the count says something.
    let counts: BTreeSet<u64> = (0..n_layers).map(|l| ratios[&format!("L{l}.distinct_experts")] as u64).collect();
    assert!(counts.iter().any(|c| *c as usize > k), "every pass selected one row's experts: {counts:?}");
}
