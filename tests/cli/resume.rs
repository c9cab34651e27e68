//! docs/DESIGN.md §5/§9: interrupting a matrix loses no finished receipt and leaves no truncated one;
//! `--resume` runs only what is missing, keeps what exists untouched, and ends with every
//! configuration of the matrix receipted exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use memra_receipts::Verdict;

use crate::util::*;

const SIGINT: i32 = 2;

#[test]
fn resume_after_sigint_completes_the_matrix_without_rewriting_finished_receipts() {
    let dir = tempdir();
    let out_dir = dir.path().join("receipts");
    // Two prompts of 8 tokens (not the usual 1 × 2): each configuration then lasts long enough
    // that the interrupt lands while the matrix is still running, however fast the host twins.
    let args = ["run", "--backend", "host", "--preset", "tiny", "--tp", "1,2", "--prompts", "2", "--gen-tokens", "8"]
        .into_iter()
        .chain(["--out", s(&out_dir), "--matrix", "single", "--quiet"])
        .collect::<Vec<_>>();
    let expected = matrix_listing(&SINGLE_TP12_HOST);
    let expected_set: BTreeSet<ConfigKey> = expected.iter().cloned().collect();
    assert_eq!(expected_set.len(), expected.len(), "`memra-gates matrix` lists a configuration twice");

    // A process started in the background of a non-interactive shell ignores SIGINT, and its
    // children inherit that: the interrupt below could not reach the run. Say so instead of
    // failing on the run's exit status.
    let ignored = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|st| st.lines().find_map(|l| l.strip_prefix("SigIgn:").map(|m| m.trim().to_string())))
        .and_then(|m| u64::from_str_radix(&m, 16).ok())
        .is_some_and(|mask| mask & (1 << (SIGINT - 1)) != 0);
    assert!(
        !ignored,
        "this test process ignores SIGINT (started with `&` from a non-interactive shell?), so no interrupt can reach \
         the run it starts: run the tests in the foreground"
    );

    // Start the matrix and interrupt it once at least two receipts are on disk. The child holds
    // the machine shared, as every child of this binary does (a timing test waits for it).
    let shared = machine_shared();
    let mut child =
        command(&args, &[]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while receipt_names(&out_dir).len() < 2 {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the matrix finished ({status}) before two receipts were seen: nothing to interrupt");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no two receipts after 300 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let kill = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success(), "kill -INT failed");
    let status = child.wait().unwrap();
    drop(shared);
    assert!(
        status.signal() == Some(SIGINT) || status.code() == Some(130),
        "the interrupted run ended with {status}, not by SIGINT"
    );

    // What the interrupt left: whole receipts only, fewer than the matrix needs.
    let before: BTreeMap<String, (Vec<u8>, SystemTime)> = receipt_names(&out_dir)
        .into_iter()
        .map(|n| {
            let p = out_dir.join(&n);
            (n, (std::fs::read(&p).unwrap(), std::fs::metadata(&p).unwrap().modified().unwrap()))
        })
        .collect();
    let survivors = read_receipts(&out_dir); // panics on a truncated or invalid receipt
    assert!(survivors.len() >= 2);
    assert!(
        survivors.len() < expected.len(),
        "all {} receipts were written before the interrupt landed: the test interrupted nothing",
        expected.len()
    );
    let interrupted_temp_files = temp_names(&out_dir);

    // Resume to completion.
    let mut resume_args = args.to_vec();
    resume_args.push("--resume");
    let out = run(&resume_args);
    out.expect_code(0);

    // Every configuration exactly once, every receipt whole, no temporary file left.
    let ids = door_ids_by_env();
    let receipts = read_receipts(&out_dir);
    let keys: Vec<ConfigKey> = receipts.iter().map(|(_, r)| receipt_key(r, &ids)).collect();
    let key_set: BTreeSet<ConfigKey> = keys.iter().cloned().collect();
    assert_eq!(keys.len(), key_set.len(), "a configuration has two receipts");
    let missing: Vec<_> = expected_set.difference(&key_set).collect();
    let extra: Vec<_> = key_set.difference(&expected_set).collect();
    assert!(missing.is_empty() && extra.is_empty(), "after --resume: missing {missing:?}, unexpected {extra:?}");
    assert_eq!(receipts.len(), expected.len());
    for (name, r) in &receipts {
        assert!(
            matches!(r.evidence.verdict, Verdict::Pass | Verdict::NotApplicable),
            "{name}: {} {:?}",
            r.evidence.verdict,
            r.evidence.reason
        );
    }
    assert_eq!(
        temp_names(&out_dir),
        Vec::<String>::new(),
        "temporary files remain after --resume (left by the interrupt: {interrupted_temp_files:?})"
    );

    // The receipts written before the interrupt were neither rewritten nor touched.
    for (name, (bytes, mtime)) in &before {
        let p = out_dir.join(name);
        assert_eq!(&std::fs::read(&p).unwrap(), bytes, "{name} was rewritten by --resume");
        assert_eq!(&std::fs::metadata(&p).unwrap().modified().unwrap(), mtime, "{name} was touched by --resume");
    }

    // The summary covers the whole matrix, not only what the resumed process ran.
    let summary = memra_receipts::json::read_summary(&out_dir.join("summary.json")).unwrap();
    assert_eq!(summary.rows.len(), expected.len(), "summary.json after --resume");
}
