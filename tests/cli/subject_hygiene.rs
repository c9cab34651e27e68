//! The subject's process hygiene (docs/subject-protocol.md, "What happens"): a manifest whose program cannot
//! start is refused with exit status 2 before any model is built; SIGINT or SIGTERM to memra-gates
//! ends the subject's whole process group (whatever it started too) and removes its temporary
//! directory.

use crate::util::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// builtin.toml with its command replaced by `command` (a TOML array's inside).
fn manifest_with(dir: &Path, name: &str, command: &str) -> std::path::PathBuf {
    let good = std::fs::read_to_string(repo("scripts/subjects/builtin.toml")).unwrap();
    let line = good.lines().find(|l| l.starts_with("command = ")).expect("a command line").to_string();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, good.replace(&line, &format!("command = [{command}]"))).unwrap();
    path
}

#[test]
fn a_program_that_cannot_start_is_refused_before_any_model_is_built() {
    let tmp = tempdir();
    let script = tmp.path().join("engine.py");
    std::fs::write(&script, "print('never runs')\n").unwrap(); // no x permission
    let cases = [
        ("missing", "\"/nonexistent/memra-engine\"".to_string(), "the program /nonexistent/memra-engine cannot start"),
        ("not-executable", "\"{manifest_dir}/engine.py\"".to_string(), "it is not executable"),
        ("directory", "\"{manifest_dir}\"".to_string(), "it is not a file"),
        ("not-on-path", "\"memra-no-such-engine\"".to_string(), "`memra-no-such-engine` cannot start"),
    ];
    for (what, command, fragment) in cases {
        let manifest = manifest_with(tmp.path(), what, &command);
        let out = tmp.path().join(format!("out-{what}"));
        // Refused while the plan is checked: no model built, no oracle run, no --out taken.
        let o = run(&["run", "--backend", "host", "--quiet", "--out", s(&out), "--subject", s(&manifest)]);
        o.expect_code(2).expect_stderr(&[fragment, "command"]);
        assert!(o.elapsed < Duration::from_secs(10), "{what}: refused after {:?}", o.elapsed);
        assert!(!out.exists(), "{what}: the refused plan created its --out");
    }
    // The control: the same manifest with a program that starts is accepted (`sh` on PATH).
    let manifest = manifest_with(tmp.path(), "sh", "\"sh\", \"-c\", \"exit 3\"");
    let out = tmp.path().join("out-sh");
    let o = run(&[
        "run",
        "--backend",
        "host",
        "--quiet",
        "--out",
        s(&out),
        "--subject",
        s(&manifest),
        "--tp",
        "1",
        "--transport",
        "host-bounce",
        "--prompts",
        "1",
        "--gen-tokens",
        "2",
    ]);
    o.expect_code(1).expect_stdout(&["exited with status 3"]);
}

/// `--witness require` where the witness cannot be armed (no CUPTI: `CUDA_HOME` names an empty
/// directory and this machine has no /usr/local/cuda*) is refused with exit 2 before any model is
/// built, naming what is missing; `--witness off` runs the same plan.
#[test]
fn a_required_witness_that_is_missing_is_refused_before_any_work() {
    let has_toolkit = std::fs::read_dir("/usr/local")
        .map(|d| d.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().starts_with("cuda")))
        .unwrap_or(false);
    if has_toolkit {
        eprintln!("skipped: a CUDA toolkit is installed here, so the witness's CUPTI is not missing");
        return;
    }
    let tmp = tempdir();
    let manifest = manifest_with(tmp.path(), "sh", "\"sh\", \"-c\", \"exit 3\"");
    let out = tmp.path().join("out");
    let base = ["run", "--backend", "host", "--quiet", "--out", s(&out), "--subject", s(&manifest)];
    let empty = s(tmp.path());
    let o = run_env(&[&base[..], &["--witness", "require"]].concat(), &[("CUDA_HOME", empty)]);
    // The injection library may be missing too (a `cargo test` builds no cdylib beside the binary):
    // the message then names both, so only the CUPTI part is asserted here.
    o.expect_code(2)
        .expect_stderr(&["--witness require: not found: ", "a CUPTI library (libcupti.so*) under $CUDA_HOME"]);
    assert!(!out.exists(), "the refused plan created its --out");
    let short = ["--tp", "1", "--transport", "host-bounce", "--prompts", "1", "--gen-tokens", "2", "--witness", "off"];
    run_env(&[&base[..], &short[..]].concat(), &[("CUDA_HOME", empty)]).expect_code(1);
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet: it runs nothing).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn poll(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// Starts a run whose subject starts a grandchild and sleeps, waits until both run, sends
/// `signal` to memra-gates, and checks that both are gone and the work directory too.
fn interrupt_with(signal: &str) {
    let tmp = tempdir();
    let (scratch, marker) = (tmp.path().join("tmp"), tmp.path().join("pids"));
    std::fs::create_dir(&scratch).unwrap();
    // sh starts `sleep` in the background (its process group), writes both pids, and waits.
    let script = format!("sleep 600 & echo $! > {m}.part; echo $$ >> {m}.part; mv {m}.part {m}; wait", m = s(&marker));
    let manifest = manifest_with(tmp.path(), "sleeper", &format!("\"sh\", \"-c\", {script:?}"));
    let out = tmp.path().join("out");
    let args = [
        "run",
        "--backend",
        "host",
        "--quiet",
        "--out",
        s(&out),
        "--subject",
        s(&manifest),
        "--tp",
        "1",
        "--transport",
        "host-bounce",
        "--prompts",
        "1",
        "--gen-tokens",
        "2",
    ];
    let _shared = machine_shared();
    let mut child = command(&args, &[("TMPDIR", s(&scratch))])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memra-gates starts");
    let started = poll(Duration::from_secs(300), || marker.exists());
    let work = names_where(&scratch, |n| n.starts_with("memra-subject-"));
    if !started {
        let _ = child.kill();
        panic!("the sleeping subject never started");
    }
    assert_eq!(work.len(), 1, "one work directory while the subject runs: {work:?}");
    let pids: Vec<u32> =
        std::fs::read_to_string(&marker).unwrap().split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|p| !gone(*p)), "the subject and its grandchild run");
    let sent = std::process::Command::new("kill").args(["-s", signal, &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    assert!(!status.success(), "memra-gates ended by {signal}: {status}");
    assert!(
        poll(Duration::from_secs(10), || pids.iter().all(|p| gone(*p))),
        "{signal}: a subject process is left: {pids:?}"
    );
    assert!(
        poll(Duration::from_secs(10), || names_where(&scratch, |n| n.starts_with("memra-subject-")).is_empty()),
        "{signal}: the work directory {work:?} is left behind"
    );
}

#[test]
fn sigint_ends_the_subject_group_and_removes_its_directory() {
    interrupt_with("INT");
}

#[test]
fn sigterm_ends_the_subject_group_and_removes_its_directory() {
    interrupt_with("TERM");
}
