//! `run --subject MANIFEST` (docs/subject-protocol.md): the built-in runtime through the protocol
//! writes byte-identical evidence to the same plan in process (the protocol's exactness test, with
//! its negative control); subjects that crash, hang, truncate their tape, skip a seam or lie about
//! an engagement get ERROR or VOID with the reason while the rest of the matrix runs; a
//! configuration outside the manifest is NOT-APPLICABLE; a bad manifest is refused before any work;
//! and the Python helper engines use computes the seam digest exactly.

use crate::util::*;
use memra_receipts::schema::{Gate, Verdict};
use memra_receipts::Receipt;
use std::path::Path;

/// The `evidence` block of a receipt file, byte for byte, but for the line that differs by design:
/// who counted the census (absent in process; `self-reported` through the protocol).
fn evidence_text(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let a = text.find("\n  \"evidence\": {").expect("an evidence block");
    let b = text.find("\n  \"measurements\": {").expect("a measurements block");
    text[a..b].lines().filter(|l| !l.starts_with("    \"census_witness\": ")).collect::<Vec<_>>().join("\n")
}

/// Receipt file name → evidence text, for every receipt of `dir`.
fn evidence_of(dir: &Path) -> Vec<(String, String)> {
    receipt_names(dir).into_iter().map(|n| (n.clone(), evidence_text(&dir.join(n)))).collect()
}

/// The names whose evidence differs between two receipt directories (same names required).
pub(super) fn differing(a: &Path, b: &Path) -> Vec<String> {
    let (ea, eb) = (evidence_of(a), evidence_of(b));
    assert_eq!(
        ea.iter().map(|e| &e.0).collect::<Vec<_>>(),
        eb.iter().map(|e| &e.0).collect::<Vec<_>>(),
        "the two plans wrote different receipts"
    );
    ea.into_iter().zip(eb).filter(|(x, y)| x.1 != y.1).map(|(x, _)| x.0).collect()
}

/// One short plan of the tiny model (in process, the default model set would also run `edge`,
/// whose receipts no test here reads; an external subject runs only the model it is given).
/// Single-token (`--batch 1`): the subject protocol, version 1, has no rows or columns, so the
/// built-in runtime in process must run the same plan as through the protocol.
const SHORT: [&str; 8] = ["--preset", "tiny", "--prompts", "1", "--gen-tokens", "3", "--batch", "1"];

fn plan<'a>(extra: &[&'a str], out: &'a str) -> Vec<&'a str> {
    let mut v = vec!["run", "--backend", "host", "--quiet", "--out", out];
    v.extend_from_slice(&SHORT);
    v.extend_from_slice(extra);
    v
}

#[test]
fn the_builtin_runtime_through_the_protocol_writes_byte_identical_evidence() {
    let tmp = tempdir();
    let sets = repo("scripts/subjects/identity-sets.toml");
    let manifest = repo("scripts/subjects/builtin.toml");
    let (a, b) = (tmp.path().join("in-process"), tmp.path().join("protocol"));
    let common = ["--matrix", s(&sets), "--tp", "1,2"];
    // Canaries FAIL on purpose: exit status 1 both ways.
    run(&plan(&common, s(&a))).expect_code(1);
    let mut via = common.to_vec();
    via.extend(["--subject", s(&manifest)]);
    run(&plan(&via, s(&b))).expect_code(1).expect_stderr(&["subject memra-runtime 0.1.0"]);
    assert_eq!(differing(&a, &b), Vec::<String>::new(), "evidence differs in process and through the protocol");
    // The plan exercised what the protocol carries: passes, localised failures (full captures with
    // their owners), error budgets (captures of every seam), engagement counters.
    let receipts: Vec<Receipt> = read_receipts(&b).into_iter().map(|r| r.1).collect();
    let count = |v: Verdict| receipts.iter().filter(|r| r.evidence.verdict == v).count();
    assert!(count(Verdict::Pass) >= 10 && count(Verdict::Fail) >= 4, "{} receipts", receipts.len());
    assert!(receipts.iter().any(|r| r.evidence.first_divergence.as_ref().is_some_and(|d| d.rank.is_some())));
    assert!(receipts.iter().any(|r| !r.evidence.error_budget.is_empty()));
    assert!(receipts.iter().any(|r| r.evidence.engaged.get("oproj_direct.peer_stores").is_some_and(|n| *n > 0)));
    // Only the subject vouches for its census through the protocol; in process the gates' own
    // backend counted it.
    for (_, r) in read_receipts(&a) {
        assert_eq!(r.evidence.census_witness, None, "{}", r.label());
    }
    for r in &receipts {
        let ran = !r.evidence.gates.is_empty();
        assert_eq!(r.evidence.census_witness.as_deref(), ran.then_some("self-reported"), "{}", r.label());
        assert_eq!(r.evidence.config.subject, "memra-runtime");
        assert_eq!(r.evidence.build.subject_version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
    }
    // The manifest declares the runtime's own version: the tape must repeat it.
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains(&format!("version = \"{}\"", env!("CARGO_PKG_VERSION"))), "builtin.toml's version is stale");
}

