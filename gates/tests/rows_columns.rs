//! Rows and columns as matrix axes (docs/DESIGN.md §3.6), through the real `run` command in
//! process on the host backend: a run of several rows or columns per pass is gated against the
//! single-token TP1 oracle — the batch-invariance and verify = decode gate — its receipts carry the
//! axis, a clean run passes and shows that its passes really held several lanes, and a planted
//! defect fails with its first divergence naming the row or column beside prompt, step, layer
//! and seam (the negative control).

use memra_gating::args::{parse_from, Provenance};
use memra_gating::Status;
use memra_receipts::schema::{LaneAxis, Receipt, Verdict};
use std::path::Path;

const PROV: Provenance = Provenance { git_rev: "test", kernel_digest: "00", rustc: "test" };

/// `run` on the tiny model (host, 2 prompts, 3 generated tokens) with `extra` flags; the status
/// and the receipts written.
fn run(out: &Path, extra: &[&str]) -> (Status, Vec<Receipt>) {
    let out_s = out.to_str().unwrap();
    let mut args = vec![
        "memra-gates",
        "run",
        "--backend",
        "host",
        "--preset",
        "tiny",
        "--prompts",
        "2",
        "--gen-tokens",
        "3",
        "--quiet",
        "--out",
        out_s,
    ];
    args.extend_from_slice(extra);
    let cli = parse_from(args, PROV).unwrap();
    let status = memra_gating::run(cli, PROV).unwrap();
    (status, memra_receipts::store::load_dir(out).unwrap())
}

#[test]
fn a_clean_multi_lane_run_passes_against_the_single_token_oracle_and_is_not_vacuous() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--tp", "1,2", "--transport", "host-bounce", "--batch", "1,4", "--columns", "1,4"];
    let (status, receipts) = run(dir.path(), &flags);
    assert_eq!(status, Status::Passed);
    // 1×1, b4 and t4 (b4×t4 is no pass) at TP1 and TP2.
    let mut shapes: Vec<(usize, Option<usize>, Option<usize>)> =
        receipts.iter().map(|r| (r.evidence.config.tp, r.evidence.config.batch, r.evidence.config.columns)).collect();
    shapes.sort();
    assert_eq!(
        shapes,
        vec![
            (1, None, None),
            (1, None, Some(4)),
            (1, Some(4), None),
            (2, None, None),
            (2, None, Some(4)),
            (2, Some(4), None)
        ]
    );
    let single = receipts.iter().find(|r| r.evidence.config.tp == 1 && r.evidence.config.lanes() == 1).unwrap();
    for r in &receipts {
        let ev = &r.evidence;
        assert_eq!(ev.verdict, Verdict::Pass, "{}: {:?}", ev.config.label(), ev.reason);
        // Every lane's digests and tokens are the single-token run's.
        assert_eq!(ev.digests, single.evidence.digests, "{}", ev.config.label());
        assert_eq!(ev.token_tape_digest, single.evidence.token_tape_digest);
        let identity = ev.gates.iter().find(|g| g.gate == memra_receipts::Gate::Identity).unwrap();
        if ev.config.lanes() > 1 {
            // Not vacuous: the receipt says how many passes held several lanes.
            let what = if ev.config.batch.is_some() { "rows" } else { "columns" };
            assert!(identity.detail.contains(&format!("passes computed several {what}")), "{}", identity.detail);
            assert!(!identity.detail.contains(" 0 of "), "{}", identity.detail);
            assert!(ev.config.label().ends_with(&format!(" {}", ev.config.pass_label())));
        }
    }
    let ids: std::collections::BTreeSet<&str> = receipts.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids.len(), receipts.len(), "the pass shape is part of the run identity");
}

