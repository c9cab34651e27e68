//! An external subject: an engine started as a child process for every run, speaking the subject
//! protocol (`super::protocol`). This module is the gates' side of one start: the battery file,
//! the environment, the time limit (the process group is killed past it), the exit status, and
//! the strict reading of the tape into a record. Whatever goes wrong becomes a [`SubjectError`]
//! with the verdict it earns (ERROR, or VOID for an engagement the census does not back), so the
//! matrix goes on and nothing unproven reads as PASS.

use super::protocol::battery::BatteryFile;
use super::protocol::manifest::{Manifest, SubjectClass};
use super::protocol::shapes::SHAPES_SINCE;
use super::protocol::tape::{self, DoorState, Expect};
use super::protocol::witness::{self, OutsideWitness};
use super::{Builtin, RunSpec, Subject, SubjectError};
use crate::error::GateError;
use crate::registry::{
    SUBJECT_BACKEND, SUBJECT_BATTERY, SUBJECT_MODEL, SUBJECT_PROTOCOL, SUBJECT_TAPE, SUBJECT_TP, SUBJECT_TRANSPORT,
};
use memra_receipts::schema::Verdict;
use memra_runtime::backend::BackendKind;
use memra_runtime::model::ModelConfig;
use memra_runtime::record::Record;
use memra_runtime::{Battery, Canary, ExpertFormat};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Lines of a failed subject's output quoted in the receipt.
const TAIL_LINES: usize = 8;

/// An engine outside this process, started once per run.
pub struct External {
    manifest: Manifest,
    config: ModelConfig,
    battery: Battery,
    /// A private directory for the model, battery files, tapes and logs; removed on drop.
    work: PathBuf,
    model_path: PathBuf,
    /// This executable (the `{memra_gates}` placeholder).
    gates_exe: PathBuf,
    /// `MEMRA_*` variables of this process, removed from every subject's environment.
    inherited: Vec<String>,
    next: AtomicUsize,
    /// The watcher that ends the subject's process groups and removes `work` when this process
    /// ends in any way (`Guard`).
    guard: Option<Guard>,
    /// The outside witness armed for CUDA starts (`run --witness`), when there is one.
    witness: Option<OutsideWitness>,
}

/// A small shell process in a process group of its own, holding the read end of a pipe whose
/// write end only this process has: when this process ends — returning, a SIGINT or SIGTERM with
/// the default action, a watchdog exit, SIGKILL — the pipe closes, and the watcher kills the
/// process group of every subject start still marked (`group-<pid>` files in the work directory,
/// present exactly while a start runs) and removes the work directory. Its own process group keeps
/// it out of a terminal's Ctrl-C, and it ignores SIGINT, SIGTERM and SIGHUP.
struct Guard {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
}

/// The watcher's script: `$1` is the work directory. (`kill -9 -PGID`: dash's `kill` takes no `--`.)
const GUARD_SCRIPT: &str = r#"trap '' INT TERM HUP
read -r _ || true
for f in "$1"/group-*; do
  [ -e "$f" ] || continue
  kill -9 "-${f##*/group-}" 2>/dev/null
done
rm -rf -- "$1"
"#;

