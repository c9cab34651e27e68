//! Bad input gets exit status 2, one clear message that names the value and the rule, fails in well
//! under two seconds (before any device work, docs/DESIGN.md §9: flags become a checked plan first), and changes
//! nothing: no receipt, not even the --out directory.

use std::path::Path;
use std::time::Duration;

use crate::util::*;

/// The most a refused request may take (the harness validates before computing any oracle).
const FAST: Duration = Duration::from_secs(2);

/// Runs `args` (plus `--out <tmp>/out` for commands that write), expects exit 2 within [`FAST`],
/// every fragment in stderr, and no output directory.
fn refused(args: &[&str], env: &[(&str, &str)], fragments: &[&str]) -> Output {
    let dir = tempdir();
    let out_dir = dir.path().join("out");
    let mut full: Vec<&str> = args.to_vec();
    if matches!(args.first(), Some(&"run") | Some(&"selftest")) {
        full.extend(["--out", s(&out_dir)]);
    }
    let out = run_env(&full, env);
    out.expect_code(2).expect_stderr(fragments);
    assert!(out.elapsed < FAST, "`{}` took {:?} to refuse its input (limit {FAST:?})", out.line, out.elapsed);
    assert!(
        !out_dir.exists(),
        "`{}` created {} although it refused to run: {:?}",
        out.line,
        out_dir.display(),
        receipt_names(&out_dir)
    );
    // The message goes to stderr; stdout (where tables and reports go) stays empty.
    assert!(out.stdout.trim().is_empty(), "`{}` printed to stdout\n{}", out.line, out.transcript());
    out
}

const HOST: [&str; 3] = ["run", "--backend", "host"];

fn host<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    HOST.iter().chain(extra).copied().collect()
}

#[test]
fn tp_outside_the_canonical_grid_is_refused_with_the_rule() {
    refused(&host(&["--tp", "3"]), &[], &["TP size 3", "1, 2, 4 or 8"]);
    refused(&host(&["--tp", "1,16"]), &[], &["TP size 16", "1, 2, 4 or 8"]);
    // `memra-gates --tp 3` is `memra-gates run --tp 3`.
    refused(&["--backend", "host", "--tp", "3", "--out", "/nonexistent/never-created"], &[], &["TP size 3"]);
    assert!(!Path::new("/nonexistent/never-created").exists());
}

#[test]
fn unknown_transport_and_backend_are_refused() {
    refused(&host(&["--transport", "carrier-pigeon"]), &[], &["carrier-pigeon", "host-bounce", "native-p2p"]);
    refused(&["run", "--backend", "tpu"], &[], &["tpu", "auto, host or cuda"]);
}

#[test]
fn door_environment_is_parsed_strictly() {
    let out = refused(&host(&[]), &[("MEMRA_OPROJ_DIRECT", "yes")], &["MEMRA_OPROJ_DIRECT", "\"yes\""]);
    assert!(!out.stderr.contains("did you mean"), "{}", out.transcript());
    refused(&host(&[]), &[("MEMRA_OPROJ_DIRCT", "1")], &["MEMRA_OPROJ_DIRCT", "did you mean MEMRA_OPROJ_DIRECT"]);
    // The tool's own settings are strict too.
    refused(
        &host(&["--door", "canary_flip_bit"]),
        &[("MEMRA_CANARY_FLIP_AT", "banana")],
        &["MEMRA_CANARY_FLIP_AT", "\"banana\""],
    );
}

