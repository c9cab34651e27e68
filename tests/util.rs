//! Helpers shared by the CLI tests: start the real `memra-gates` binary with a clean environment,
//! capture what it said, and read back what it wrote.
//!
//! Every child starts without the caller's `MEMRA_*` variables (strict parsing would refuse a stray
//! one, and a door left on in a developer's shell would change what runs); a test that wants one
//! sets it explicitly.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memra_receipts::json::read_receipt;
use memra_receipts::Receipt;

/// The binary under test (built by cargo for this test binary, release profile).
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_memra-gates")
}

/// A path inside the repository.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `memra-gates ARGS…` with every inherited `MEMRA_*` variable removed and `extra_env` set.
pub fn command(args: &[&str], extra_env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MEMRA_") {
            cmd.env_remove(&name);
        }
    }
    // A panic inside the child should print one message, not a backtrace per test.
    cmd.env_remove("RUST_BACKTRACE");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd
}

/// What one finished invocation did.
pub struct Output {
    /// The exit status; `None` when a signal ended the process.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The command line, for failure messages.
    pub line: String,
}

impl Output {
    /// Panics with the full transcript unless the exit status is `code`.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "`{}` exited with {:?}, expected {code}\n{}",
            self.line,
            self.code,
            self.transcript()
        );
        self
    }

    /// stdout and stderr, labelled, for failure messages.
    pub fn transcript(&self) -> String {
        format!("--- stdout ---\n{}\n--- stderr ---\n{}", self.stdout, self.stderr)
    }

    /// Panics unless stderr contains every fragment.
    pub fn expect_stderr(&self, fragments: &[&str]) -> &Self {
        for f in fragments {
            assert!(self.stderr.contains(f), "`{}`: stderr lacks {f:?}\n{}", self.line, self.transcript());
        }
        self
    }

    /// Panics unless stdout contains every fragment.
    pub fn expect_stdout(&self, fragments: &[&str]) -> &Self {
        for f in fragments {
            assert!(self.stdout.contains(f), "`{}`: stdout lacks {f:?}\n{}", self.line, self.transcript());
        }
        self
    }
}

/// Held (shared) by every child this binary starts, and exclusively by a test that measures
/// timing: the test threads otherwise run children side by side on the machine's cores, and a
/// latency measurement must see the machine as a user running one job would.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The machine to oneself while the guard lives: no other test of this binary starts a child
/// meanwhile (children must then be started with [`run_alone`]).
pub fn machine_alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|p| p.into_inner())
}

/// The machine shared while the guard lives, as [`run`] holds it: for a test that starts a child
/// itself ([`command`] … `spawn`), so that a timing test's [`machine_alone`] waits for that child
/// too. While it is held, this thread starts children with [`run_alone`] (a second shared guard on
/// one thread can deadlock behind a waiting [`machine_alone`]).
pub fn machine_shared() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|p| p.into_inner())
}

/// Runs `memra-gates ARGS…` (clean environment plus `extra_env`) to completion.
pub fn run_env(args: &[&str], extra_env: &[(&str, &str)]) -> Output {
    let _shared = machine_shared();
    run_unlocked(args, extra_env)
}

/// [`run`] inside [`machine_alone`] or [`machine_shared`] (which already hold the machine).
pub fn run_alone(args: &[&str]) -> Output {
    run_unlocked(args, &[])
}

fn run_unlocked(args: &[&str], extra_env: &[(&str, &str)]) -> Output {
    let mut cmd = command(args, extra_env);
    cmd.stdin(Stdio::null());
    let line = std::iter::once("memra-gates".to_string())
        .chain(extra_env.iter().map(|(k, v)| format!("[{k}={v}]")))
        .chain(args.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let t0 = Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot start {}: {e}", bin()));
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: t0.elapsed(),
        line,
    }
}

/// Runs `memra-gates ARGS…` in a clean environment.
pub fn run(args: &[&str]) -> Output {
    run_env(args, &[])
}

/// A path as a `&str` argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("memra-cli-").tempdir().expect("temporary directory")
}

