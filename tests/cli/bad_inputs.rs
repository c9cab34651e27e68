//! The corpus of bad inputs: one file per case under `tests/bad_inputs/`, each with the command,
//! what the case needs on disk, the expected exit status and fragments of the expected message,
//! all run by the one test below. A case is data, so a new bad input found by a user is a new
//! file, not new code. The format (TOML, unknown keys refused):
//!
//! ```toml
//! why = "what a user did, and what the answer must say"
//! args = ["run", "--backend", "host", "--model", "{dir}/m.safetensors"]  # {dir}: the case's temp dir, {repo}: the repository
//! env = { MEMRA_OPROJ_DIRECT = "1" }          # optional, added to a clean environment
//! exit = 2
//! stderr = ["fragment", "another"]            # each must appear in stderr
//! stderr_not = ["repeats"]                    # none may appear
//! files_contain = [["out/summary.md", "conflicts"]]   # files the command wrote ({dir}-relative)
//! absent = ["out"]                            # paths that must not exist afterwards
//! interrupt_when_receipts_in = "out"          # send SIGINT once a receipt appears there
//! [[file]]                                    # a file to create: text, or a repository file edited
//! path = "sets.toml"
//! text = "schema_version = 1\nsets = [[]]\n"
//! [[file]]
//! path = "doors.toml"
//! from = "gates/doors.toml"
//! replace = [["old", "new"]]                  # each `old` must occur
//! [[model]]                                   # the shared tiny model file, damaged
//! path = "m.safetensors"
//! drop_entry = "layers.0.experts.0.gate.weight"   # header entry removed, its bytes left in place
//! drop_last_entry = true                     # the entry with the last data removed
//! truncate = 1000                            # bytes cut off the end
//! header_length = 77710244                   # the 8-byte header length overwritten
//! header_length_past_file = 1000             # ... with the file's size minus 8, plus this
//! fifo = ["pipe.safetensors"]                 # named pipes to create
//! ```
//!
//! A case that exits 2 must also answer within [`FAST`] and print nothing on stdout (tables and
//! reports go there; a refusal is one message on stderr).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::util::*;

/// The most a refused request may take (validation happens before any work).
const FAST: Duration = Duration::from_secs(2);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    why: String,
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    exit: i32,
    #[serde(default)]
    stderr: Vec<String>,
    #[serde(default)]
    stderr_not: Vec<String>,
    #[serde(default)]
    files_contain: Vec<(String, String)>,
    #[serde(default)]
    absent: Vec<String>,
    #[serde(default)]
    interrupt_when_receipts_in: Option<String>,
    #[serde(default)]
    file: Vec<FileSetup>,
    #[serde(default)]
    model: Vec<ModelSetup>,
    #[serde(default)]
    fifo: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSetup {
    path: String,
    text: Option<String>,
    from: Option<String>,
    #[serde(default)]
    replace: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSetup {
    path: String,
    drop_entry: Option<String>,
    #[serde(default)]
    drop_last_entry: bool,
    #[serde(default)]
    truncate: usize,
    header_length: Option<u64>,
    header_length_past_file: Option<u64>,
}

/// The header (as JSON) and the data section of a safetensors file.
fn split(bytes: &[u8]) -> (serde_json::Map<String, serde_json::Value>, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&bytes[8..8 + n]).expect("the shared model's header is JSON"), &bytes[8 + n..])
}

