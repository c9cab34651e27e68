//! The main job with no door requested: every TP size × transport of the default run passes — and
//! the default rows and columns (b4 and t4 at TP1 and TP2, docs/DESIGN.md §3.6) against the
//! single-token oracle — and everything it writes is complete and matches the published schemas.

use std::collections::BTreeSet;

use memra_receipts::{Gate, Summary, Verdict};

use crate::util::*;

/// The rows of the terminal summary table: `(backend, tp, transport, pass, verdict)` per
/// configuration.
fn table_rows(stdout: &str) -> Vec<(String, usize, String, String, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('│').map(str::trim).collect();
            // "│ host │ 1 │ host-bounce │ b4 │ defaults │ PASS │ …": cells[0] is before the first bar.
            let tp = cells.get(2)?.parse().ok()?;
            let pass = cells.get(4)?.to_string();
            Some((cells[1].to_string(), tp, cells.get(3)?.to_string(), pass, cells.get(6)?.to_string()))
        })
        .collect()
}

/// The default plan of one model: every TP × transport single-token (`-`), and b4 and t4 at TP1
/// and TP2 over both transports.
fn default_plan() -> BTreeSet<(usize, String, String)> {
    let mut plan = BTreeSet::new();
    for tp in [1, 2, 4, 8] {
        for t in ["host-bounce", "native-p2p"] {
            plan.insert((tp, t.to_string(), "-".to_string()));
            if tp <= 2 {
                plan.insert((tp, t.to_string(), "b4".to_string()));
                plan.insert((tp, t.to_string(), "t4".to_string()));
            }
        }
    }
    plan
}

