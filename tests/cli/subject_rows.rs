//! Rows and columns through the subject protocol (version 2, docs/subject-protocol.md, section 9): the
//! engine written from the documents (`scripts/subjects/docs_engine.py`, numpy on the host) runs
//! rows — the dense projections of every row of a pass in one product — and is gated at b2 and b4
//! against the single-token oracle; a batch-dependent defect planted in a copy of it (rows r > 0
//! fold the o projection's K-blocks in reverse) FAILs naming the row, while its single-token run
//! still PASSes; it runs columns — prefill and verify passes of T consecutive tokens, causal
//! within the pass — and is gated at t2, t4 and t8 on `tiny` and `edge`, while its two planted
//! verify defects (partitions chosen by T; a column reading the next column's key) FAIL naming
//! the column; a shape outside a version 2 manifest, and any multi-lane shape of a version 1
//! subject, is NOT-APPLICABLE with the reason; bad shape fields are refused before any work; and
//! the built-in runtime as a protocol 2 subject writes byte-identical evidence at b4 and t4 (and
//! for the batch canary's FAIL) to the same plans in process.
//! Needs python3 with numpy (`.ci/run` installs it before the tests).

use crate::util::*;
use memra_receipts::schema::{Gate, LaneAxis, Verdict};
use memra_receipts::Receipt;
use std::path::{Path, PathBuf};

const ENGINE: &str = "scripts/subjects/docs_engine.py";
const MANIFEST: &str = "scripts/subjects/docs_engine.toml";
/// The line of docs_engine.py that folds the o projection's partials of every row of a pass.
const O_JOIN: &str = "        oj = fold(op)  # [B][hidden]\n";

/// docs_engine.py and its manifest in `dir`, the engine's text changed by `engine`, the
/// manifest's by `manifest`; returns the manifest's path.
fn engine_copy(dir: &Path, engine: impl Fn(&str) -> String, manifest: impl Fn(&str) -> String) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let text = std::fs::read_to_string(repo(ENGINE)).unwrap();
    std::fs::write(dir.join("docs_engine.py"), engine(&text)).unwrap();
    let path = dir.join("docs_engine.toml");
    std::fs::write(&path, manifest(&std::fs::read_to_string(repo(MANIFEST)).unwrap())).unwrap();
    path
}

/// A short host plan of `tiny` through `manifest`: three prompts (rows need sessions), two
/// generated tokens, at the shapes `shapes` asks for.
fn plan_out(manifest: &Path, out: &Path, shapes: &[&str], code: i32) -> (Output, Vec<Receipt>) {
    plan_with(manifest, out, &["--preset", "tiny", "--gen-tokens", "2"], shapes, &[], code)
}

/// A host plan of three prompts through `manifest`: `model` (the preset and generated tokens),
/// `shapes`, the environment `env` added.
fn plan_with(
    manifest: &Path,
    out: &Path,
    model: &[&str],
    shapes: &[&str],
    env: &[(&str, &str)],
    code: i32,
) -> (Output, Vec<Receipt>) {
    let mut args = vec!["run", "--subject", s(manifest), "--backend", "host", "--tp", "1"];
    args.extend(["--transport", "host-bounce", "--prompts", "3", "--quiet", "--out", s(out)]);
    args.extend_from_slice(model);
    args.extend_from_slice(shapes);
    let o = run_env(&args, env);
    o.expect_code(code);
    let receipts = read_receipts(out).into_iter().map(|r| r.1).collect();
    (o, receipts)
}

fn at(receipts: &[Receipt], batch: usize, columns: usize) -> &Receipt {
    receipts
        .iter()
        .find(|r| r.evidence.config.batch.unwrap_or(1) == batch && r.evidence.config.columns.unwrap_or(1) == columns)
        .unwrap_or_else(|| panic!("no receipt at batch {batch} columns {columns}"))
}

fn reason(r: &Receipt) -> String {
    r.evidence.reason.clone().unwrap_or_default()
}