/// The negative control: a subject that differs from the built-in runtime in one bit of its full
/// captures (nothing else) must make the comparison fail exactly where captures are evidence.
#[test]
fn one_flipped_capture_bit_breaks_byte_identity() {
    let tmp = tempdir();
    let (a, b) = (tmp.path().join("in-process"), tmp.path().join("nudged"));
    let manifest = repo("tests/subjects/nudge.toml");
    let common = ["--door", "MEMRA_STEP_TP_W8", "--tp", "1,2", "--transport", "host-bounce"];
    run(&plan(&common, s(&a))).expect_code(0);
    let mut via = common.to_vec();
    via.extend(["--subject", s(&manifest)]);
    run(&plan(&via, s(&b))).expect_code(0);
    let differ = differing(&a, &b);
    assert_eq!(differ.len(), 2, "both W8 runs carry error-budget captures: {differ:?}");
}

/// Runs the misbehaving subject `mode` over TP1 and TP2 (host-bounce); it misbehaves at TP2.
fn misbehave(mode: &str, extra: &[&str]) -> (Output, Vec<Receipt>) {
    let (o, receipts, _) = misbehave_in(mode, extra);
    (o, receipts)
}

/// [`misbehave`], keeping the receipt directory (`out` inside the returned one).
fn misbehave_in(mode: &str, extra: &[&str]) -> (Output, Vec<Receipt>, tempfile::TempDir) {
    let tmp = tempdir();
    let out = tmp.path().join("out");
    let manifest = repo(&format!("tests/subjects/{mode}.toml"));
    let mut args = vec!["--subject", s(&manifest), "--tp", "1,2"];
    args.extend_from_slice(extra);
    let o = run(&plan(&args, s(&out)));
    let receipts = read_receipts(&out).into_iter().map(|r| r.1).collect();
    (o, receipts, tmp)
}

/// The receipt of the TP2 run, after checking every other one passed (the matrix went on).
fn tp2(mode: &str, receipts: &[Receipt]) -> Receipt {
    assert!(receipts.len() >= 2, "{mode}: {} receipts", receipts.len());
    for r in receipts.iter().filter(|r| r.evidence.config.tp != 2) {
        assert_eq!(r.evidence.verdict, Verdict::Pass, "{mode}: {} {:?}", r.label(), r.evidence.reason);
    }
    receipts.iter().find(|r| r.evidence.config.tp == 2).unwrap().clone()
}

fn assert_verdict(r: &Receipt, verdict: Verdict, fragments: &[&str]) {
    let reason = r.evidence.reason.clone().unwrap_or_default();
    assert_eq!(r.evidence.verdict, verdict, "{}: {reason}", r.label());
    for f in fragments {
        assert!(reason.contains(f), "{}: {f:?} not in {reason:?}", r.label());
    }
    // The byte-integrity probe judges the transport of the machine before any run (TP ≥ 2), not a
    // record: every other gate needs the record this run did not produce.
    let judged: Vec<_> = r.evidence.gates.iter().filter(|g| g.gate != Gate::Probe).collect();
    assert!(judged.is_empty(), "a run without a record is judged by no gate: {judged:?}");
    assert_eq!(r.evidence.config.subject, "misbehave");
}

#[test]
fn a_crashing_subject_is_an_error_with_its_status_and_output() {
    let (o, receipts) = misbehave("crash", &["--transport", "host-bounce"]);
    o.expect_code(1);
    let r = tp2("crash", &receipts);
    assert_verdict(&r, Verdict::Error, &["subject misbehave 1 exited with status 3", "crashing on purpose at TP2"]);
}

