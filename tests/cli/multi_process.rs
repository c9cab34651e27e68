//! `--process P/N` (a run over several processes, docs/multi-host.md): bad values and missing
//! companions are refused with exit status 2, before any device work, naming the value and the
//! rule — from flags and from the environment alike — and nothing is created.

use std::time::Duration;

use crate::util::*;

fn refused(args: &[&str], env: &[(&str, &str)], fragments: &[&str]) {
    let dir = tempdir();
    let (out_dir, ids) = (dir.path().join("out"), dir.path().join("ids"));
    let mut full = vec!["run"];
    full.extend_from_slice(args);
    full.extend(["--out", s(&out_dir)]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, if *v == "IDS" { s(&ids) } else { *v })).collect();
    let out = run_env(&full, &env);
    out.expect_code(2).expect_stderr(fragments);
    assert!(out.elapsed < Duration::from_secs(2), "`{}` took {:?} to refuse", out.line, out.elapsed);
    assert!(!out_dir.exists(), "`{}` created the receipt directory", out.line);
    assert!(!ids.exists(), "`{}` created the rendezvous directory", out.line);
}

const CUDA: [&str; 4] = ["--backend", "cuda", "--transport", "nccl"];

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    CUDA.iter().chain(extra).copied().collect()
}

#[test]
fn bad_process_values_name_the_value_and_the_rule() {
    for (value, why) in [
        ("2/2", "P = 2 is not below N = 2"),
        ("5/4", "P = 5 is not below N = 4"),
        ("0/0", "N = 0 is outside 1..=8"),
        ("0/16", "N = 16 is outside 1..=8"),
        ("1", "there is no `/`"),
        ("one/2", "P \"one\" is not a non-negative integer"),
        ("-1/2", "P \"-1\" is not a non-negative integer"),
    ] {
        let quoted = format!("{value:?}");
        // `--process=V`, so that clap does not take `-1/2` for a flag.
        let flag = format!("--process={value}");
        refused(&with(&[&flag, "--nccl-id-dir", "/tmp/never"]), &[], &["--process", &quoted, why, "use P/N"]);
        // The same value from the environment is refused the same way, naming the variable.
        refused(
            &with(&[]),
            &[("MEMRA_PROCESS", value), ("MEMRA_NCCL_ID_DIR", "IDS")],
            &["MEMRA_PROCESS", &quoted, why],
        );
    }
}

#[test]
fn a_distributed_run_needs_cuda_a_rendezvous_directory_and_no_resume() {
    refused(
        &["--backend", "host", "--process", "0/2", "--nccl-id-dir", "/tmp/never"],
        &[],
        &["--process 0/2 needs --backend cuda (not `host`)"],
    );
    refused(&["--process", "1/2", "--nccl-id-dir", "/tmp/never"], &[], &["needs --backend cuda (not `auto`)"]);
    refused(&with(&["--process", "1/2"]), &[], &["--process 1/2 needs --nccl-id-dir DIR"]);
    refused(&with(&["--process", "0/2", "--nccl-id-dir", "/tmp/never", "--resume"]), &[], &["cannot --resume"]);
    refused(
        &with(&["--process", "0/2", "--nccl-id-dir", "/tmp/never", "--dist-timeout-s", "0"]),
        &[],
        &["--dist-timeout-s 0"],
    );
    refused(&with(&["--nccl-id-dir", "/tmp/never"]), &[], &["without --process P/N"]);
    refused(
        &with(&[]),
        &[("MEMRA_PROCESS", "0/2"), ("MEMRA_NCCL_ID_DIR", "IDS"), ("MEMRA_DIST_TIMEOUT_S", "soon")],
        &["MEMRA_DIST_TIMEOUT_S", "whole number of seconds"],
    );
}

#[test]
fn the_settings_are_declared_in_the_registry() {
    let out = run(&["doors"]);
    out.expect_code(0).expect_stdout(&["MEMRA_PROCESS", "MEMRA_NCCL_ID_DIR", "MEMRA_DIST_TIMEOUT_S"]);
}