#[test]
fn the_docs_engine_runs_rows_bit_identical_and_a_row_defect_fails_naming_the_row() {
    let tmp = tempdir();
    let out = tmp.path().join("rows");
    let (_, receipts) = plan_out(&repo(MANIFEST), &out, &["--batch", "1,2,4"], 0);
    for b in [1, 2, 4] {
        let r = at(&receipts, b, 1);
        assert_eq!(r.evidence.verdict, Verdict::Pass, "b{b}: {}", reason(r));
    }
    // Rows really ran: the identity gate says how many passes held several rows.
    for b in [2, 4] {
        let detail: Vec<&str> = at(&receipts, b, 1).evidence.gates.iter().map(|g| g.detail.as_str()).collect();
        assert!(
            detail.iter().any(|d| d.contains("bit-identical to the single-token TP1 reference")
                && d.contains("passes computed several rows")),
            "b{b}: {detail:?}"
        );
    }
    // Negative control: rows r > 0 fold the o projection's K-blocks in reverse (a summation
    // order that depends on the row, as a kernel chosen by batch size may). Single-token passes
    // are untouched and PASS; b2 FAILs at o_join, in row 1. Its manifest declares no columns:
    // t2 is NOT-APPLICABLE with the rule, never run.
    let planted = engine_copy(
        &tmp.path().join("planted"),
        |t| {
            assert!(t.contains(O_JOIN), "docs_engine.py no longer has the line the control plants in");
            t.replace(
                O_JOIN,
                "        oj = np.stack([fold(op[:, r] if r == 0 else op[::-1, r]) for r in range(op.shape[1])])\n",
            )
        },
        |m| {
            assert!(m.contains("\ncolumns = [1, 2, 4, 8]"), "docs_engine.toml declares its columns");
            m.lines().filter(|l| !l.starts_with("columns = ")).collect::<Vec<_>>().join("\n")
        },
    );
    let out = tmp.path().join("planted-out");
    let (o, receipts) = plan_out(&planted, &out, &["--batch", "1,2", "--columns", "1,2"], 1);
    let t2 = at(&receipts, 1, 2);
    assert_eq!(t2.evidence.verdict, Verdict::NotApplicable);
    assert!(
        reason(t2).contains("subject docs-engine 0.1.0 (protocol 2) runs batch [1, 2, 4, 8] and columns [1] only: t2 is outside its manifest"),
        "{}",
        reason(t2)
    );
    assert_eq!(at(&receipts, 1, 1).evidence.verdict, Verdict::Pass, "{}", reason(at(&receipts, 1, 1)));
    let b2 = at(&receipts, 2, 1);
    assert_eq!(b2.evidence.verdict, Verdict::Fail);
    let d = b2.evidence.first_divergence.as_ref().expect("a FAIL names its first divergence");
    assert_eq!(d.seam, "o_join", "{d:?}");
    let lane = d.lane.expect("a multi-lane FAIL names its lane");
    assert_eq!((lane.axis, lane.index), (LaneAxis::Row, 1), "{d:?}");
    assert!(o.stdout.contains("row 1") || o.stderr.contains("row 1"), "{}", o.transcript());
}