impl Guard {
    fn start(work: &Path) -> Result<Guard, GateError> {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", GUARD_SCRIPT, "memra-subject-guard"])
            .arg(work)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|e| {
            GateError::usage(format!("cannot start the watcher (sh) that cleans up after the subject: {e}"))
        })?;
        let stdin = child.stdin.take();
        Ok(Guard { child, stdin })
    }

    /// Close the pipe (the watcher cleans up now) and wait for it.
    fn finish(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// How a start begins: `$0` is the work directory, `$@` the subject's argv.
const MARK_AND_EXEC: &str = r#": > "$0/group-$$" && exec "$@""#;

/// A running start's mark for the watcher: `group-<pid>` in the work directory, written by the
/// start itself ([`MARK_AND_EXEC`]); removed as soon as the start has been waited for (a pid is
/// reused only after that).
struct GroupMark(PathBuf);

impl GroupMark {
    fn of(work: &Path, pid: u32) -> GroupMark {
        GroupMark(work.join(format!("group-{pid}")))
    }
}

impl Drop for GroupMark {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl External {
    /// Prepare the subject of `manifest` for the plan's model and battery (held by `runtime`):
    /// a private work directory and the model file every start reads. `inherited` are the
    /// `MEMRA_*` names of this process's environment (`crate::env::memra_names`).
    pub fn prepare(
        manifest: Manifest,
        runtime: &Builtin,
        inherited: Vec<String>,
        witness: Option<OutsideWitness>,
    ) -> Result<External, GateError> {
        let work = private_dir()?;
        let guard = match Guard::start(&work) {
            Ok(g) => g,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&work);
                return Err(e);
            }
        };
        let model_path = work.join("model.safetensors");
        memra_runtime::model::format::save(&runtime.model, &model_path)?;
        let gates_exe = std::env::current_exe()
            .map_err(|e| GateError::usage(format!("cannot find this executable for {{memra_gates}}: {e}")))?;
        Ok(External {
            manifest,
            config: runtime.model.config.clone(),
            battery: runtime.battery.clone(),
            work,
            model_path,
            gates_exe,
            inherited,
            next: AtomicUsize::new(0),
            guard: Some(guard),
            witness,
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn who(&self) -> String {
        format!("subject {} {}", self.manifest.name, self.manifest.version)
    }

    fn error(&self, reason: String) -> SubjectError {
        SubjectError::Failed { verdict: Verdict::Error, reason }
    }

    /// Every door of the subject, on or off in this run; a door the run asks for that the
    /// subject does not have is refused (the plan never builds one).
    fn door_states(&self, spec: &RunSpec) -> Result<Vec<DoorState>, SubjectError> {
        let doors = self.manifest.registry.doors();
        if let Some((env, _)) = spec.door_vars.iter().find(|(env, on)| **on && !doors.iter().any(|d| d.env == **env)) {
            return Err(
                self.error(format!("{}: the run asks for door {env}, which the manifest does not list", self.who()))
            );
        }
        Ok(doors
            .iter()
            .map(|d| DoorState {
                env: d.env.clone(),
                counter: d.engagement.clone(),
                on: spec.door_vars.get(&d.env).copied().unwrap_or(false),
            })
            .collect())
    }

    /// The command of one start: argv with placeholders expanded, the protocol's environment.
    fn command(&self, spec: &RunSpec, doors: &[DoorState], battery: &Path, tape: &Path) -> Command {
        let argv = self.manifest.argv(&self.gates_exe);
        // A shell marks the start for the watcher (`group-<pid>`, its pid being the process group's)
        // before it becomes the subject's program (`exec`: the same pid): marked before any of the
        // subject's code runs, so no start escapes the watcher.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", MARK_AND_EXEC]).arg(&self.work).args(&argv).stdin(Stdio::null());
        for name in &self.inherited {
            cmd.env_remove(name);
        }
        // The version of its manifest: a version 1 subject is spoken to as before.
        cmd.env(SUBJECT_PROTOCOL, self.manifest.shapes.protocol.to_string())
            .env(SUBJECT_BACKEND, spec.backend.name())
            .env(SUBJECT_TP, spec.tp.to_string())
            .env(SUBJECT_TRANSPORT, spec.transport.name())
            .env(SUBJECT_MODEL, &self.model_path)
            .env(SUBJECT_BATTERY, battery)
            .env(SUBJECT_TAPE, tape);
        for d in doors {
            cmd.env(&d.env, if d.on { "1" } else { "0" });
        }
        if let Some(Canary::FlipBit { layer, seam, step, element }) = spec.doors.canary {
            cmd.env(crate::registry::CANARY_FLIP_AT, format!("{layer}:{}:{step}:{element}", seam.name()));
        }
        // Its own process group: a kill at the time limit reaches whatever it started.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd
    }

    /// Start, wait (at most the time limit), and read the tape of one run.
    fn start_and_read(&self, spec: &RunSpec, files: &RunFiles) -> Result<Record, SubjectError> {
        if spec.format == ExpertFormat::Nvfp4 && !spec.doors.nvfp4_banks() {
            return Err(self.error(format!(
                "{}: the protocol carries no expert format; NVFP4 banks come only with a door",
                self.who()
            )));
        }
        // The plan makes such a configuration NOT-APPLICABLE; never run one as another shape.
        if let Some(why) = self.manifest.shapes.not_applicable(&self.who(), spec.pass) {
            return Err(self.error(why));
        }
        let doors = self.door_states(spec)?;
        let forced = spec.forced.map(|r| r.tokens.as_slice());
        // Protocol 2: the battery file names the pass shape (version 2 of the file).
        let pass = (self.manifest.shapes.protocol >= SHAPES_SINCE).then_some(spec.pass);
        let battery = BatteryFile::new(&self.battery, forced, &spec.capture, pass);
        std::fs::write(&files.battery, battery.to_json())
            .map_err(|e| self.error(format!("cannot write the battery file {}: {e}", files.battery.display())))?;
        let log = std::fs::File::create(&files.log)
            .map_err(|e| self.error(format!("cannot create the log {}: {e}", files.log.display())))?;
        let log2 =
            log.try_clone().map_err(|e| self.error(format!("cannot share the log {}: {e}", files.log.display())))?;
        let mut cmd = self.command(spec, &doors, &files.battery, &files.tape);
        cmd.stdout(log).stderr(log2);
        // A CUDA start is counted from outside its code when a witness is armed.
        let witnessed = self.witness.as_ref().filter(|_| spec.backend == BackendKind::Cuda);
        if let Some(w) = witnessed {
            std::fs::create_dir(&files.witness).map_err(|e| {
                self.error(format!("cannot create the witness directory {}: {e}", files.witness.display()))
            })?;
            w.arm(&mut cmd, &files.witness);
        }
        let mut child = cmd.spawn().map_err(|e| {
            self.error(format!(
                "{}: cannot start {:?} (manifest {}): {e}",
                self.who(),
                self.manifest.command,
                self.manifest.path.display()
            ))
        })?;
        let limit = self.manifest.time_limit;
        let waited = {
            let _mark = GroupMark::of(&self.work, child.id());
            wait_at_most(&mut child, limit)
        };
        let status = match waited {
            Ok(Some(status)) => status,
            Ok(None) => {
                return Err(self.error(format!(
                    "{} did not finish within its time limit of {}s (time_limit_s of its manifest): killed{}",
                    self.who(),
                    limit.as_secs(),
                    tail(&files.log)
                )))
            }
            Err(e) => return Err(self.error(format!("{}: waiting for it failed: {e}", self.who()))),
        };
        if !status.success() {
            return Err(self.error(format!("{} {}{}", self.who(), describe_exit(status), tail(&files.log))));
        }
        let bytes = std::fs::read(&files.tape).map_err(|e| {
            self.error(format!(
                "{} exited 0 but wrote no tape at {} ({e}){}",
                self.who(),
                files.tape.display(),
                tail(&files.log)
            ))
        })?;
        let expect = Expect {
            subject: &self.manifest.name,
            version: &self.manifest.version,
            config: &self.config,
            battery: &self.battery,
            capture: &spec.capture,
            doors: &doors,
            pass: spec.pass,
        };
        let mut record = tape::read(&bytes, &expect).map_err(|e| {
            let reason = match &e {
                tape::TapeError::Reported(r) => r.clone(),
                tape::TapeError::Malformed(r) => format!("the tape of {}: {r}", self.who()),
                tape::TapeError::Unbacked(r) => r.clone(),
            };
            SubjectError::Failed { verdict: e.verdict(), reason }
        })?;
        if witnessed.is_some() {
            witness::apply(&mut record, &files.witness).map_err(|e| self.error(format!("{}: {e}", self.who())))?;
        }
        Ok(record)
    }
}

/// The files of one start.
struct RunFiles {
    battery: PathBuf,
    tape: PathBuf,
    log: PathBuf,
    /// The outside witness's records of this start (a directory, made only when armed).
    witness: PathBuf,
}

impl Subject for External {
    fn name(&self) -> &str {
        &self.manifest.name
    }
    fn version(&self) -> &str {
        &self.manifest.version
    }
    fn exact(&self) -> bool {
        self.manifest.class == SubjectClass::Exact
    }
    fn census_witness(&self, backend: BackendKind) -> Option<String> {
        Some(match (&self.witness, backend) {
            (Some(_), BackendKind::Cuda) => memra_witness::format::WITNESS_NAME.to_string(),
            _ => memra_receipts::schema::CENSUS_SELF_REPORTED.to_string(),
        })
    }
    fn run(&self, spec: RunSpec) -> Result<Record, SubjectError> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let files = RunFiles {
            battery: self.work.join(format!("run-{n}.battery.json")),
            tape: self.work.join(format!("run-{n}.tape.safetensors")),
            log: self.work.join(format!("run-{n}.log")),
            witness: self.work.join(format!("run-{n}.witness")),
        };
        let result = self.start_and_read(&spec, &files);
        for f in [&files.battery, &files.tape, &files.log] {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir_all(&files.witness);
        result
    }
}

impl Drop for External {
    fn drop(&mut self) {
        if let Some(mut g) = self.guard.take() {
            g.finish();
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// A fresh directory under the system's temporary directory, for this process only.
fn private_dir() -> Result<PathBuf, GateError> {
    let base = std::env::temp_dir();
    for n in 0..1000 {
        let dir = base.join(format!("memra-subject-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(GateError::usage(format!(
                    "cannot create a work directory for the subject in {}: {e}",
                    base.display()
                )))
            }
        }
    }
    Err(GateError::usage(format!(
        "cannot create a work directory for the subject in {}: every name is taken",
        base.display()
    )))
}

/// Wait for `child` at most `limit`; past it, kill its process group and return `None`.
fn wait_at_most(child: &mut Child, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            kill_group(child);
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// SIGKILL to the child's process group (it leads one: `process_group(0)`), then to the child.
fn kill_group(child: &mut Child) {
    #[cfg(unix)]
    {
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.kill();
}

/// "exited with status 3", "was ended by signal 11".
fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("was ended by signal {sig}");
        }
    }
    format!("ended ({status})")
}

/// `; its output ends: "…" | "…"` — the last lines of a run's log, or nothing when it is empty.
fn tail(log: &Path) -> String {
    let text = std::fs::read(log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let lines: Vec<String> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let clean: String = l.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
            if clean.chars().count() > 200 {
                clean.chars().take(199).collect::<String>() + "…"
            } else {
                clean
            }
        })
        .collect();
    if lines.is_empty() {
        return "; it printed nothing".to_string();
    }
    let from = lines.len().saturating_sub(TAIL_LINES);
    format!("; its output ends: {}", lines[from..].iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(" | "))
}
