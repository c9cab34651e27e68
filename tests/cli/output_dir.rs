//! The output directory keeps the evidence honest: it is taken before any configuration runs
//! (created, locked, proven writable), a run whose receipts or matrix outputs could not all be
//! written exits 2 naming each file (never "PASS" with receipts missing), two runs never write
//! into one directory at once, and a directory holding another plan's receipts is refused unless
//! `--replace` is given, so a summary always describes every receipt beside it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::util::*;

#[test]
fn a_directory_that_cannot_be_written_is_refused_before_any_configuration_runs() {
    // /proc exists and refuses new files even for root (a chmod'ed folder would not stop root).
    let out = run(&["run", "--backend", "host", "--out", "/proc"]);
    out.expect_code(2).expect_stderr(&["--out /proc", "cannot write there"]);
    assert!(out.elapsed < Duration::from_secs(2), "refused only after {:?}", out.elapsed);
    assert!(out.stdout.trim().is_empty(), "{}", out.transcript());
}

/// `ulimit -f` with SIGXFSZ ignored makes every write past the limit fail with "File too large":
/// the lock file (a few dozen bytes) fits, the receipts (tens of KiB) do not.
#[test]
fn receipts_that_cannot_be_written_make_the_run_exit_2_naming_them() {
    let dir = tempdir();
    let out_dir = dir.path().join("r");
    let args = short_host_run("1,2", &out_dir, &["--transport", "host-bounce", "--quiet"]);
    let script = "trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\"";
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c").arg(script).arg(bin()).args(&args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MEMRA_") {
            cmd.env_remove(&name);
        }
    }
    let out = cmd.stdin(Stdio::null()).output().expect("start sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a run that lost receipts must exit 2\n{stderr}");
    assert!(stderr.contains("could not be written") && stderr.contains("File too large"), "{stderr}");
    let written = receipt_names(&out_dir);
    assert!(written.is_empty(), "{written:?} written although every write past 4 KiB fails\n{stderr}");
    let lost = stderr.lines().filter(|l| l.contains("/run-") && l.contains("File too large")).count();
    assert!(lost >= 2, "each lost receipt is named\n{stderr}");
    assert!(stderr.contains("summary.json: not written"), "{stderr}");
    assert!(!out_dir.join("summary.json").exists(), "a summary of receipts that are not there was written");
}

fn wait_for(path: &Path, what: &str) {
    let t0 = Instant::now();
    while !path.exists() || std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "{what} never appeared at {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_run_into_the_same_directory_is_refused_naming_the_first() {
    let dir = tempdir();
    let out_dir = dir.path().join("r");
    let args = [
        "run",
        "--backend",
        "host",
        "--preset",
        "tiny",
        "--tp",
        "1,2,4,8",
        "--batch",
        "1",
        "--prompts",
        "2",
        "--quiet",
        "--out",
        s(&out_dir),
    ];
    let shared = machine_shared(); // the first run is a child of this binary too
    let mut first = command(&args, &[]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start");
    wait_for(&out_dir.join(".memra-gates.lock"), "the first run's lock");
    let second = run_alone(&args);
    let first_status = first.wait().expect("first run");
    drop(shared);
    second.expect_code(2).expect_stderr(&["is writing there", "memra-gates (pid", ".memra-gates.lock"]);
    assert!(second.stderr.contains(&format!("pid {}", first.id())), "the holder is named\n{}", second.transcript());
    assert_eq!(first_status.code(), Some(0), "the first run finished undisturbed");
    // The directory holds exactly the first run's plan: 8 receipts, a summary of 8.
    assert_eq!(receipt_names(&out_dir).len(), 8);
    let summary = memra_receipts::json::read_summary(&out_dir.join("summary.json")).unwrap();
    assert_eq!(summary.rows.len(), 8);
}

#[test]
fn another_plans_receipts_are_refused_then_replaced_and_resume_counts_what_it_kept() {
    let dir = tempdir();
    let out_dir = dir.path().join("r");
    run(&short_host_run("1,2", &out_dir, &["--transport", "host-bounce", "--quiet"])).expect_code(0);
    // Another plan (TP1 only) into the same folder: refused, nothing touched.
    let before = receipt_names(&out_dir);
    let other = short_host_run("4", &out_dir, &["--transport", "host-bounce", "--quiet"]);
    run(&other).expect_code(2).expect_stderr(&["holds 2 receipt(s) of another plan", "--replace"]);
    assert_eq!(receipt_names(&out_dir), before);
    // The same plan again is fine (its receipts are rewritten); --resume keeps them and says so.
    let same = short_host_run("1,2", &out_dir, &["--transport", "host-bounce", "--quiet", "--resume"]);
    run(&same).expect_code(0).expect_stderr(&["--resume kept 2 complete receipt(s) and ran 0"]);
    // --replace removes the other plan's receipts first; the summary then describes the folder.
    let mut replace = other.clone();
    replace.push("--replace");
    run(&replace).expect_code(0).expect_stderr(&["--replace removed 2 receipt(s) of another plan"]);
    let names = receipt_names(&out_dir);
    assert_eq!(names.len(), 1, "{names:?}");
    let summary = memra_receipts::json::read_summary(&out_dir.join("summary.json")).unwrap();
    assert_eq!(summary.rows.len(), 1);
}