/// Columns: every prefill and verify pass of T tokens gives each column the single-token step's
/// bits at its position, on `tiny` (six generated tokens: verify passes with drafts, rejected
/// columns thrown away and computed again; as many passes as the built-in runtime's) and on `edge`. Two defects a verify path can have,
/// planted through `DOCS_ENGINE_PLANT`, leave the single-token run PASSing and FAIL naming the
/// column the definition predicts.
#[test]
fn the_docs_engine_runs_columns_bit_identical_and_verify_defects_fail_naming_the_column() {
    let tmp = tempdir();
    let models: [(&str, &[&str], &str); 2] = [
        ("tiny", &["--preset", "tiny", "--gen-tokens", "6"], "1,2,4,8"),
        ("edge", &["--preset", "edge", "--gen-tokens", "3"], "1,4"),
    ];
    for (name, model, shapes) in models {
        let out = tmp.path().join(name);
        let (_, receipts) = plan_with(&repo(MANIFEST), &out, model, &["--columns", shapes], &[], 0);
        let ts: Vec<usize> = shapes.split(',').map(|t| t.parse().unwrap()).collect();
        assert_eq!(receipts.len(), ts.len(), "{name}");
        for t in ts {
            let r = at(&receipts, 1, t);
            assert_eq!(r.evidence.verdict, Verdict::Pass, "{name} t{t}: {}", reason(r));
            if t > 1 {
                // Columns really ran: the identity gate counts the passes of several columns.
                let identity = r.evidence.gates.iter().find(|g| g.gate == Gate::Identity).expect("an identity gate");
                assert!(
                    identity.detail.contains("passes computed several columns"),
                    "{name} t{t}: {}",
                    identity.detail
                );
            }
        }
        if name == "tiny" {
            // The verify passes drafted (prompt lookup) and threw rejected columns away.
            let census = &at(&receipts, 1, 8).evidence.census;
            assert!(census.get("docs_engine.rejected_columns").is_some_and(|&n| n > 0), "{census:?}");
            // Its schedule is the runtime's: the built-in runtime, in process, on the same plan
            // at t8 counts the same passes and the same passes of several columns.
            let builtin = tmp.path().join("builtin-t8");
            let mut args =
                vec!["run", "--backend", "host", "--tp", "1", "--transport", "host-bounce", "--prompts", "3"];
            args.extend(model);
            args.extend(["--columns", "8", "--quiet", "--out", s(&builtin)]);
            run(&args).expect_code(0);
            let theirs: Vec<Receipt> = read_receipts(&builtin).into_iter().map(|r| r.1).collect();
            let passes = |r: &Receipt| {
                let d = &r.evidence.gates.iter().find(|g| g.gate == Gate::Identity).expect("an identity gate").detail;
                d[d.find("t8: ").unwrap_or_else(|| panic!("no pass count in {d}"))..].to_string()
            };
            assert_eq!(passes(at(&receipts, 1, 8)), passes(at(&theirs, 1, 8)));
        }
    }

    // Negative controls. `causality`: each column also attends to the key of the column after
    // it, so column 0 of the first pass (prompt 0's prefill) already differs at L0.attn.
    // `verify_partitions`: a pass of T columns cuts attention into partitions of 32 >> T
    // positions, so at t4 (partitions of 2) the first step attending over more than 2
    // positions — step 2, column 2 of the same prefill pass — differs.
    let plants: [(&str, &str, usize, usize); 2] = [("causality", "2", 2, 0), ("verify_partitions", "4", 4, 32 >> 4)];
    for (plant, shape, t, step) in plants {
        let out = tmp.path().join(plant);
        let model = ["--preset", "tiny", "--gen-tokens", "2"];
        let shapes = ["--columns", &format!("1,{shape}")];
        let (o, receipts) = plan_with(&repo(MANIFEST), &out, &model, &shapes, &[("DOCS_ENGINE_PLANT", plant)], 1);
        assert_eq!(at(&receipts, 1, 1).evidence.verdict, Verdict::Pass, "{plant}: {}", reason(at(&receipts, 1, 1)));
        let r = at(&receipts, 1, t);
        assert_eq!(r.evidence.verdict, Verdict::Fail, "{plant}");
        let d = r.evidence.first_divergence.as_ref().expect("a FAIL names its first divergence");
        assert_eq!((d.prompt, d.step, d.layer, d.seam.as_str()), (0, step, 0, "attn"), "{plant}: {d:?}");
        let lane = d.lane.expect("a multi-lane FAIL names its lane");
        assert_eq!((lane.axis, lane.index, lane.pass), (LaneAxis::Column, step, 0), "{plant}: {d:?}");
        let named = format!("column {step} of pass 0");
        assert!(o.stdout.contains(&named) || o.stderr.contains(&named), "{plant}: {}", o.transcript());
    }
}

#[test]
fn a_protocol_1_subject_is_not_applicable_at_rows_with_the_reason() {
    let tmp = tempdir();
    let v1 = engine_copy(&tmp.path().join("v1"), str::to_string, |m| {
        let m = m.replace("protocol = 2", "protocol = 1");
        m.lines().filter(|l| !l.starts_with("batch = ") && !l.starts_with("columns = ")).collect::<Vec<_>>().join("\n")
    });
    let (_, receipts) = plan_out(&v1, &tmp.path().join("out"), &["--batch", "1,4"], 0);
    // The single-token run still works over protocol 1 (a version 1 battery file, no lanes).
    assert_eq!(at(&receipts, 1, 1).evidence.verdict, Verdict::Pass, "{}", reason(at(&receipts, 1, 1)));
    let b4 = at(&receipts, 4, 1);
    assert_eq!(b4.evidence.verdict, Verdict::NotApplicable);
    assert!(
        reason(b4).contains(
            "subject docs-engine 0.1.0 (protocol 1) runs single-token passes only: b4 is outside its manifest"
        ),
        "{}",
        reason(b4)
    );
}