/// A safetensors file of `header` and `data` (the header padded with spaces to 8 bytes).
fn join(header: &serde_json::Map<String, serde_json::Value>, data: &[u8]) -> Vec<u8> {
    let mut h = serde_json::to_vec(header).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

fn damaged_model(m: &ModelSetup) -> Vec<u8> {
    let (mut header, data) = split(tiny_model_file());
    if let Some(name) = &m.drop_entry {
        assert!(header.remove(name).is_some(), "the shared model has no tensor {name}");
    }
    if m.drop_last_entry {
        let end = |v: &serde_json::Value| v["data_offsets"][1].as_u64().unwrap_or(0);
        let last = header.iter().filter(|(k, _)| *k != "__metadata__").max_by_key(|(_, v)| end(v)).unwrap().0.clone();
        header.remove(&last);
    }
    let mut bytes = join(&header, data);
    bytes.truncate(bytes.len() - m.truncate);
    let claimed = m.header_length.or(m.header_length_past_file.map(|n| bytes.len() as u64 - 8 + n));
    if let Some(n) = claimed {
        bytes[..8].copy_from_slice(&n.to_le_bytes());
    }
    bytes
}

fn expand(s: &str, dir: &Path) -> String {
    s.replace("{dir}", &dir.display().to_string()).replace("{repo}", &repo("").display().to_string())
}

fn prepare(case: &Case, dir: &Path) {
    for f in &case.file {
        let text = match (&f.text, &f.from) {
            (Some(t), None) => t.clone(),
            (None, Some(from)) => {
                let mut t = std::fs::read_to_string(repo(from)).unwrap_or_else(|e| panic!("{from}: {e}"));
                for (old, new) in &f.replace {
                    assert!(t.contains(old.as_str()), "{from} does not contain {old:?}");
                    t = t.replacen(old.as_str(), new, 1);
                }
                t
            }
            _ => panic!("file {}: give `text` or `from`", f.path),
        };
        std::fs::write(dir.join(&f.path), text).unwrap();
    }
    for m in &case.model {
        std::fs::write(dir.join(&m.path), damaged_model(m)).unwrap();
    }
    for p in &case.fifo {
        let ok = std::process::Command::new("mkfifo").arg(dir.join(p)).status().expect("mkfifo").success();
        assert!(ok, "mkfifo {p}");
    }
}

/// Runs the case's command; with `interrupt_when_receipts_in`, sends SIGINT once a receipt is there.
fn execute(case: &Case, dir: &Path) -> Output {
    let args: Vec<String> = case.args.iter().map(|a| expand(a, dir)).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = case.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let Some(watch) = &case.interrupt_when_receipts_in else { return run_env(&args, &env) };
    let watch = dir.join(watch);
    let _shared = machine_shared();
    let t0 = Instant::now();
    let child = command(&args, &env).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let child = child.expect("start memra-gates");
    while receipt_names(&watch).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no receipt appeared in {}", watch.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    assert!(killed.expect("kill").success());
    let out = child.wait_with_output().expect("wait for memra-gates");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: t0.elapsed(),
        line: format!("memra-gates {} (SIGINT after the first receipt)", args.join(" ")),
    }
}

/// What is wrong with the case's outcome (empty: it passed).
fn check(case: &Case, dir: &Path, out: &Output) -> Vec<String> {
    let mut wrong = Vec::new();
    if out.code != Some(case.exit) {
        wrong.push(format!("exit status {:?}, expected {}", out.code, case.exit));
    }
    for f in &case.stderr {
        if !out.stderr.contains(&expand(f, dir)) {
            wrong.push(format!("stderr lacks {f:?}"));
        }
    }
    for f in &case.stderr_not {
        if out.stderr.contains(f.as_str()) {
            wrong.push(format!("stderr contains {f:?}"));
        }
    }
    for (file, text) in &case.files_contain {
        match std::fs::read_to_string(dir.join(file)) {
            Ok(t) if t.contains(text.as_str()) => {}
            Ok(_) => wrong.push(format!("{file} lacks {text:?}")),
            Err(e) => wrong.push(format!("{file}: {e}")),
        }
    }
    // A summary the case reads is also checked against the published schema.
    for (file, _) in case.files_contain.iter().filter(|(f, _)| f.ends_with("summary.json")) {
        SchemaValidator::new("summary-v1.schema.json").check_file(&dir.join(file));
    }
    for p in &case.absent {
        if dir.join(p).exists() {
            wrong.push(format!("{p} exists although the input was refused"));
        }
    }
    if case.exit == 2 {
        if out.elapsed > FAST {
            wrong.push(format!("refused only after {:?} (limit {FAST:?})", out.elapsed));
        }
        if !out.stdout.trim().is_empty() {
            wrong.push("printed to stdout although it refused its input".to_string());
        }
    }
    wrong
}

#[test]
fn every_bad_input_of_the_corpus_is_answered_as_its_file_says() {
    let corpus = repo("tests/bad_inputs");
    let names = names_where(&corpus, |n| n.ends_with(".toml"));
    assert!(names.len() >= 20, "the corpus holds only {} case(s)", names.len());
    let mut failures = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(corpus.join(name)).unwrap();
        let case: Case = toml::from_str(&text).unwrap_or_else(|e| panic!("tests/bad_inputs/{name}: {e}"));
        assert!(!case.why.trim().is_empty(), "{name}: say why the case exists");
        let tmp = tempdir();
        prepare(&case, tmp.path());
        let out = execute(&case, tmp.path());
        let wrong = check(&case, tmp.path(), &out);
        if !wrong.is_empty() {
            failures.push(format!("{name} ({}): {}\n`{}`\n{}", case.why, wrong.join("; "), out.line, out.transcript()));
        }
    }
    assert!(failures.is_empty(), "{} of {} case(s) failed:\n\n{}", failures.len(), names.len(), failures.join("\n\n"));
}
