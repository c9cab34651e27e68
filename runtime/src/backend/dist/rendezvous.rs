//! How processes of one distributed run agree on NCCL unique ids: files in a shared directory.
//!
//! Process 0 publishes, the others wait. Every process runs the same plan in the same order, so
//! the k-th distributed run of every process opens the k-th communicator and takes the k-th id.
//! Each file carries a fingerprint of the plan (binary, flags, model, battery, process count), so
//! a process started with something else fails at once with both fingerprints instead of hanging
//! in NCCL.
//!
//! # Files (format version 1, plain text, one `key value` per line)
//!
//! ```text
//! DIR/plan            written by process 0 when it starts      DIR/nccl-id-0003   communicator 3
//! memra-rendezvous 1                                            memra-rendezvous 1
//! what plan                                                     what nccl-id 3
//! processes 2                                                   processes 2
//! fingerprint 5be0f1d2c3a49e71                                  fingerprint 5be0f1d2c3a49e71
//!                                                               id 9a0b…(256 hex digits: the 128-byte ncclUniqueId)
//! ```
//!
//! Publication is atomic: the text is written to `DIR/.<name>.tmp-<pid>` and renamed into place,
//! so a reader sees a whole file or none (also on NFS, where rename is atomic at the server).
//! Readers poll every 20 ms up to the timeout and then fail naming the file, the process and how
//! long it waited. A directory is used by one launch: process 0 refuses one that already holds a
//! `plan` or `nccl-id-*` file (a waiting process could otherwise take a stale id and hang).

use crate::error::RuntimeError;
use crate::Result;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::layout::ProcessSpec;

/// The version line every rendezvous file starts with.
const HEADER: &str = "memra-rendezvous 1";
/// How often a waiting process looks for a file.
const POLL: Duration = Duration::from_millis(20);

/// One process's side of the rendezvous directory.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    dir: PathBuf,
    spec: ProcessSpec,
    fingerprint: String,
    timeout: Duration,
    /// Index of the next communicator id.
    next: usize,
}

/// The name of communicator `k`'s id file.
pub fn id_file_name(k: usize) -> String {
    format!("nccl-id-{k:04}")
}

/// Write `text` to `path` atomically (temp file in the same directory + rename).
pub fn publish(path: &Path, text: &str) -> Result<()> {
    let io = |e: std::io::Error| RuntimeError::Io { path: path.to_path_buf(), source: e };
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| RuntimeError::Io { path: tmp.clone(), source: e })?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The text of `path` once it exists, polling until `timeout`; the error says who waited
/// (`waiter`) for what (`what`) and for how long.
pub fn wait_for(path: &Path, timeout: Duration, waiter: &str, what: &str) -> Result<String> {
    let start = Instant::now();
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) => return Ok(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RuntimeError::Io { path: path.to_path_buf(), source: e }),
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(RuntimeError::Rendezvous {
                path: path.to_path_buf(),
                detail: format!(
                    "{waiter} waited {:.1} s (the timeout) for {what}, and it never appeared: process 0 has not \
                     reached it, failed, or uses another --nccl-id-dir (raise the limit with --dist-timeout-s)",
                    waited.as_secs_f64()
                ),
            });
        }
        std::thread::sleep(POLL.min(timeout - waited));
    }
}

impl Rendezvous {
    pub fn new(dir: impl Into<PathBuf>, spec: ProcessSpec, fingerprint: impl Into<String>, timeout: Duration) -> Self {
        Rendezvous { dir: dir.into(), spec, fingerprint: fingerprint.into(), timeout, next: 0 }
    }

