//! `run --worker-processes N`: one plan over N child processes of this binary, each running part
//! i/N of it (`--worker-shard i/N`: the parts of what `--shard` left, `crate::plan::parts`; the same arguments
//! otherwise) into `--out/.workers/i`; this process then moves their receipts into `--out` (and
//! `--out/<preset>` for the default model set's further models) and writes the matrix outputs as
//! one run would. An interrupted run leaves the workers' receipts in `--out/.workers/i`.
//!
//! Why processes: a night on CUDA is host-bound — every run is driver calls, one thread's worth
//! (`MEMRA_HOST_CLOCK=1`), and eight jobs on eight threads of one process went no faster than one
//! (docs/gpu/2026-12-04-gpujobs). Separate processes do scale, but only when CUDA's multi-process
//! service (MPS) merges their work into one context: without it the GPU time-slices between the
//! processes' contexts and eight went at 0.45× one process's throughput
//! (docs/gpu/2026-12-01-issue13c), with it at 5.0× (docs/gpu/2026-12-06-night). So on CUDA the
//! workers are refused unless an MPS control pipe is there. A part needs more census baselines
//! than its share of the plan's (a configuration's baseline can land in another part; the parts
//! are cut to keep that rare): `matrix --explain --worker-processes N` counts every part's runs.

use crate::args::RunArgs;
use crate::error::GateError;
use crate::outdir::OutDir;
use memra_receipts::schema::Receipt;
use memra_receipts::store;
use memra_runtime::backend::BackendKind;
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The folder under `--out` that holds the workers' own output folders and logs.
pub const WORKERS_DIR: &str = ".workers";

/// The worker count `args` asks for, when above 1, after checking that it combines with the other
/// flags and, on CUDA, that an MPS control pipe is there (`pipe`: its path, from
/// [`mps_control_pipe`]).
pub fn requested(args: &RunArgs, backend: BackendKind, pipe: Option<&Path>) -> Result<Option<usize>, GateError> {
    let n = match args.worker_processes {
        None | Some(1) => return Ok(None),
        Some(0) => return Err(GateError::usage("--worker-processes 0: use a count of processes ≥ 1")),
        Some(n) => n,
    };
    let clash = |flag: &str, why: &str| GateError::usage(format!("--worker-processes {n} with {flag}: {why}"));
    if args.worker_shard.is_some() {
        return Err(clash("--worker-shard", "a worker starts no workers of its own"));
    }
    if args.resume {
        return Err(clash(
            "--resume",
            "each worker starts its own folder; resume a night by running it again without --worker-processes, \
             or fresh",
        ));
    }
    if args.process.is_some() {
        return Err(clash(
            "--process",
            "a distributed process runs every configuration of the plan in step with its peers",
        ));
    }
    if backend == BackendKind::Cuda && pipe.is_none() {
        return Err(GateError::usage(format!(
            "--worker-processes {n} on CUDA: no CUDA MPS control pipe at {} (CUDA_MPS_PIPE_DIRECTORY, or \
             /tmp/nvidia-mps when unset). Without the multi-process service the GPU time-slices between the \
             processes' contexts (eight processes measured 0.45× the throughput of one); start it first \
             (`nvidia-cuda-mps-control -d`, docs/gpu/README.md \"A night on one GPU\")",
            mps_pipe_dir().join("control").display()
        )));
    }
    Ok(Some(n))
}

/// Where CUDA clients look for the MPS control daemon.
fn mps_pipe_dir() -> PathBuf {
    crate::env::cuda_var("CUDA_MPS_PIPE_DIRECTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/nvidia-mps"))
}

/// The MPS control pipe, when there is one.
pub fn mps_control_pipe() -> Option<PathBuf> {
    let p = mps_pipe_dir().join("control");
    p.exists().then_some(p)
}

/// The arguments of worker `i` of `n`: this process's own, less the flags the worker gets its own
/// value of (`--worker-processes`, `--out`, `--quiet`, `--replace`, `--progress-every`), then
/// `--worker-shard i/N --out DIR --quiet --replace`, and `--jobs J` when given (host workers share
/// the cores: each takes its share of them unless `--jobs` was given).
pub fn worker_args(own: &[OsString], i: usize, n: usize, dir: &Path, jobs: Option<usize>) -> Vec<OsString> {
    const VALUED: [&str; 3] = ["--worker-processes", "--out", "--progress-every"];
    const FLAGS: [&str; 2] = ["--quiet", "--replace"];
    let mut out = Vec::new();
    let mut skip_next = false;
    for a in own {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        let s = a.to_string_lossy();
        if VALUED.contains(&s.as_ref()) {
            skip_next = true;
            continue;
        }
        if FLAGS.contains(&s.as_ref()) || VALUED.iter().any(|f| s.starts_with(&format!("{f}="))) {
            continue;
        }
        out.push(a.clone());
    }
    out.extend(
        [OsStr::new("--worker-shard"), OsStr::new(&format!("{i}/{n}")), OsStr::new("--out"), dir.as_os_str()]
            .into_iter()
            .map(OsString::from),
    );
    out.extend(["--quiet", "--replace"].map(OsString::from));
    if let Some(j) = jobs {
        out.extend([OsString::from("--jobs"), OsString::from(j.to_string())]);
    }
    out
}