#[test]
fn default_run_passes_every_tp_and_transport_and_writes_valid_outputs() {
    let dir = tempdir();
    let out_dir = dir.path().join("receipts");
    let out = run(&["run", "--backend", "host", "--out", s(&out_dir), "--prompts", "2", "--gen-tokens", "3"]);
    out.expect_code(0);

    // One table row per configuration of the default plan and model (the default model set:
    // tiny and edge), each PASS.
    let expected = default_plan();
    let n = expected.len();
    let rows = table_rows(&out.stdout);
    assert_eq!(rows.len(), 2 * n, "expected {} table rows ({n} per model)\n{}", 2 * n, out.transcript());
    let seen: BTreeSet<(usize, String, String)> =
        rows.iter().map(|(_, tp, t, p, _)| (*tp, t.clone(), p.clone())).collect();
    assert_eq!(seen, expected, "table rows are not the default plan\n{}", out.transcript());
    for (backend, tp, t, p, verdict) in &rows {
        assert_eq!((backend.as_str(), verdict.as_str()), ("host", "PASS"), "row tp{tp} {t} {p}\n{}", out.transcript());
    }
    out.expect_stdout(&[&format!("{n} PASS  → "), "/edge"]);

    // The edge model's receipts, in their own directory: every TP × transport, each PASS, with
    // every path the model claims reached (the coverage gate) and the f64 reference check.
    let edge = read_receipts(&out_dir.join("edge"));
    assert_eq!(edge.len(), n, "expected {n} edge receipts");
    for (name, r) in &edge {
        assert_eq!((r.evidence.config.model.preset.as_str(), r.evidence.verdict), ("edge", Verdict::Pass), "{name}");
        assert!(r.evidence.claims.len() >= 10, "{name}: the edge model claims its special paths");
        for claim in &r.evidence.claims {
            assert!(r.evidence.coverage[claim].count > 0, "{name}: {claim} not reached");
        }
        for gate in [Gate::Coverage, Gate::Reference, Gate::Determinism] {
            assert!(r.evidence.gates.iter().any(|g| g.gate == gate && g.verdict == Verdict::Pass), "{name}: {gate:?}");
        }
        // One rank copies nothing: the copies gate exists from TP2 on, and passes there.
        let copies = r.evidence.gates.iter().find(|g| g.gate == Gate::Copies).map(|g| g.verdict);
        let want = if r.evidence.config.tp > 1 { Some(Verdict::Pass) } else { None };
        assert_eq!(copies, want, "{name}: the copies gate at TP{}", r.evidence.config.tp);
    }

    // The files: the receipts and the matrix outputs, no leftover temporary file.
    for f in ["summary.json", "junit.xml", "latency.csv", "summary.md"] {
        let p = out_dir.join(f);
        assert!(p.is_file() && std::fs::metadata(&p).unwrap().len() > 0, "{f} is missing or empty");
    }
    assert_eq!(temp_names(&out_dir), Vec::<String>::new(), "temporary files left behind");
    let receipts = read_receipts(&out_dir);
    assert_eq!(receipts.len(), n, "expected {n} receipts, found {:?}", receipt_names(&out_dir));
    let mut configs = BTreeSet::new();
    for (name, r) in &receipts {
        assert_eq!(name, &format!("run-{}.json", r.run_id), "file name and run_id disagree");
        assert_eq!(r.evidence.verdict, Verdict::Pass, "{name}: {:?}", r.evidence.reason);
        assert!(
            r.evidence.config.doors.is_empty(),
            "{name}: doors {:?} in a run that requested none",
            r.evidence.config.doors
        );
        assert!(!r.evidence.gates.is_empty() && r.evidence.gates.iter().all(|g| g.verdict == Verdict::Pass), "{name}");
        // 2 prompts × 3 generated tokens.
        assert_eq!(r.evidence.tokens.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3], "{name}: token tape shape");
        let pass = Some(r.evidence.config.pass_label()).filter(|p| !p.is_empty()).unwrap_or_else(|| "-".into());
        configs.insert((r.evidence.config.tp, r.evidence.config.transport.as_str().to_string(), pass));
        // A multi-lane run is held to the single-token oracle, and really ran several lanes.
        if r.evidence.config.lanes() > 1 {
            let identity = r.evidence.gates.iter().find(|g| g.gate == Gate::Identity).expect("identity gate");
            assert!(identity.detail.contains("single-token TP1 reference"), "{name}: {}", identity.detail);
        }
    }
    assert_eq!(configs, expected, "receipts do not cover the default plan once");

    // Every file validates against the published JSON Schema (an independent validator).
    let receipt_schema = SchemaValidator::new("receipt-v2.schema.json");
    for (name, _) in &receipts {
        receipt_schema.check_file(&out_dir.join(name));
    }
    SchemaValidator::new("summary-v1.schema.json").check_file(&out_dir.join("summary.json"));

    // The summary and the exports agree with the receipts.
    let summary: Summary =
        memra_receipts::json::read_summary(&out_dir.join("summary.json")).expect("summary.json reads strictly");
    assert_eq!(summary.overall, Verdict::Pass);
    assert_eq!(summary.counts.get(Verdict::Pass), n as u64);
    let ids: BTreeSet<&str> = receipts.iter().map(|(_, r)| r.run_id.as_str()).collect();
    assert_eq!(summary.rows.iter().map(|r| r.run_id.as_str()).collect::<BTreeSet<_>>(), ids);
    let junit = std::fs::read_to_string(out_dir.join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testcase").count(), n, "junit.xml: one test case per run\n{junit}");
    assert!(!junit.contains("<failure") && !junit.contains("<error"), "junit.xml reports a failure\n{junit}");
    // Provenance: the receipts name the kernel sources of the binary that wrote them.
    let version = run(&["version"]);
    version.expect_code(0);
    let kernel = version
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("kernel sources: "))
        .unwrap_or_else(|| panic!("`version` prints no kernel digest\n{}", version.transcript()));
    for (name, r) in &receipts {
        assert_eq!(r.evidence.build.kernel_source_digest, kernel, "{name}: kernel digest vs `memra-gates version`");
    }
    let csv = std::fs::read_to_string(out_dir.join("latency.csv")).unwrap();
    assert!(csv.lines().count() > 8, "latency.csv has no rows per layer × seam\n{csv}");
}