/// File names in `dir` (sorted) that satisfy `keep`; empty when `dir` does not exist.
pub fn names_where(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .map(|e| e.expect("directory entry").file_name().to_string_lossy().into_owned())
        .filter(|n| keep(n))
        .collect();
    names.sort();
    names
}

/// Receipt file names (`run-*.json`) in `dir`, sorted.
pub fn receipt_names(dir: &Path) -> Vec<String> {
    names_where(dir, |n| n.starts_with("run-") && n.ends_with(".json"))
}

/// Temporary files of interrupted atomic writes (`*.tmp`) in `dir`.
pub fn temp_names(dir: &Path) -> Vec<String> {
    names_where(dir, |n| n.ends_with(".tmp"))
}

/// Every receipt of `dir`, read strictly (schema, version, rules), with its file name.
pub fn read_receipts(dir: &Path) -> Vec<(String, Receipt)> {
    receipt_names(dir)
        .into_iter()
        .map(|n| {
            let r = read_receipt(&dir.join(&n)).unwrap_or_else(|e| panic!("{n} does not read back: {e}"));
            (n, r)
        })
        .collect()
}

/// A compiled published JSON Schema document (boon: an independent draft 2020-12 validator).
pub struct SchemaValidator {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
    name: &'static str,
}

impl SchemaValidator {
    /// `receipts/schema/<file>`.
    pub fn new(file: &'static str) -> Self {
        let path = repo("receipts/schema").join(file);
        let mut schemas = boon::Schemas::new();
        let index = boon::Compiler::new()
            .compile(s(&path), &mut schemas)
            .unwrap_or_else(|e| panic!("{file} does not compile: {e:#}"));
        SchemaValidator { schemas, index, name: file }
    }

    /// Panics with the validator's explanation unless `file` validates.
    pub fn check_file(&self, file: &Path) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", file.display()));
        if let Err(e) = self.schemas.validate(&value, self.index) {
            panic!("{} does not validate against {}: {e:#}", file.display(), self.name);
        }
    }
}

/// `(tp, transport, sorted door ids)`: a configuration as `memra-gates matrix` prints it.
/// (TP, transport, door ids sorted, pass shape: `b4`, `t2` or `` for single-token).
pub type ConfigKey = (usize, String, Vec<String>, String);

/// The configurations `memra-gates matrix ARGS…` lists (legal and NOT-APPLICABLE), checking that
/// its closing count line agrees with the listing.
pub fn matrix_listing(args: &[&str]) -> Vec<ConfigKey> {
    let mut full = vec!["matrix"];
    full.extend_from_slice(args);
    let out = run(&full);
    out.expect_code(0);
    let mut keys = Vec::new();
    let mut counted = None;
    for line in out.stdout.lines() {
        let count_line = line.starts_with(|c: char| c.is_ascii_digit());
        if let Some(rest) = line.strip_suffix(" excluded").filter(|_| count_line) {
            // "31 legal, 10 not applicable, 23 excluded"
            let nums: Vec<usize> = rest.split([',', ' ']).filter_map(|w| w.parse().ok()).collect();
            counted = Some(nums[0] + nums[1]);
            break;
        }
        let label = line.split("  NOT-APPLICABLE").next().unwrap_or(line);
        let mut words = label.split_whitespace();
        let tp = words.next().and_then(|w| w.strip_prefix("tp")).and_then(|n| n.parse().ok());
        let (Some(tp), Some(transport), Some(_backend)) = (tp, words.next(), words.next()) else {
            panic!("unexpected `memra-gates matrix` line {line:?}\n{}", out.transcript());
        };
        // Then `+door+door…` and the pass shape (`b4`, `t2`), each when present.
        let (mut doors, mut pass) = (Vec::new(), String::new());
        for w in words {
            match w.strip_prefix('+') {
                Some(d) => doors.extend(d.split('+').map(str::to_string)),
                None => pass = w.to_string(),
            }
        }
        doors.sort();
        keys.push((tp, transport.to_string(), doors, pass));
    }
    assert_eq!(counted, Some(keys.len()), "the count line disagrees with the listing\n{}", out.transcript());
    keys
}

