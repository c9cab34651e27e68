//! The acceptance criterion: `memra-gates run --matrix single` on the host backend at TP1/TP2 over
//! both transports exits 0. Every BIT / VALUE / SCHEDULING door passes identity with its counter
//! engaged, every NUMERIC-CLASS door passes argmax tape, class identity and error budget, and every
//! configuration without meaning on the host is receipted NOT-APPLICABLE with the registry's reason.

use std::collections::{BTreeMap, BTreeSet};

use memra_receipts::{Gate, Verdict};
use serde_json::Value;

use crate::util::*;

#[test]
fn single_matrix_on_host_passes_every_door() {
    // The shared night: `short_host_run("1,2", …, ["--matrix", "single"])`, which exited 0.
    let SharedRun { dir: out_dir, out } = single_night();

    // The registry: class, engagement counter and host reason of each door, by env name.
    let doors_json = run(&["doors", "--json"]);
    let registry: Value = serde_json::from_str(&doors_json.stdout).unwrap();
    let by_env: BTreeMap<&str, &Value> =
        registry["doors"].as_array().unwrap().iter().map(|d| (d["env"].as_str().unwrap(), d)).collect();
    let ids = door_ids_by_env();

    let expected: BTreeSet<ConfigKey> = matrix_listing(&SINGLE_TP12_HOST).into_iter().collect();
    let receipts = read_receipts(out_dir);
    let got: BTreeSet<ConfigKey> = receipts.iter().map(|(_, r)| receipt_key(r, &ids)).collect();
    assert_eq!(got, expected, "receipts vs `memra-gates matrix` listing");
    assert_eq!(receipts.len(), expected.len());

    let (mut identity, mut numeric, mut not_applicable) = (0, 0, 0);
    for (name, r) in &receipts {
        let ev = &r.evidence;
        let label = r.label();
        let on: Vec<&Value> =
            ev.config.doors.iter().filter(|(_, on)| **on).map(|(env, _)| by_env[env.as_str()]).collect();
        let gate = |g: Gate| ev.gates.iter().find(|x| x.gate == g).map(|x| x.verdict);
        match ev.verdict {
            Verdict::NotApplicable => {
                not_applicable += 1;
                let reason = ev.reason.as_deref().unwrap_or_default();
                // The reason quotes the registry's host reason of one of its doors — or, for the
                // default rows (b4) of this one-prompt battery, says that rows need sessions.
                let quoted =
                    on.iter().any(|d| d["not_applicable"]["host"].as_str().is_some_and(|why| reason.contains(why)))
                        || (ev.config.batch.is_some() && reason.contains("rows are sessions decoded together"));
                assert!(quoted, "{label}: NOT-APPLICABLE reason {reason:?} does not quote the registry");
                assert!(ev.gates.is_empty(), "{label}: a NOT-APPLICABLE run ran gates");
            }
            Verdict::Pass => {
                for g in [Gate::Determinism, Gate::NonTriviality, Gate::Engagement] {
                    assert_eq!(gate(g), Some(Verdict::Pass), "{label}: gate {g:?}");
                }
                let is_numeric = on.iter().any(|d| d["class"] == "NUMERIC-CLASS");
                if is_numeric {
                    numeric += 1;
                    for g in [Gate::ArgmaxTape, Gate::ErrorBudget] {
                        assert_eq!(gate(g), Some(Verdict::Pass), "{label}: NUMERIC gate {g:?}");
                    }
                    // The class baseline itself (TP1 host-bounce here) is not compared with itself
                    // (that would pass vacuously). Its ClassIdentity gate exists only where a
                    // BIT-IDENTICAL door rides the NUMERIC one (SEL_DOWN8 with NVFP4_EP2): the
                    // check against the same configuration without that door. Every other run
                    // has the gate.
                    let baseline = ev.config.tp == 1 && ev.config.transport.as_str() == "host-bounce";
                    let ci = gate(Gate::ClassIdentity);
                    let ci_detail = ev.gates.iter().find(|x| x.gate == Gate::ClassIdentity).map(|x| x.detail.clone());
                    let bit_door = on.iter().any(|d| d["class"] == "BIT-IDENTICAL");
                    if baseline && bit_door {
                        assert_eq!(ci, Some(Verdict::Pass), "{label}: its bit-identical door's check");
                        let detail = ci_detail.unwrap_or_default();
                        assert!(!detail.contains("class baseline"), "{label}: compared with itself: {detail}");
                    } else if baseline {
                        assert_eq!(ci, None, "{label}: the class baseline must not compare with itself");
                    } else {
                        assert_eq!(ci, Some(Verdict::Pass), "{label}: NUMERIC gate ClassIdentity");
                    }
                } else {
                    identity += 1;
                    assert_eq!(gate(Gate::Identity), Some(Verdict::Pass), "{label}: identity gate");
                }
                // Engagement proven by the door's own counter, not by the verdict alone.
                for d in &on {
                    let counter = d["engagement"].as_str().unwrap();
                    let n = ev
                        .engaged
                        .iter()
                        .filter(|(k, _)| k.as_str() == counter || k.starts_with(&format!("{counter}@")))
                        .map(|(_, n)| *n)
                        .sum::<u64>();
                    assert!(n > 0, "{label}: door {} passed with counter {counter} = 0 ({:?})", d["id"], ev.engaged);
                }
            }
            other => panic!("{name} {label}: {other} {:?}", ev.reason),
        }
    }
    // Every door class is present: the default path, identity doors, NUMERIC doors, host-less doors.
    assert!(
        identity >= 2 && numeric >= 1 && not_applicable >= 1,
        "identity {identity}, numeric {numeric}, n/a {not_applicable}"
    );
    assert!(out.stdout.contains("PASS") && out.stdout.contains("NOT-APPLICABLE"), "{}", out.transcript());
    let summary = memra_receipts::json::read_summary(&out_dir.join("summary.json")).unwrap();
    assert_eq!(summary.overall, Verdict::Pass);
    assert_eq!(summary.counts.get(Verdict::Pass) + summary.counts.get(Verdict::NotApplicable), expected.len() as u64);
}