/// The negative control: the flip-bit canary (layer 1 experts, step 2 of every prompt) under rows
/// and columns. The gate fails at p0 s2, and names the lane the runtime computed it in: in rows,
/// session 0's lane; in columns, column 2 of the prefill pass (every battery prompt has ≥ 4
/// tokens). Without the canary the same shapes pass (the test above).
#[test]
fn a_planted_defect_fails_naming_the_row_or_the_column() {
    for (flag, value, axis) in [("--batch", "2", LaneAxis::Row), ("--columns", "4", LaneAxis::Column)] {
        let dir = tempfile::tempdir().unwrap();
        let flags = ["--tp", "2", "--transport", "host-bounce", flag, value, "--door", "canary_flip_bit"];
        let (status, receipts) = run(dir.path(), &flags);
        assert_eq!(status, Status::Failed, "{flag} {value}");
        assert_eq!(receipts.len(), 1);
        let ev = &receipts[0].evidence;
        assert_eq!(ev.verdict, Verdict::Fail, "{flag} {value}: {:?}", ev.reason);
        let d = ev.first_divergence.as_ref().expect("a first divergence");
        assert_eq!((d.prompt, d.step, d.layer, d.seam.as_str()), (0, 2, 1, "experts"), "{flag} {value}");
        let lane = d.lane.unwrap_or_else(|| panic!("{flag} {value}: the divergence names no lane: {}", d.short()));
        assert_eq!(lane.axis, axis, "{flag} {value}");
        match axis {
            // Session 0 starts in lane 0 of pass 0 and keeps its lane: its step 2 is pass 2.
            LaneAxis::Row => assert_eq!((lane.index, lane.pass), (0, 2), "{}", d.short()),
            // Prompt 0 is prefilled 4 tokens per pass: its step 2 is column 2 of pass 0.
            LaneAxis::Column => assert_eq!((lane.index, lane.pass), (2, 0), "{}", d.short()),
        }
        let word = if axis == LaneAxis::Row { "row" } else { "column" };
        assert!(ev.reason.as_deref().unwrap_or_default().contains(word), "{flag}: {:?}", ev.reason);
    }
}

/// Bad values are refused before any work, with the runtime's rule.
#[test]
fn pass_shapes_outside_the_rule_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, needle) in [
        (&["--batch", "3"][..], "1, 2, 4 or 8 sessions"),
        (&["--columns", "16"][..], "1, 2, 4 or 8 consecutive tokens"),
        (&["--batch", "2", "--columns", "4"][..], "not both"),
        (&["--batch", "2,2"][..], "given twice"),
    ] {
        let mut args = vec!["memra-gates", "run", "--backend", "host", "--out", dir.path().to_str().unwrap()];
        args.extend_from_slice(flags);
        let err = memra_gating::run(parse_from(args, PROV).unwrap(), PROV).unwrap_err().to_string();
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}