    pub fn spec(&self) -> ProcessSpec {
        self.spec
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn who(&self) -> String {
        format!("process {}", self.spec.label())
    }

    fn body(&self, what: &str) -> String {
        format!("{HEADER}\nwhat {what}\nprocesses {}\nfingerprint {}\n", self.spec.processes, self.fingerprint)
    }

    /// Process 0: refuse a used directory, then publish the plan file. Other processes: wait for
    /// the plan file and check that it is this plan. Fails in milliseconds on a mismatch.
    pub fn start(&self) -> Result<()> {
        let plan = self.dir.join("plan");
        if self.spec.process == 0 {
            std::fs::create_dir_all(&self.dir).map_err(|e| RuntimeError::Io { path: self.dir.clone(), source: e })?;
            let entries =
                std::fs::read_dir(&self.dir).map_err(|e| RuntimeError::Io { path: self.dir.clone(), source: e })?;
            let mut stale: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n == "plan" || n.starts_with("nccl-id-"))
                .collect();
            stale.sort();
            if !stale.is_empty() {
                return Err(RuntimeError::Rendezvous {
                    path: self.dir.clone(),
                    detail: format!(
                        "process 0 needs an unused rendezvous directory, but it holds {} from another launch: \
                         a waiting process could take a stale NCCL id; use a fresh directory per launch",
                        stale.join(", ")
                    ),
                });
            }
            publish(&plan, &self.body("plan"))
        } else {
            let text = wait_for(&plan, self.timeout, &self.who(), "the plan file process 0 writes when it starts")?;
            self.check(&plan, &text, "plan").map(|_| ())
        }
    }

    /// The id of the next communicator: process 0 makes it with `make` and publishes it; the
    /// others wait for it. Returns (communicator index, id bytes).
    pub fn next_id(&mut self, make: impl FnOnce() -> Result<Vec<u8>>) -> Result<(usize, Vec<u8>)> {
        let k = self.next;
        self.next += 1;
        let path = self.dir.join(id_file_name(k));
        let what = format!("nccl-id {k}");
        if self.spec.process == 0 {
            let id = make()?;
            publish(&path, &format!("{}id {}\n", self.body(&what), hex(&id)))?;
            Ok((k, id))
        } else {
            let text = wait_for(&path, self.timeout, &self.who(), &format!("the NCCL unique id of communicator {k}"))?;
            let id = self.check(&path, &text, &what)?;
            let id = id.ok_or_else(|| self.malformed(&path, "it has no `id` line"))?;
            Ok((k, unhex(&id).ok_or_else(|| self.malformed(&path, "its id is not an even number of hex digits"))?))
        }
    }

    fn malformed(&self, path: &Path, why: &str) -> RuntimeError {
        RuntimeError::Rendezvous {
            path: path.to_path_buf(),
            detail: format!("{} cannot read this rendezvous file: {why} (format: {HEADER})", self.who()),
        }
    }