#[test]
fn bad_shape_fields_are_refused_before_any_work() {
    let tmp = tempdir();
    let good = std::fs::read_to_string(repo(MANIFEST)).unwrap();
    assert!(good.contains("batch = [1, 2, 4, 8]"), "docs_engine.toml declares its rows");
    assert!(good.contains("columns = [1, 2, 4, 8]"), "docs_engine.toml declares its columns");
    let cases: [(&str, String, &str); 5] = [
        ("three", good.replace("batch = [1, 2, 4, 8]", "batch = [1, 3]"), "batch = \"[1, 3]\": 3 is no pass size"),
        ("twice", good.replace("batch = [1, 2, 4, 8]", "batch = [1, 2, 2]"), "2 is listed twice"),
        ("no-one", good.replace("columns = [1, 2, 4, 8]", "columns = [2, 4]"), "columns = \"[2, 4]\": the list holds 1"),
        (
            "v1",
            good.replace("protocol = 2", "protocol = 1"),
            "batch = \"[1, 2, 4, 8]\": protocol 1 runs single-token passes only; a subject that runs rows or columns declares protocol = 2",
        ),
        ("unknown", good.replace("batch = [1, 2, 4, 8]", "rows = [1, 2]"), "unknown field `rows`"),
    ];
    for (what, text, fragment) in cases {
        let manifest = tmp.path().join(format!("{what}.toml"));
        std::fs::write(&manifest, text).unwrap();
        let out = tmp.path().join(what);
        let args = ["run", "--subject", s(&manifest), "--backend", "host", "--preset", "tiny", "--out", s(&out)];
        run(&args).expect_code(2).expect_stderr(&[fragment]);
        assert!(!out.exists(), "{what}: the refused plan created its --out");
    }
}

/// The built-in runtime as a protocol 2 subject (its manifest with every shape the runtime runs):
/// rows and columns through the protocol — the battery's `pass`, the tape's `p{p}.lanes` — write
/// byte-identical evidence to the same plan in process, at TP1 and TP2; and so does the batch
/// canary (a K split chosen by the number of rows), which FAILs both ways naming its row.
#[test]
fn the_builtin_runtime_through_protocol_2_writes_byte_identical_evidence_at_rows_and_columns() {
    let tmp = tempdir();
    let text = std::fs::read_to_string(repo("scripts/subjects/builtin.toml")).unwrap();
    assert!(text.contains("\nprotocol = 1\n"), "builtin.toml is a protocol 1 manifest");
    let v2 = tmp.path().join("builtin-v2.toml");
    std::fs::write(
        &v2,
        text.replace("\nprotocol = 1\n", "\nprotocol = 2\nbatch = [1, 2, 4, 8]\ncolumns = [1, 2, 4, 8]\n"),
    )
    .unwrap();
    let plans: [(&str, &[&str], i32); 2] = [
        ("shapes", &["--tp", "1,2", "--batch", "1,4", "--columns", "1,4"], 0),
        ("canary", &["--tp", "1", "--batch", "4", "--door", "MEMRA_CANARY_BATCH_KSPLIT"], 1),
    ];
    for (name, extra, code) in plans {
        let (a, b) = (tmp.path().join(format!("{name}-in-process")), tmp.path().join(format!("{name}-protocol")));
        let mut common = vec!["run", "--backend", "host", "--quiet", "--preset", "tiny", "--prompts", "3"];
        common.extend(["--gen-tokens", "3", "--transport", "host-bounce"]);
        common.extend_from_slice(extra);
        let with_out = |out: &Path, subject: bool| {
            let mut v = common.clone();
            v.extend(["--out", s(out)]);
            if subject {
                v.extend(["--subject", s(&v2)]);
            }
            run(&v).expect_code(code);
        };
        with_out(&a, false);
        with_out(&b, true);
        assert_eq!(super::subject::differing(&a, &b), Vec::<String>::new(), "{name}: evidence differs");
        let receipts: Vec<Receipt> = read_receipts(&b).into_iter().map(|r| r.1).collect();
        let multi = receipts.iter().filter(|r| r.evidence.config.lanes() > 1).count();
        assert!(multi >= 1 && receipts.iter().all(|r| r.evidence.config.subject == "memra-runtime"), "{name}");
        if code == 1 {
            let d = receipts[0].evidence.first_divergence.as_ref().expect("the canary FAILs with a divergence");
            assert_eq!(d.lane.map(|l| l.axis), Some(LaneAxis::Row), "{d:?}");
        } else {
            assert!(receipts.iter().all(|r| r.evidence.verdict == Verdict::Pass), "{name}");
            assert_eq!(multi, 4, "{name}: b4 and t4 at TP1 and TP2");
        }
    }
}