/// The default shapes: every configuration single-token; `--matrix all` adds b2/b4/b8/t2/t4/t8
/// at every TP and transport with the base door set only, any other matrix b4 and t4 at TP1 and
/// TP2; `--explain` says so, and names an excluded rows × columns pair with its rule.
#[test]
fn default_shapes_and_their_explanation() {
    use memra_gating::matrix::{enumerate, MatrixKind, Passes};
    use memra_gating::registry::{BackendKind, Registry};
    use memra_runtime::Transport;
    let r = Registry::builtin().unwrap();
    let t = [Transport::HostBounce, Transport::NativeP2p];
    for (kind, shapes, tps) in [
        (MatrixKind::All, vec!["b2", "b4", "b8", "t2", "t4", "t8"], vec![1, 2, 4, 8]),
        (MatrixKind::Single, vec!["b4", "t4"], vec![1, 2]),
    ] {
        let single = enumerate(&r, &kind, &[1, 2, 4, 8], &t, &[BackendKind::Host]).unwrap();
        let plan = Passes::from_flags(Some(&kind), None, None).unwrap().apply(single.clone(), &Default::default(), &r);
        let multi: Vec<_> = plan.legal.iter().filter(|c| c.pass().lanes() > 1 && c.doors.is_empty()).collect();
        assert_eq!(multi.len(), shapes.len() * tps.len() * t.len(), "{kind:?}");
        assert!(multi.iter().all(|c| tps.contains(&c.tp)), "{kind:?}: the base set at {tps:?}");
        for s in &shapes {
            assert!(multi.iter().any(|c| c.pass().label() == *s), "{kind:?}: {s} missing");
        }
        // Every configuration runs at a shape all its doors have work at; a single-token
        // configuration whose doors have none there runs at a shape they allow instead.
        let refused = |c: &memra_gating::matrix::Configuration| {
            c.doors.iter().find_map(|id| r.door(id).unwrap().not_at_pass(c.pass()))
        };
        assert!(plan.legal.iter().all(|c| refused(c).is_none()), "{kind:?}: a door runs where it has no work");
        for c in &single.legal {
            let kept = plan.legal.contains(c);
            let moved = plan.legal.iter().any(|m| m.doors == c.doors && m.tp == c.tp && m.transport == c.transport);
            assert!(kept || (refused(c).is_some() && moved), "{kind:?}: {} lost", c.label());
        }
        let explain = plan.explain();
        assert!(
            explain.contains("passes: every configuration single-token") && explain.contains("--batch 1,2,4,8"),
            "{explain}"
        );
    }
    let given = Passes::from_flags(Some(&MatrixKind::Single), Some(&[1, 2]), Some(&[1, 8])).unwrap();
    let single = enumerate(&r, &MatrixKind::Single, &[2], &t, &[BackendKind::Host]).unwrap();
    let plan = given.apply(single.clone(), &Default::default(), &r);
    // 1×1, b2 and t8 for every configuration: run, or NOT-APPLICABLE where a door has no work.
    for c in &single.legal {
        for s in [(1, 1), (2, 1), (1, 8)] {
            let c = c.clone().with_pass(memra_runtime::PassShape::new(s.0, s.1).unwrap());
            let na = plan.not_applicable.iter().any(|n| n.config == c && n.reason.contains(" at "));
            assert!(plan.legal.contains(&c) || na, "{} is neither run nor NOT-APPLICABLE", c.label());
        }
    }
    assert!(plan.explain().contains("EXCLUDED b2×t8") && plan.explain().contains("not both"), "{}", plan.explain());
}

/// LEN_MIRROR_LAZY's engagement gate, with the registry's own census declaration, on real host
/// runs: witnessed (PASS) in single-token decode and rows, where the door skips the length
/// copies; VOID in a columns run, where its verify/prefill passes read every mirror and the door
/// yields — the flag set, the mechanism off, the census the door-off one.
#[test]
fn len_mirror_lazy_is_witnessed_outside_columns_and_void_in_them() {
    use memra_gating::gate;
    use memra_runtime::backend::host::HostBackend;
    use memra_runtime::model::{gen::generate, ModelConfig};
    use memra_runtime::{program, Battery, PassShape, RunConfig, Transport};
    let decl = crate::registry_decl("len_mirror_lazy");
    let m = generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap();
    let census = |shape: PassShape, lazy: bool| {
        let mut cfg = RunConfig::new(2, Transport::NativeP2p, Battery::default_for(m.config.vocab, 3)).unwrap();
        cfg.pass = shape;
        cfg.doors.len_mirror_lazy = lazy;
        program::run(&m, &cfg, &mut HostBackend::new(2).unwrap()).unwrap().census.counts().clone()
    };
    for (b, t) in [(1, 1), (4, 1), (1, 4)] {
        let shape = PassShape::new(b, t).unwrap();
        let (on, off) = (census(shape, true), census(shape, false));
        let o = gate::engagement(&on, &[(&decl, Ok(off))]);
        assert_eq!(o.passed(), t == 1, "{shape:?}: {}", o.detail());
        if t > 1 {
            assert!(o.detail().contains("len_mirror_lazy"), "{}", o.detail());
        }
    }
}
