//! `run --worker-processes N` (gates/src/commands/run_workers.rs): the plan over N child
//! processes, each a part of it, gathered into one run's folders — the same receipts as one process
//! gives, every model in its folder, nothing of the workers left behind; and the flags it cannot
//! keep refused before any work; a shard splits into exactly itself; the parts' runs counted.

use crate::util::*;

#[test]
fn workers_give_the_receipts_one_process_gives() {
    let dir = tempdir();
    let (one, three) = (dir.path().join("one"), dir.path().join("three"));
    // The default model set (tiny into --out, edge into --out/edge): each worker's second model
    // must land in the second folder.
    let plan = [
        "run",
        "--backend",
        "host",
        "--tp",
        "1,2",
        "--transport",
        "host-bounce",
        "--prompts",
        "1",
        "--gen-tokens",
        "2",
    ];
    let args = |out: &std::path::Path, extra: &[&'static str]| {
        let mut a: Vec<String> = plan.iter().map(|s| s.to_string()).collect();
        a.extend(["--out".to_string(), s(out).to_string(), "--quiet".to_string()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let a = args(&one, &[]);
    run(&a.iter().map(String::as_str).collect::<Vec<_>>()).expect_code(0);
    let b = args(&three, &["--worker-processes", "3"]);
    let got = run(&b.iter().map(String::as_str).collect::<Vec<_>>());
    got.expect_code(0);
    assert!(got.stderr.contains("3 worker processes started"), "{}", got.stderr);
    for sub in ["", "edge"] {
        let (x, y) = (read_receipts(&one.join(sub)), read_receipts(&three.join(sub)));
        assert!(x.len() >= 4, "the single process wrote {} receipts in {sub:?}", x.len());
        assert_eq!(
            x.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            y.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            "folder {sub:?}: the workers' receipts are not the single process's"
        );
        for ((n, rx), (_, ry)) in x.iter().zip(&y) {
            assert_eq!(rx.evidence, ry.evidence, "{sub:?}/{n}: the evidence differs between one process and three");
        }
        // The summary's verdict line (its table carries each run's wall time).
        let verdicts = |d: &std::path::Path| {
            let md = std::fs::read_to_string(d.join(sub).join("summary.md")).unwrap();
            md.lines().next().unwrap_or_default().to_string()
        };
        assert_eq!(verdicts(&one), verdicts(&three), "folder {sub:?}: the summaries' verdicts differ");
    }
    assert!(!three.join(".workers").exists(), "the workers' folder is left behind after a clean run");
}

#[test]
fn workers_split_a_shard_into_that_shard_exactly() {
    let dir = tempdir();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let plan = ["run", "--backend", "host", "--preset", "tiny", "--tp", "1,2,4", "--prompts", "1", "--gen-tokens", "2"];
    let with = |out: &std::path::Path, extra: &[&'static str]| {
        let mut a: Vec<&str> = plan.to_vec();
        a.extend(["--shard", "1/2", "--quiet", "--out", s(out)]);
        a.extend(extra);
        run(&a).expect_code(0);
        receipt_names(out)
    };
    let alone = with(&one, &[]);
    assert!(alone.len() >= 3, "shard 1/2 alone wrote {alone:?}");
    assert_eq!(alone, with(&two, &["--worker-processes", "2"]), "two workers of shard 1/2 ran another set");
}

#[test]
fn workers_refuse_a_resume_before_any_work() {
    let dir = tempdir();
    let out = dir.path().join("r");
    let got =
        run(&["run", "--backend", "host", "--preset", "tiny", "--worker-processes", "2", "--resume", "--out", s(&out)]);
    got.expect_code(2);
    assert!(got.stderr.contains("--worker-processes 2 with --resume"), "{}", got.stderr);
    assert!(!out.exists(), "a refused plan created its --out");
}

/// The processes whose command line holds `needle` (Linux: /proc/PID/cmdline).
fn pids_with(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(needle))
        })
        .collect()
}