#[test]
fn a_hanging_subject_is_killed_at_its_time_limit() {
    let (o, receipts) = misbehave("hang", &["--transport", "host-bounce"]);
    o.expect_code(1);
    let r = tp2("hang", &receipts);
    assert_verdict(&r, Verdict::Error, &["did not finish within its time limit of 3s", "killed", "hanging on purpose"]);
    // Two starts (the run and its determinism re-run never happen: the first start fails) at 3 s,
    // and nothing waits for the grandchild `sleep 600`.
    assert!(o.elapsed.as_secs() < 60, "took {:?}", o.elapsed);
}

#[test]
fn a_truncated_tape_is_an_error() {
    let (o, receipts) = misbehave("truncate", &["--transport", "host-bounce"]);
    o.expect_code(1);
    let r = tp2("truncate", &receipts);
    assert_verdict(&r, Verdict::Error, &["the tape of subject misbehave 1", "is not a valid safetensors file"]);
}

#[test]
fn a_skipped_seam_is_an_error_naming_it() {
    let (o, receipts) = misbehave("skip_seam", &["--transport", "host-bounce"]);
    o.expect_code(1);
    let r = tp2("skip_seam", &receipts);
    assert_verdict(&r, Verdict::Error, &["seam L0.o_join is missing from the tape"]);
}

#[test]
fn an_engagement_the_census_does_not_back_is_void() {
    // `single`: the baseline (nothing claimed, PASS) and ROUTES_PRESTAGE at TP2 (claimed, census 0).
    let (o, receipts, tmp) = misbehave_in("lie", &["--matrix", "single", "--transport", "host-bounce,native-p2p"]);
    o.expect_code(1);
    let lies: Vec<&Receipt> = receipts.iter().filter(|r| !r.evidence.config.doors.is_empty()).collect();
    assert_eq!(lies.len(), 2, "ROUTES_PRESTAGE at TP2 over both transports");
    for r in lies {
        assert_verdict(
            r,
            Verdict::Void,
            &["claims MEMRA_ROUTES_PRESTAGE engaged, but its census does not back it (routes_prestage.early_broadcasts = 0)"],
        );
    }
    let honest = receipts.iter().filter(|r| r.evidence.config.doors.is_empty()).count();
    assert_eq!(honest, 4, "the baseline at TP1 and TP2 over both transports");
    assert!(receipts
        .iter()
        .filter(|r| r.evidence.config.doors.is_empty())
        .all(|r| r.evidence.verdict == Verdict::Pass));
    // Promotion judges the subject's history by its manifest's doors: the lie blocks the door.
    let manifest = repo("tests/subjects/lie.toml");
    let (out, defaults) = (tmp.path().join("out"), tmp.path().join("defaults.toml"));
    let args = ["promote", "--history", s(&out), "--nights", "1", "--coverage", "ran", "--subject", s(&manifest)];
    run(&[&args[..], &["--out", s(&defaults)]].concat()).expect_code(0).expect_stdout(&[
        "routes_prestage",
        "blocked",
        "verdict VOID",
        "0 of 1 door(s) promotable",
    ]);
}

#[test]
fn configurations_outside_the_manifest_are_not_applicable_with_the_reason() {
    let tmp = tempdir();
    let text = std::fs::read_to_string(repo("scripts/subjects/builtin.toml"))
        .unwrap()
        .replace("tp = [1, 2, 4, 8]", "tp = [1]")
        .replace("transports = [\"host-bounce\", \"native-p2p\", \"nccl\"]", "transports = [\"host-bounce\"]");
    let manifest = tmp.path().join("narrow.toml");
    std::fs::write(&manifest, text).unwrap();
    let out = tmp.path().join("out");
    run(&plan(&["--subject", s(&manifest), "--tp", "1,2"], s(&out))).expect_code(0);
    let receipts: Vec<Receipt> = read_receipts(&out).into_iter().map(|r| r.1).collect();
    assert_eq!(receipts.len(), 4);
    for r in &receipts {
        let c = &r.evidence.config;
        let reason = r.evidence.reason.clone().unwrap_or_default();
        match (c.tp, c.transport.as_str()) {
            (1, "host-bounce") => assert_eq!(r.evidence.verdict, Verdict::Pass, "{reason}"),
            (2, _) => {
                assert_eq!(r.evidence.verdict, Verdict::NotApplicable);
                assert!(reason.contains("supports TP1 only: TP2 is outside its manifest"), "{reason}");
            }
            (_, t) => {
                assert_eq!(r.evidence.verdict, Verdict::NotApplicable);
                assert!(reason.contains(&format!("host-bounce only: {t} is outside its manifest")), "{reason}");
            }
        }
    }
}