/// Door env name → door id, from `memra-gates doors --json`.
pub fn door_ids_by_env() -> std::collections::BTreeMap<String, String> {
    let out = run(&["doors", "--json"]);
    out.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("doors --json is JSON");
    v["doors"]
        .as_array()
        .expect("doors --json has a doors array")
        .iter()
        .map(|d| (d["env"].as_str().unwrap().to_string(), d["id"].as_str().unwrap().to_string()))
        .collect()
}

/// The configuration key of a receipt (door env names mapped to ids, doors switched on only).
pub fn receipt_key(r: &Receipt, ids: &std::collections::BTreeMap<String, String>) -> ConfigKey {
    let c = &r.evidence.config;
    let mut doors: Vec<String> = c
        .doors
        .iter()
        .filter(|(_, on)| **on)
        .map(|(env, _)| ids.get(env).unwrap_or_else(|| panic!("receipt door {env} is not in the registry")).clone())
        .collect();
    doors.sort();
    (c.tp, c.transport.as_str().to_string(), doors, c.pass_label())
}

/// A short host run (1 prompt, 2 generated tokens) at the TP sizes `tp`, writing receipts to
/// `out`, followed by `extra` (matrix, transport, doors, model). Of the `tiny` model only, unless
/// `extra` names a model: the default model set's second model (`edge`, into `out/edge`) would
/// double every run for receipts these tests do not read (`run_default.rs` and `.ci/run` gate it).
/// Single-token only (`--batch 1`) unless `extra` names a matrix or a pass axis, for the same
/// reason: the default rows and columns (b4, t4 at TP1/TP2) are gated by `run_default.rs`,
/// `gates/tests/rows_columns.rs` and the shared single night, whose matrix lists them.
pub fn short_host_run<'a>(tp: &'a str, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--backend", "host", "--tp", tp, "--prompts", "1", "--gen-tokens", "2", "--out", s(out)];
    args.extend_from_slice(extra);
    if !extra.iter().any(|a| *a == "--model" || *a == "--preset") {
        args.extend(["--preset", "tiny"]);
    }
    if !extra.iter().any(|a| ["--matrix", "--batch", "--columns"].contains(a)) {
        args.extend(["--batch", "1"]);
    }
    args
}

/// The receipts of `short_host_run("1,2", DIR, ["--matrix", "single", "--quiet"])`, run once per
/// test binary and shared, read-only, by every test that reads such a night (the single matrix's
/// gates, promote, matrix vs run): the slowest plan of this binary, run once instead of four times.
/// Its folder lives under cargo's `CARGO_TARGET_TMPDIR` (a static is never dropped).
pub fn single_night() -> &'static SharedRun {
    static RUN: std::sync::OnceLock<SharedRun> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("single-night-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("a folder under CARGO_TARGET_TMPDIR")
            .keep();
        let night = dir.join("night");
        let out = run(&short_host_run("1,2", &night, &["--matrix", "single", "--quiet"]));
        out.expect_code(0);
        SharedRun { dir: night, out }
    })
}

/// A run shared by several tests: where it wrote, and what it said.
pub struct SharedRun {
    pub dir: PathBuf,
    pub out: Output,
}

/// `memra-gates matrix` arguments of the `single` matrix at TP1/TP2 over both host transports.
pub const SINGLE_TP12_HOST: [&str; 8] =
    ["--matrix", "single", "--backend", "host", "--tp", "1,2", "--transport", "host-bounce,native-p2p"];

/// The bytes of `gen-model --preset tiny --layers 1` (seed 1), generated once per test binary and
/// shared by every test that needs a real model file to damage or load.
pub fn tiny_model_file() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = tempdir();
        let file = dir.path().join("tiny-1-layer.safetensors");
        run(&["gen-model", "--preset", "tiny", "--layers", "1", "--out", s(&file)]).expect_code(0);
        std::fs::read(&file).expect("the generated model file")
    })
}
