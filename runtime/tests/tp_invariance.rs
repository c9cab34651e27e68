//! TP1 = TP2 = TP4 = TP8 over both host transports, bit for bit, at every layer × seam × step.

use memra_runtime::backend::host::HostBackend;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::record::{Record, Seam};
use memra_runtime::{program, Battery, Canary, RunConfig, Transport};

fn tiny() -> Model {
    generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap()
}

fn run(model: &Model, tp: usize, transport: Transport, battery: &Battery) -> Record {
    let cfg = RunConfig::new(tp, transport, battery.clone()).unwrap();
    let mut b = HostBackend::new(tp).unwrap();
    program::run(model, &cfg, &mut b).unwrap()
}

/// First (prompt, step, seam index) whose digest differs.
fn first_diff(a: &Record, b: &Record) -> Option<(usize, usize, usize)> {
    for (p, (ra, rb)) in a.digests.iter().zip(&b.digests).enumerate() {
        for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
            if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                return Some((p, s, i));
            }
        }
    }
    None
}

#[test]
fn every_tp_and_transport_equals_tp1_host_bounce() {
    let model = tiny();
    let battery = Battery::default_for(model.config.vocab, 1);
    let oracle = run(&model, 1, Transport::HostBounce, &battery);
    assert_eq!(oracle.digests.len(), battery.prompts.len());
    for tp in [1, 2, 4, 8] {
        for t in [Transport::HostBounce, Transport::NativeP2p] {
            let r = run(&model, tp, t, &battery);
            assert_eq!(first_diff(&oracle, &r), None, "TP{tp} {t:?} diverges from TP1 host-bounce");
            assert_eq!(r.tokens, oracle.tokens);
        }
    }
    // Non-triviality: tokens vary and digests vary across steps.
    let all: Vec<u32> = oracle.tokens.iter().flatten().copied().collect();
    assert!(all.iter().any(|t| *t != all[0]), "every generated token is {}", all[0]);
}

#[test]
fn reversed_kblocks_are_caught_at_o_join() {
    let model = tiny();
    let battery = Battery { prompts: vec![vec![1, 2, 3]], gen_tokens: 2 };
    let oracle = run(&model, 1, Transport::HostBounce, &battery);
    let mut cfg = RunConfig::new(2, Transport::HostBounce, battery).unwrap();
    cfg.doors.canary = Some(Canary::ReverseKBlocks);
    let mut b = HostBackend::new(2).unwrap();
    let r = program::run(&model, &cfg, &mut b).unwrap();
    let (p, s, i) = first_diff(&oracle, &r).expect("the reversed reduction must be detected");
    assert_eq!((p, s), (0, 0));
    assert_eq!(Record::seam_at(oracle.n_layers, i), (0, Seam::OJoin));
}