    /// Check a published file against this process's plan; returns its `id` value, if any.
    fn check(&self, path: &Path, text: &str, what: &str) -> Result<Option<String>> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(self.malformed(path, "the first line is not the version line"));
        }
        let mut fields = std::collections::BTreeMap::new();
        for l in lines {
            let (k, v) =
                l.split_once(' ').ok_or_else(|| self.malformed(path, &format!("line {l:?} is not `key value`")))?;
            fields.insert(k.to_string(), v.to_string());
        }
        let get = |k: &str| fields.get(k).cloned().unwrap_or_default();
        let mismatch = |detail: String| RuntimeError::Rendezvous { path: path.to_path_buf(), detail };
        if get("what") != what {
            return Err(self.malformed(path, &format!("it is `{}`, expected `{what}`", get("what"))));
        }
        if get("processes") != self.spec.processes.to_string() {
            return Err(mismatch(format!(
                "published for {} processes, but {} runs with N = {}: every process must be started with the same --process …/N",
                get("processes"),
                self.who(),
                self.spec.processes
            )));
        }
        if get("fingerprint") != self.fingerprint {
            return Err(mismatch(format!(
                "published for plan fingerprint {}, but {} runs plan {}: every process must run the same plan \
                 (same binary, flags, doors, model, battery and process count)",
                get("fingerprint"),
                self.who(),
                self.fingerprint
            )));
        }
        Ok(fields.get("id").cloned())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rdv(dir: &Path, p: usize, n: usize, fp: &str, ms: u64) -> Rendezvous {
        Rendezvous::new(dir, ProcessSpec { process: p, processes: n }, fp, Duration::from_millis(ms))
    }

    #[test]
    fn ids_published_by_process_0_reach_the_others_in_order() {
        let d = tempfile::tempdir().unwrap();
        let mut p0 = rdv(d.path(), 0, 2, "abc", 5000);
        let mut p1 = rdv(d.path(), 1, 2, "abc", 5000);
        let waiter = std::thread::spawn(move || {
            p1.start()?;
            let a = p1.next_id(|| unreachable!("only process 0 makes ids"))?;
            let b = p1.next_id(|| unreachable!())?;
            Ok::<_, RuntimeError>((a, b))
        });
        std::thread::sleep(Duration::from_millis(50));
        p0.start().unwrap();
        assert_eq!(p0.next_id(|| Ok(vec![0, 1, 254, 255])).unwrap(), (0, vec![0, 1, 254, 255]));
        assert_eq!(p0.next_id(|| Ok(vec![7; 128])).unwrap(), (1, vec![7; 128]));
        let (a, b) = waiter.join().unwrap().unwrap();
        assert_eq!(a, (0, vec![0, 1, 254, 255]));
        assert_eq!(b, (1, vec![7; 128]));
        // Atomic publication leaves no temp file behind.
        let names: Vec<String> =
            std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
        assert!(names.contains(&"nccl-id-0001".to_string()), "{names:?}");
    }

    #[test]
    fn publication_is_atomic_a_reader_never_sees_a_partial_file() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("nccl-id-0000");
        let big = "x".repeat(1 << 20);
        let reader = {
            let path = path.clone();
            std::thread::spawn(move || wait_for(&path, Duration::from_secs(10), "test", "the file"))
        };
        publish(&path, &big).unwrap();
        assert_eq!(reader.join().unwrap().unwrap().len(), big.len());
    }

    #[test]
    fn a_missing_id_times_out_naming_the_file_the_process_and_the_wait() {
        let d = tempfile::tempdir().unwrap();
        let mut p1 = rdv(d.path(), 1, 2, "abc", 150);
        let t0 = Instant::now();
        let e = p1.next_id(|| unreachable!()).unwrap_err().to_string();
        assert!(t0.elapsed() >= Duration::from_millis(150));
        assert!(e.contains("nccl-id-0000"), "{e}");
        assert!(e.contains("process 1/2 waited 0.1 s") || e.contains("process 1/2 waited 0.2 s"), "{e}");
        assert!(e.contains("NCCL unique id of communicator 0"), "{e}");
        let e = rdv(d.path(), 1, 2, "abc", 50).start().unwrap_err().to_string();
        assert!(e.contains("plan") && e.contains("process 1/2 waited"), "{e}");
    }

    #[test]
    fn a_different_plan_or_process_count_fails_loudly_with_both_values() {
        let d = tempfile::tempdir().unwrap();
        let mut p0 = rdv(d.path(), 0, 2, "plan-a", 1000);
        p0.start().unwrap();
        p0.next_id(|| Ok(vec![1, 2])).unwrap();
        let e = rdv(d.path(), 1, 2, "plan-b", 1000).start().unwrap_err().to_string();
        assert!(e.contains("plan fingerprint plan-a") && e.contains("process 1/2 runs plan plan-b"), "{e}");
        let e = rdv(d.path(), 1, 2, "plan-b", 1000).next_id(|| unreachable!()).unwrap_err().to_string();
        assert!(e.contains("nccl-id-0000") && e.contains("plan-a") && e.contains("plan-b"), "{e}");
        let e = rdv(d.path(), 1, 4, "plan-a", 1000).start().unwrap_err().to_string();
        assert!(e.contains("published for 2 processes") && e.contains("N = 4"), "{e}");
        // The matching process reads it.
        assert_eq!(rdv(d.path(), 1, 2, "plan-a", 1000).next_id(|| unreachable!()).unwrap(), (0, vec![1, 2]));
    }

    #[test]
    fn process_0_refuses_a_directory_used_by_another_launch() {
        let d = tempfile::tempdir().unwrap();
        rdv(d.path(), 0, 2, "a", 100).start().unwrap();
        let e = rdv(d.path(), 0, 2, "a", 100).start().unwrap_err().to_string();
        assert!(e.contains("holds plan from another launch") && e.contains("fresh directory"), "{e}");
    }

    #[test]
    fn hex_round_trips_and_refuses_odd_text() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&b)), Some(b));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