#[test]
fn door_rules_are_quoted_when_explicit_requests_break_them() {
    // oproj_tail without oproj_direct: the `requires` rule and its reason.
    refused(&host(&["--door", "oproj_tail"]), &[], &["MEMRA_OPROJ_TAIL", "requires MEMRA_OPROJ_DIRECT", "rule:"]);
    // The same request through the environment.
    refused(&host(&[]), &[("MEMRA_OPROJ_TAIL", "1")], &["requires MEMRA_OPROJ_DIRECT", "rule:"]);
    // A declared conflict holds both ways.
    refused(
        &host(&["--door", "w8", "--door", "qkv_fused"]),
        &[],
        &["conflicts with", "MEMRA_STEP_TP_W8", "MEMRA_STEP_TP_QKV_FUSED", "rule:"],
    );
    refused(&host(&["--door", "qkv_fused", "--door", "w8"]), &[], &["conflicts with", "rule:"]);
    refused(&host(&["--door", "nonexistent"]), &[], &["\"nonexistent\"", "not a known door"]);
    refused(&host(&["--door", "oproj_direct=2"]), &[], &["oproj_direct=2", "NAME=1 or NAME=0"]);
}

#[test]
fn missing_and_corrupt_model_files_are_refused_with_the_file_named() {
    refused(&host(&["--model", "/nonexistent/model.safetensors"]), &[], &["/nonexistent/model.safetensors"]);

    let dir = tempdir();
    // Garbage: fixed bytes (no header a reader could accept).
    let garbage = dir.path().join("garbage.safetensors");
    let bytes: Vec<u8> = (0u32..4096).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&garbage, bytes).unwrap();
    refused(&host(&["--model", s(&garbage)]), &[], &[s(&garbage), "not a valid safetensors file"]);

    // A real file, truncated: header intact, tensor data cut short.
    let full = tiny_model_file();
    for cut in [full.len() / 2, full.len() - 1] {
        let truncated = dir.path().join(format!("truncated-{cut}.safetensors"));
        std::fs::write(&truncated, &full[..cut]).unwrap();
        refused(&host(&["--model", s(&truncated)]), &[], &[s(&truncated)]);
    }
    // An empty file.
    let empty = dir.path().join("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    refused(&host(&["--model", s(&empty)]), &[], &[s(&empty)]);
}

#[test]
fn malformed_matrix_and_shard_are_refused() {
    refused(&host(&["--matrix", "nonsense"]), &[], &["\"nonsense\"", "all, single, pairwise"]);
    refused(&host(&["--shard", "3/2"]), &[], &["\"3/2\"", "0 <= I < N"]);
    refused(&["matrix", "--matrix", "nonsense"], &[], &["\"nonsense\""]);
    refused(&["matrix", "--tp", "3"], &[], &["TP size 3"]);
}

#[test]
fn selftest_refuses_an_unknown_canary_to_disarm() {
    refused(&["selftest", "--backend", "host", "--disarm", "canary_nonexistent"], &[], &["canary_nonexistent"]);
}

/// The documented example receipt with its `schema_version` replaced.
fn example_with_version(dir: &Path, version: u32) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo("receipts/schema/example-run-v1.json")).unwrap();
    let edited = text.replacen("\"schema_version\": 1,", &format!("\"schema_version\": {version},"), 1);
    assert!(version == 1 || edited != text, "the example receipt has no `\"schema_version\": 1,` to edit");
    let run_id = memra_receipts::json::parse_receipt(text.as_bytes(), Path::new("example")).unwrap().run_id;
    let sub = dir.join(format!("v{version}"));
    std::fs::create_dir_all(&sub).unwrap();
    let path = sub.join(format!("run-{run_id}.json"));
    std::fs::write(&path, edited).unwrap();
    path
}

#[test]
fn diff_refuses_receipts_of_an_unknown_schema_version() {
    let dir = tempdir();
    let v7 = example_with_version(dir.path(), 7);
    let v1 = example_with_version(dir.path(), 1);
    // As files and as directories, on either side.
    refused(&["diff", s(&v7), s(&v1)], &[], &["schema_version 7", s(&v7)]);
    refused(&["diff", s(&v1), s(&v7)], &[], &["schema_version 7"]);
    refused(&["diff", s(v7.parent().unwrap()), s(v1.parent().unwrap())], &[], &["schema_version 7"]);
    // The control: the same file at version 1 is accepted.
    run(&["diff", s(&v1), s(&v1)]).expect_code(0);
    refused(&["diff", s(&v1), s(&v1), "--format", "yaml"], &[], &["\"yaml\"", "md, text, json"]);
}