#[test]
fn bad_manifests_and_flags_are_refused_before_any_work() {
    let tmp = tempdir();
    let good = std::fs::read_to_string(repo("scripts/subjects/builtin.toml")).unwrap();
    let cases: [(&str, String, &str); 7] = [
        (
            "version",
            good.replace("protocol = 1", "protocol = 3"),
            "protocol = \"3\": this build speaks subject protocol versions [1, 2]",
        ),
        ("field", good.replace("class = ", "colour = \"red\"\nclass = "), "unknown field `colour`"),
        ("seams", good.replace("\"moe_join\", ", ""), "`moe_join` is not listed"),
        (
            "door",
            good.replace("\"MEMRA_OPROJ_DIRECT\", ", "\"MEMRA_OPROJ_DIRCT\", "),
            "MEMRA_OPROJ_DIRCT\": is neither a door of gates/doors.toml",
        ),
        (
            "requires",
            good.replace("\"MEMRA_OPROJ_DIRECT\", ", ""),
            "requires the built-in door oproj_direct: list its variable in `doors` too",
        ),
        (
            "budget",
            good.replace("class = \"BIT-IDENTICAL\"", "class = \"NUMERIC-CLASS\""),
            "a NUMERIC-CLASS subject declares its error budget",
        ),
        ("placeholder", good.replace("{memra_gates}", "{memra}"), "{memra} is not a placeholder"),
    ];
    for (what, text, fragment) in cases {
        let manifest = tmp.path().join(format!("{what}.toml"));
        std::fs::write(&manifest, text).unwrap();
        let out = tmp.path().join(what);
        run(&plan(&["--subject", s(&manifest)], s(&out))).expect_code(2).expect_stderr(&[fragment]);
        assert!(!out.exists(), "{what}: the refused plan created its --out");
    }
    let manifest = repo("scripts/subjects/builtin.toml");
    let out = tmp.path().join("process");
    run(&plan(&["--subject", s(&manifest), "--process", "0/2"], s(&out)))
        .expect_code(2)
        .expect_stderr(&["with --process (or MEMRA_PROCESS)"]);
    // The protocol subject outside the protocol says how it is meant to run.
    run(&["subject"]).expect_code(2).expect_stderr(&["MEMRA_SUBJECT_PROTOCOL is not set", "run --subject"]);
}

/// scripts/subjects/memra_subject.py's digest (what a Python engine uses) is the seam digest of
/// docs/DESIGN.md §5, bit for bit, including NaN and negative-zero patterns and a nonzero base.
#[test]
fn the_python_helper_digest_is_the_seam_digest() {
    let bits: Vec<u32> =
        (0..300u32).map(|i| i.wrapping_mul(0x9E37_79B9) ^ (i << 7)).chain([0x7FC0_0001, 0x8000_0000]).collect();
    let want = memra_kernels::twins::digest::digest_u32(&bits, 4097);
    let list = bits.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let code = format!(
        "import sys; sys.path.insert(0, {:?}); import memra_subject as ms; print(ms.digest_bits([{list}], 4097))",
        s(&repo("scripts/subjects"))
    );
    let out = std::process::Command::new("python3").args(["-c", &code]).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(got, want, "python {got:016x} rust {want:016x}");
    // The test vectors docs/subject-protocol.md gives with the digest are the Rust digest's.
    let doc = std::fs::read_to_string(repo("docs/subject-protocol.md")).unwrap();
    let v1 = memra_kernels::twins::digest::digest_u32(&[0x3f80_0000, 0x8000_0000, 0x7fc0_0000], 0);
    let v2 = memra_kernels::twins::digest::digest_u32(&[0x3f80_0000], 5);
    for v in [v1, v2] {
        assert!(doc.contains(&format!("`0x{v:016x}`")), "docs/subject-protocol.md lacks the test vector 0x{v:016x}");
    }
}