/// The folder of worker `i` under `out`.
fn worker_dir(out: &Path, i: usize) -> PathBuf {
    out.join(WORKERS_DIR).join(i.to_string())
}

/// One model's folder of the plan: where its receipts go, the sub-folder of each worker's folder
/// that holds them (none for the first model), and the receipt ids the plan gives it.
pub struct ModelOut<'a> {
    pub out: &'a OutDir,
    pub sub: Option<&'a str>,
    pub ids: &'a BTreeSet<String>,
}

/// Start the `n` workers, wait for all (a line of the receipts written so far every `progress`),
/// move their receipts into each model's folder and return every model's receipts. The plan is
/// whole when every id of every model came back (a worker's exit status alone cannot say it: a
/// shard of NOT-APPLICABLE configurations exits 2, "nothing was tested", as a whole plan of them
/// would); otherwise the error names the missing receipts' count and every worker that did not end
/// in a verdict, with its log — after every receipt that did come back is moved.
pub fn run(
    own: &[OsString],
    n: usize,
    outs: &[ModelOut],
    progress: Option<std::time::Duration>,
    jobs: Option<usize>,
) -> Result<Vec<Vec<Receipt>>, GateError> {
    let exe = std::env::current_exe()
        .map_err(|e| GateError::usage(format!("cannot find this executable (for --worker-processes): {e}")))?;
    let root = outs[0].out.path();
    let base = root.join(WORKERS_DIR);
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| GateError::OutDir {
        dir: base.clone(),
        rule: format!("cannot create the workers' folder: {e}"),
    })?;
    let t0 = Instant::now();
    let mut children = Vec::new();
    for i in 0..n {
        let log_path = base.join(format!("{i}.log"));
        let log = std::fs::File::create(&log_path).map_err(|e| GateError::OutDir {
            dir: base.clone(),
            rule: format!("cannot create {}: {e}", log_path.display()),
        })?;
        let err = log.try_clone().map_err(|e| GateError::OutDir { dir: base.clone(), rule: format!("{e}") })?;
        let child = Command::new(&exe)
            .args(worker_args(own, i, n, &worker_dir(root, i), jobs))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| GateError::usage(format!("cannot start worker {i}/{n} ({}): {e}", exe.display())))?;
        children.push((i, child, log_path));
    }
    eprintln!("memra-gates: {n} worker processes started (logs in {})", base.display());
    let total: usize = outs.iter().map(|m| m.ids.len()).sum();
    let written = || {
        // Names only (reading thousands of receipts at every line would cost more than it says).
        let count = |d: PathBuf| {
            std::fs::read_dir(d).map_or(0, |e| {
                e.flatten().filter(|f| store::run_id_from_file_name(&f.file_name().to_string_lossy()).is_some()).count()
            })
        };
        (0..n)
            .map(|i| {
                outs.iter()
                    .map(|m| count(m.sub.map_or(worker_dir(root, i), |s| worker_dir(root, i).join(s))))
                    .sum::<usize>()
            })
            .sum::<usize>()
    };
    let mut unsettled = Vec::new();
    let mut running: Vec<_> = children.into_iter().map(Some).collect();
    let mut last_line = Instant::now();
    while running.iter().any(Option::is_some) {
        for slot in running.iter_mut() {
            let Some((i, child, log)) = slot else { continue };
            let Some(status) =
                child.try_wait().map_err(|e| GateError::usage(format!("waiting for worker {i}/{n}: {e}")))?
            else {
                continue;
            };
            let last = std::fs::read_to_string(&*log)
                .ok()
                .and_then(|t| t.lines().last().map(str::to_string))
                .unwrap_or_default();
            eprintln!("memra-gates: worker {i}/{n} ended ({status}) at {:.0} s: {last}", t0.elapsed().as_secs_f64());
            // Exit 0 (all passed) and 1 (a gate failed: its receipts say which) are verdicts; any
            // other end is named if receipts turn out missing.
            if !matches!(status.code(), Some(0 | 1)) {
                unsettled.push(format!("worker {i}/{n} ({status}; log {})", log.display()));
            }
            *slot = None;
        }
        if progress.is_some_and(|every| last_line.elapsed() >= every) {
            let done = running.iter().filter(|s| s.is_none()).count();
            eprintln!(
                "memra-gates: {} of {total} receipts written, {done} of {n} workers done, {:.0} s",
                written(),
                t0.elapsed().as_secs_f64()
            );
            last_line = Instant::now();
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut per_model = Vec::new();
    let mut missing = 0;
    for m in outs {
        let mut receipts = Vec::new();
        for i in 0..n {
            let dir = match m.sub {
                Some(s) => worker_dir(root, i).join(s),
                None => worker_dir(root, i),
            };
            if dir.is_dir() {
                receipts.extend(take_receipts(&dir, m.out.path())?);
            }
        }
        receipts.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        missing += m.ids.iter().filter(|id| receipts.binary_search_by(|r| r.run_id.as_str().cmp(id)).is_err()).count();
        per_model.push(receipts);
    }
    if missing > 0 {
        return Err(GateError::usage(format!(
            "the plan is incomplete: {missing} configuration(s) have no receipt from the worker processes ({}); \
             the receipts that came back were moved into --out, the workers' logs are in {}",
            if unsettled.is_empty() { "every worker ended in a verdict".to_string() } else { unsettled.join(", ") },
            base.display()
        )));
    }
    let _ = std::fs::remove_dir_all(&base);
    Ok(per_model)
}

/// Move every receipt of a worker's folder `from` into `to` (a rename: the bytes the worker wrote);
/// an unreadable receipt is an error naming it.
fn take_receipts(from: &Path, to: &Path) -> Result<Vec<Receipt>, GateError> {
    let scan = store::scan_dir(from).map_err(GateError::from)?;
    if let Some(e) = scan.broken.into_iter().next() {
        return Err(GateError::from(e));
    }
    let mut out = Vec::new();
    for (path, r) in scan.receipts {
        let dest = store::receipt_path(to, &r.run_id);
        std::fs::rename(&path, &dest).map_err(|e| GateError::OutDir {
            dir: to.to_path_buf(),
            rule: format!("cannot move the worker's receipt {} there: {e}", path.display()),
        })?;
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(flags: &[&str], backend: BackendKind, pipe: Option<&Path>) -> Result<Option<usize>, String> {
        requested(&crate::args::run_args(flags), backend, pipe).map_err(|e| e.to_string())
    }

    #[test]
    fn workers_are_refused_on_cuda_without_mps_and_with_flags_they_cannot_keep() {
        let pipe = Path::new("/tmp/nvidia-mps/control");
        assert_eq!(asked(&[], BackendKind::Cuda, None), Ok(None));
        assert_eq!(asked(&["--worker-processes", "1"], BackendKind::Cuda, None), Ok(None));
        assert_eq!(asked(&["--worker-processes", "4"], BackendKind::Host, None), Ok(Some(4)));
        assert_eq!(asked(&["--worker-processes", "4", "--shard", "1/3"], BackendKind::Host, None), Ok(Some(4)));
        assert_eq!(asked(&["--worker-processes", "8"], BackendKind::Cuda, Some(pipe)), Ok(Some(8)));
        let no_mps = asked(&["--worker-processes", "8"], BackendKind::Cuda, None).unwrap_err();
        assert!(no_mps.contains("no CUDA MPS control pipe") && no_mps.contains("0.45×"), "{no_mps}");
        for (flag, value) in [("--worker-shard", Some("0/2")), ("--resume", None), ("--process", Some("0/2"))] {
            let mut flags = vec!["--worker-processes", "2", flag];
            flags.extend(value);
            let e = asked(&flags, BackendKind::Host, None).unwrap_err();
            assert!(e.contains(&format!("--worker-processes 2 with {flag}")), "{e}");
        }
        assert!(asked(&["--worker-processes", "0"], BackendKind::Host, None).unwrap_err().contains("≥ 1"));
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_worker_gets_its_shard_folder_and_quiet_and_keeps_every_other_argument() {
        let own = os(&[
            "run",
            "--matrix",
            "all",
            "--worker-processes",
            "4",
            "--out",
            "night",
            "--progress-every=5",
            "--quiet",
            "--tp",
            "1,2",
            "--out=other",
            "--worker-processes=4",
        ]);
        let got = worker_args(&own, 2, 4, Path::new("night/.workers/2"), None);
        assert_eq!(
            got,
            os(&[
                "run",
                "--matrix",
                "all",
                "--tp",
                "1,2",
                "--worker-shard",
                "2/4",
                "--out",
                "night/.workers/2",
                "--quiet",
                "--replace"
            ])
        );
        let host = worker_args(&os(&["run"]), 0, 2, Path::new("w"), Some(3));
        assert_eq!(host[host.len() - 2..], os(&["--jobs", "3"]), "a host worker's share of the cores: {host:?}");
    }
}