/// scripts/subjects/torch_subject.py's rows and columns without PyTorch (not installed on the
/// host): through a numpy stand-in for the torch calls it makes (`tests/subjects/torch_shim/`),
/// its single-token run PASSes the NUMERIC gates and its b2 and t2 runs are judged, never an
/// ERROR: PASS, or — where the matrix library computes a [2, in] product otherwise than a
/// [1, in] one, as numpy's BLAS may — a class-identity FAIL that names its row or column. The numbers are numpy's, not torch's: this holds the
/// subject's protocol side (schedule, lanes, tape), the GPU run says what torch does.
#[test]
fn the_torch_subject_runs_rows_and_columns_through_a_numpy_stand_in() {
    let tmp = tempdir();
    let out = tmp.path().join("out");
    let manifest = repo("scripts/subjects/torch.toml");
    let shim = repo("tests/subjects/torch_shim");
    let mut args = vec!["run", "--subject", s(&manifest), "--backend", "host", "--tp", "1"];
    args.extend(["--transport", "host-bounce", "--preset", "tiny", "--prompts", "3", "--gen-tokens", "2"]);
    args.extend(["--batch", "1,2", "--columns", "1,2", "--quiet", "--out", s(&out)]);
    let o = run_env(&args, &[("PYTHONPATH", s(&shim))]);
    assert!(matches!(o.code, Some(0 | 1)), "{}", o.transcript());
    let receipts: Vec<Receipt> = read_receipts(&out).into_iter().map(|r| r.1).collect();
    let b1 = at(&receipts, 1, 1);
    assert_eq!(b1.evidence.verdict, Verdict::Pass, "{}", reason(b1));
    assert!(b1.evidence.config.subject == "torch-reference");
    for (b, t, axis) in [(2, 1, LaneAxis::Row), (1, 2, LaneAxis::Column)] {
        let r = at(&receipts, b, t);
        match r.evidence.verdict {
            Verdict::Pass => {}
            Verdict::Fail => {
                let d = r.evidence.first_divergence.as_ref().expect("a FAIL names its first divergence");
                assert_eq!(d.lane.map(|l| l.axis), Some(axis), "{d:?}");
                let class = r.evidence.gates.iter().find(|g| g.gate == Gate::ClassIdentity).expect("class identity");
                assert_eq!(class.verdict, Verdict::Fail, "b{b} t{t}: only class identity may fail: {}", class.detail);
                let failed: Vec<Gate> =
                    r.evidence.gates.iter().filter(|g| g.verdict == Verdict::Fail).map(|g| g.gate).collect();
                assert_eq!(failed, [Gate::ClassIdentity], "b{b} t{t}");
            }
            other => panic!("b{b} t{t}: {other:?}: {}", reason(r)),
        }
    }
    // The columns ran as columns: teacher-forced drafts are the oracle's tokens, all accepted.
    let tape = at(&receipts, 1, 2).evidence.gates.iter().find(|g| g.gate == Gate::ArgmaxTape).expect("an argmax tape");
    assert!(tape.detail.contains("passes computed several columns"), "{}", tape.detail);
    // Negative control: the same subject scheduling one row per pass while the run asks for b2
    // (its helper fills lane 0 only) labels honest lanes but batches nothing: the NUMERIC gates
    // must not pass it under the b2 name.
    let dir = tmp.path().join("one-row");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["torch_subject.py", "torch.toml"] {
        std::fs::copy(repo(&format!("scripts/subjects/{f}")), dir.join(f)).unwrap();
    }
    let helper = std::fs::read_to_string(repo("scripts/subjects/memra_subject.py")).unwrap();
    let cut = "        for j in range(b):\n            if slots[j] is None and pss >= j and queue:\n";
    assert!(helper.contains(cut), "memra_subject.py no longer has the line the control plants in");
    std::fs::write(dir.join("memra_subject.py"), helper.replace(cut, &cut.replace("range(b)", "range(1)"))).unwrap();
    let (manifest, out) = (dir.join("torch.toml"), tmp.path().join("one-row-out"));
    let mut args = vec!["run", "--subject", s(&manifest), "--backend", "host", "--tp", "1"];
    args.extend(["--transport", "host-bounce", "--preset", "tiny", "--prompts", "3", "--gen-tokens", "2"]);
    args.extend(["--batch", "2", "--quiet", "--out", s(&out)]);
    run_env(&args, &[("PYTHONPATH", s(&shim))]).expect_code(1);
    let receipts: Vec<Receipt> = read_receipts(&out).into_iter().map(|r| r.1).collect();
    let b2 = at(&receipts, 2, 1);
    assert_eq!(b2.evidence.verdict, Verdict::Fail, "{}", reason(b2));
    let tape = b2.evidence.gates.iter().find(|g| g.gate == Gate::ArgmaxTape).expect("an argmax tape gate");
    assert!(tape.detail.contains("no pass computed more than one step"), "{}", tape.detail);
}