/// Values that used to pass the checks and fail later — an overflowing KV check (FAIL receipts),
/// repeated TP sizes or transports (an internal error after the run), a prompt count the battery
/// does not have, zero workers, a model file together with a preset — are refused up front.
#[test]
fn values_refused_before_any_work() {
    refused(
        &host(&["--gen-tokens", "18446744073709551615"]),
        &[],
        &["--gen-tokens 18446744073709551615", "KV cache holds 64"],
    );
    refused(&host(&["--gen-tokens", "60"]), &[], &["--gen-tokens 60", "use --gen-tokens 58 or fewer"]);
    refused(&host(&["--tp", "2,2"]), &[], &["--tp 2,2", "TP2 is given twice"]);
    refused(&host(&["--transport", "native-p2p,host-bounce,native-p2p"]), &[], &["native-p2p is given twice"]);
    refused(&host(&["--prompts", "9"]), &[], &["--prompts 9", "the battery has 8 prompts"]);
    refused(&host(&["--jobs", "0"]), &[], &["--jobs 0", "at least one worker"]);
    refused(&host(&["--host-ranks", "fibers"]), &[], &["--host-ranks fibers", "auto, threads", "inline"]);
    refused(
        &host(&["--model", "m.safetensors", "--preset", "small"]),
        &[],
        &["--model", "cannot be used with", "--preset"],
    );
    refused(&host(&["--model", "m.safetensors", "--layers", "1"]), &[], &["cannot be used with"]);
    refused(&["selftest", "--backend", "host", "--prompts", "0"], &[], &["--prompts 0"]);
}

#[test]
fn a_model_that_cannot_fit_in_memory_is_refused_with_the_estimate() {
    let dir = tempdir();
    let file = dir.path().join("huge.safetensors");
    let out = run(&["gen-model", "--preset", "step", "--layers", "4000", "--out", s(&file)]);
    out.expect_code(2).expect_stderr(&["--preset step", "4000 layers needs about", "GiB of memory", "available"]);
    assert!(out.elapsed < FAST, "refused after {:?}", out.elapsed);
    assert!(!file.exists());
    // The same for a run that would generate it in memory.
    refused(&host(&["--preset", "step", "--layers", "4000"]), &[], &["4000 layers needs about"]);
}

#[test]
fn bench_refuses_a_file_name_for_its_receipt_directory_before_running() {
    let dir = tempdir();
    let file = dir.path().join("bench.json");
    let out = run(&["bench", "--backend", "host", "--allow-host", "--no-torch", "--out", s(&file)]);
    out.expect_code(2).expect_stderr(&["bench.json", "give a directory"]);
    assert!(out.elapsed < FAST, "refused after {:?}", out.elapsed);
    assert!(!file.exists(), "bench created {}", file.display());
}

/// On a GPU CI machine `MEMRA_REQUIRE_GPU=1` must turn a missing device into an error, also for
/// `--backend auto`, which would otherwise quietly run on the host.
#[test]
fn require_gpu_forbids_the_host_fallback_of_auto() {
    let probe = run(&["probe", "--backend", "auto", "--ranks", "2", "--transport", "host-bounce", "--reps", "1"]);
    if probe.stderr.contains("auto → cuda") {
        println!("skipped: a CUDA device is present, so auto does not fall back");
        return;
    }
    let out = refused(&["run", "--tp", "1"], &[("MEMRA_REQUIRE_GPU", "1")], &["MEMRA_REQUIRE_GPU=1", "falling back"]);
    assert!(out.stderr.contains("--backend auto"), "{}", out.transcript());
    // Without the setting the same command falls back and says so.
    let dir = tempdir();
    let out_dir = dir.path().join("r");
    run(&["run", "--tp", "1", "--prompts", "1", "--gen-tokens", "1", "--quiet", "--out", s(&out_dir)])
        .expect_code(0)
        .expect_stderr(&["backend auto → host"]);
}