/// Negative control of the gathering: a worker killed before it writes its receipts leaves the
/// plan incomplete, and the run must say so (exit 2, naming the worker) instead of summarising the
/// receipts that came back as if they were the plan — while keeping those receipts.
#[test]
fn a_worker_that_dies_leaves_the_plan_incomplete_and_the_run_says_so() {
    let dir = tempdir();
    let out = dir.path().join("killed");
    // Two prompts of 8 tokens: long enough that worker 1 is still running when it is killed.
    let args = ["run", "--backend", "host", "--preset", "tiny", "--tp", "1,2", "--prompts", "2", "--gen-tokens", "8"]
        .into_iter()
        .chain(["--transport", "host-bounce", "--batch", "1", "--quiet", "--worker-processes", "2", "--out", s(&out)])
        .collect::<Vec<_>>();
    let _shared = machine_shared();
    let child = command(&args, &[])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let needle = format!("--worker-shard 1/2 --out {}", s(&out.join(".workers").join("1")));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let victim = loop {
        if let Some(pid) = pids_with(&needle).first() {
            break *pid;
        }
        assert!(std::time::Instant::now() < deadline, "worker 1 never started");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert!(std::process::Command::new("kill").args(["-KILL", &victim.to_string()]).status().unwrap().success());
    let got = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(got.status.code(), Some(2), "a run missing a worker's receipts exited {:?}:\n{stderr}", got.status);
    assert!(stderr.contains("the plan is incomplete") && stderr.contains("worker 1/2"), "{stderr}");
    assert!(!receipt_names(&out).is_empty(), "worker 0's receipts were not kept:\n{stderr}");
    assert!(!out.join("summary.json").exists(), "an incomplete plan wrote a summary as if it were whole");
}

/// `matrix --explain --worker-processes N` counts the parts' runs and rank-runs (runs × TP size):
/// at least the whole plan's runs in all (a part runs the baselines another part's configurations
/// would give), the heaviest part at least a third of the whole plan's rank-runs, and on `--matrix
/// all` fewer runs than `--shard i/N`'s blocks of every lane need, the heaviest lighter than theirs.
#[test]
fn matrix_explain_counts_the_workers_parts() {
    let base = ["matrix", "--matrix", "all", "--backend", "cuda", "--tp", "1,2", "--explain"];
    let number_after = |line: &str, what: &str| -> u64 {
        let at = line.find(what).unwrap_or_else(|| panic!("no `{what}` in {line}")) + what.len();
        line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    // (runs, rank-runs) of one process.
    let one = |extra: &[&str]| -> (u64, u64) {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let out = run(&args);
        out.expect_code(0);
        let line = out.stdout.lines().find(|l| l.starts_with("runs on one model")).expect("a runs line").to_string();
        (number_after(&line, "provides = "), number_after(&line, "without timing marks; "))
    };
    let shards: Vec<(u64, u64)> = (0..3).map(|i| one(&["--shard", &format!("{i}/3")])).collect();
    let (whole_runs, whole_weight) = one(&[]);
    let out = run(&[&base[..], &["--worker-processes", "3"]].concat());
    out.expect_code(0);
    let line = out.stdout.lines().find(|l| l.starts_with("with 3 worker processes")).expect("a workers line");
    let (sum, heaviest) = (number_after(line, "need "), number_after(line, " runs, "));
    assert!(sum >= whole_runs, "{line}: fewer runs than the whole plan's {whole_runs}");
    assert!(heaviest * 3 >= whole_weight, "{line}: the heaviest part under a third of {whole_weight} rank-runs");
    assert!(sum < shards.iter().map(|s| s.0).sum(), "{line} (the shards: {shards:?})");
    assert!(heaviest < shards.iter().map(|s| s.1).max().unwrap(), "{line} (the shards: {shards:?})");
}
