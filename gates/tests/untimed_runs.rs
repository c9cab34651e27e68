//! The runs whose timings nobody reads go without marks (`RunSpec::timing`: a job's determinism
//! re-run, census and class baselines). That must change no evidence — so the determinism gate
//! still compares equal runs, and a census baseline still counts what the job's run counts — and
//! must really drop the marks: a timed run has every seam's samples, an untimed one none.

use memra_gating::plan::{battery_for, ModelPlan};
use memra_gating::record_evidence::sections;
use memra_gating::subject::RunSpec;
use memra_runtime::backend::BackendKind;
use memra_runtime::model::ModelConfig;
use memra_runtime::{ExpertFormat, Timing, Transport};

#[test]
fn a_run_without_marks_has_the_same_evidence_and_no_timings() {
    let config = ModelConfig::preset("tiny", None).unwrap();
    let battery = battery_for(&config, 1, Some(2), Some(3)).unwrap();
    let subject = ModelPlan::generated(config, 1, 0.0).unwrap().load(battery).unwrap();
    let spec = |timing| RunSpec {
        tp: 2,
        transport: Transport::NativeP2p,
        timing,
        ..RunSpec::oracle(BackendKind::Host, ExpertFormat::E4m3)
    };
    let timed = subject.run_canonical(spec(Timing::Seams)).unwrap();
    let untimed = subject.run_canonical(spec(Timing::Off)).unwrap();
    assert_eq!(sections(&timed), sections(&untimed), "marks are not evidence");
    assert!(!timed.timings_ns.is_empty() && timed.timings_ns.iter().all(|t| !t.is_empty()), "every seam timed");
    assert!(untimed.timings_ns.iter().all(Vec::is_empty), "no seam timed");
    assert!(untimed.layer_timings_ns.iter().all(Vec::is_empty), "no layer timed");
}
