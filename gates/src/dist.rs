//! A run over several processes, at the edge (docs/multi-host.md): `--process P/N`,
//! `--nccl-id-dir DIR` and `--dist-timeout-s` (or MEMRA_PROCESS, MEMRA_NCCL_ID_DIR,
//! MEMRA_DIST_TIMEOUT_S) become a checked [`DistPlan`]; the configurations that cannot span
//! processes become NOT-APPLICABLE with their rule; and the plan gets a fingerprint that every
//! process checks through the rendezvous directory, so a process started with another plan fails
//! at once instead of hanging in NCCL.
//!
//! Every process runs the identical plan in the identical order and computes the identical
//! receipts; process 0 writes them, the others print a one-line summary and exit with the same
//! status.

use crate::args::{Provenance, RunArgs};
use crate::env::DoorRequest;
use crate::error::GateError;
use crate::job::Job;
use crate::matrix::Configuration;
use crate::registry::{BackendKind, Registry, SettingValue, DIST_TIMEOUT_S, NCCL_ID_DIR, PROCESS};
use memra_receipts::schema as rs;
use memra_runtime::backend::dist::{split_rule, ProcessSpec, Rendezvous};
use memra_runtime::Battery;
use memra_runtime::Transport;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// What the binary needs to decide how a process with a hung distributed call ends: the runtime's
/// watchdog hands the overrun ([`RuntimeError::Watchdog`]) to the hook the binary installs, and
/// [`exit_now`] ends the process without destructors (docs/multi-host.md, Failure).
pub use memra_runtime::backend::cuda::exit_now;
pub use memra_runtime::backend::dist::watchdog::{install_overrun_hook, OverrunHook};
pub use memra_runtime::RuntimeError;

/// The checked request to run as one process of several.
#[derive(Debug, Clone, PartialEq)]
pub struct DistPlan {
    pub spec: ProcessSpec,
    pub id_dir: PathBuf,
    pub timeout: Duration,
}

/// What the suite needs while it runs: this process's place and its side of the rendezvous.
pub struct DistContext {
    pub spec: ProcessSpec,
    pub rendezvous: Mutex<Rendezvous>,
}

/// Door ids whose mechanism exists only inside one process, with the reason.
const SINGLE_PROCESS_DOORS: [(&str, &str); 3] = [
    (
        "graph",
        "MEMRA_STEP_TP_GRAPH is not run across processes: a CUDA graph is captured within one process, and the distributed backend does not capture its cross-process NCCL sends and receives",
    ),
    (
        "nccl_allreduce",
        "MEMRA_NCCL_ALLREDUCE is not run across processes: NCCL's own all-reduce order depends on the topology, so its evidence would not be the single-process run's",
    ),
    (
        "canary_skip_fence",
        "the skip_fence canary plants a race between two streams of one process; across processes there is no producer fence to skip",
    ),
];

/// `--process` (or MEMRA_PROCESS) and its companions, checked before any device work. `Ok(None)`
/// is a plain single-process run (no `--process`, or `0/1`).
pub fn dist_plan(args: &RunArgs, req: &DoorRequest, registry: &Registry) -> Result<Option<DistPlan>, GateError> {
    let spec = match &args.process {
        Some(s) => Some(ProcessSpec::parse(s).map_err(|e| GateError::usage(format!("--process: {e}")))?),
        None => match req.settings.get(PROCESS) {
            Some(SettingValue::Process(p)) => Some(*p),
            _ => None,
        },
    };
    let id_dir = args.nccl_id_dir.clone().or_else(|| match req.settings.get(NCCL_ID_DIR) {
        Some(SettingValue::Path(p)) => Some(p.clone()),
        _ => None,
    });
    let seconds = match args.dist_timeout_s {
        Some(0) => {
            return Err(GateError::usage(
                "--dist-timeout-s 0: a process would give up before its peers start (use 1 or more seconds)",
            ))
        }
        Some(s) => s,
        None => match req
            .settings
            .get(DIST_TIMEOUT_S)
            .or(registry.setting(DIST_TIMEOUT_S).and_then(|s| s.default_value.as_ref()))
        {
            Some(SettingValue::Seconds(s)) => *s,
            _ => 300,
        },
    };
    let Some(spec) = spec else {
        if let Some(d) = id_dir.filter(|_| args.nccl_id_dir.is_some()) {
            return Err(GateError::usage(format!(
                "--nccl-id-dir {} is given without --process P/N: the rendezvous directory belongs to a run over several processes",
                d.display()
            )));
        }
        return Ok(None);
    };
    if spec.processes == 1 {
        return Ok(None);
    }
    let who = format!("--process {}", spec.label());
    if args.backend != "cuda" {
        return Err(GateError::usage(format!(
            "{who} needs --backend cuda (not `{}`): ranks in several processes meet only through NCCL on CUDA devices, and every process must open the same backend",
            args.backend
        )));
    }
    let Some(id_dir) = id_dir else {
        return Err(GateError::usage(format!(
            "{who} needs --nccl-id-dir DIR (or MEMRA_NCCL_ID_DIR): a directory every process can read, where process 0 publishes the NCCL unique ids"
        )));
    };
    if args.resume {
        return Err(GateError::usage(format!(
            "{who} cannot --resume: every process must run the identical plan, and only process 0 sees the receipts already written"
        )));
    }
    Ok(Some(DistPlan { spec, id_dir, timeout: Duration::from_secs(seconds) }))
}

/// Why configuration `c` cannot run over `processes` processes, or `None` when it can.
pub fn rule(c: &Configuration, processes: usize) -> Option<String> {
    if processes <= 1 {
        return None;
    }
    if c.backend != BackendKind::Cuda {
        return Some(format!(
            "a run over {processes} processes needs the cuda backend: host ranks are threads of one process"
        ));
    }
    if c.transport != Transport::Nccl {
        return Some(format!(
            "only the nccl transport crosses processes ({} moves bytes inside one process); run it without --process",
            c.transport.name()
        ));
    }
    if let Some(r) = split_rule(c.tp, processes) {
        return Some(r);
    }
    SINGLE_PROCESS_DOORS.iter().find(|(id, _)| c.doors.contains(*id)).map(|(_, why)| why.to_string())
}

/// The fingerprint of everything that decides the program every process runs: the build, the
/// process count, the subject, and every job in order with its run identity and whether it runs.
pub fn fingerprint(
    prov: &Provenance,
    processes: usize,
    matrix: &str,
    (model, battery): (&rs::ModelEvidence, &Battery),
    jobs: &[Job],
) -> String {
    let mut text = format!(
        "memra-gates {} {} {}\nprocesses {processes}\nmatrix {matrix}\nmodel {} {}\n",
        env!("CARGO_PKG_VERSION"),
        prov.git_rev,
        prov.kernel_digest,
        model.preset,
        model.digest
    );
    for j in jobs {
        let id = memra_receipts::run_id(&crate::receipt::config_evidence(j, model, battery));
        let not_run = j.not_run.as_ref().map(|(v, r)| format!("{} {r}", v.as_str())).unwrap_or_default();
        text += &format!("{id} {not_run}\n");
    }
    format!("{:016x}", memra_receipts::fnv1a64(text.as_bytes()))
}

/// Join the rendezvous: process 0 publishes the plan, the others check it. Fails in
/// milliseconds when another process runs another plan.
pub fn join(plan: &DistPlan, fingerprint: &str) -> Result<DistContext, GateError> {
    let r = Rendezvous::new(&plan.id_dir, plan.spec, fingerprint, plan.timeout);
    r.start()?;
    Ok(DistContext { spec: plan.spec, rendezvous: Mutex::new(r) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::run_args as args;

    fn plan(flags: &[&str], env: &[(&str, &str)]) -> Result<Option<DistPlan>, String> {
        let reg = Registry::builtin().unwrap();
        let req = crate::env::parse_env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())), &reg).unwrap();
        dist_plan(&args(flags), &req, &reg).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_and_environment_give_the_same_plan() {
        let want = DistPlan {
            spec: ProcessSpec { process: 1, processes: 2 },
            id_dir: "/tmp/ids".into(),
            timeout: Duration::from_secs(300),
        };
        let f = plan(&["--process", "1/2", "--nccl-id-dir", "/tmp/ids", "--backend", "cuda"], &[]).unwrap();
        assert_eq!(f, Some(want.clone()));
        let e = plan(&["--backend", "cuda"], &[("MEMRA_PROCESS", "1/2"), ("MEMRA_NCCL_ID_DIR", "/tmp/ids")]).unwrap();
        assert_eq!(e, Some(want));
        let t = plan(&["--process", "0/2", "--nccl-id-dir", "d", "--backend", "cuda", "--dist-timeout-s", "7"], &[])
            .unwrap();
        assert_eq!(t.unwrap().timeout, Duration::from_secs(7));
        let t =
            plan(&["--process", "0/2", "--nccl-id-dir", "d", "--backend", "cuda"], &[("MEMRA_DIST_TIMEOUT_S", "9")])
                .unwrap();
        assert_eq!(t.unwrap().timeout, Duration::from_secs(9));
        assert_eq!(plan(&[], &[]).unwrap(), None);
        assert_eq!(plan(&["--process", "0/1"], &[]).unwrap(), None, "0/1 is one process holding every rank");
    }

    #[test]
    fn broken_requests_name_the_value_and_the_rule() {
        let e = plan(&["--process", "2/2", "--nccl-id-dir", "d", "--backend", "cuda"], &[]).unwrap_err();
        assert!(e.contains("\"2/2\"") && e.contains("P = 2 is not below N = 2"), "{e}");
        let e = plan(&["--process", "0/2", "--nccl-id-dir", "d"], &[]).unwrap_err();
        assert!(e.contains("--process 0/2 needs --backend cuda (not `auto`)"), "{e}");
        let e = plan(&["--process", "0/2", "--backend", "cuda"], &[]).unwrap_err();
        assert!(e.contains("needs --nccl-id-dir DIR"), "{e}");
        let e = plan(&["--process", "0/2", "--nccl-id-dir", "d", "--backend", "cuda", "--resume"], &[]).unwrap_err();
        assert!(e.contains("cannot --resume"), "{e}");
        let e = plan(&["--process", "0/2", "--nccl-id-dir", "d", "--backend", "cuda", "--dist-timeout-s", "0"], &[])
            .unwrap_err();
        assert!(e.contains("--dist-timeout-s 0"), "{e}");
        let e = plan(&["--nccl-id-dir", "d"], &[]).unwrap_err();
        assert!(e.contains("without --process"), "{e}");
        let reg = Registry::builtin().unwrap();
        let e =
            crate::env::parse_env([("MEMRA_PROCESS".to_string(), "3/2".to_string())], &reg).unwrap_err().to_string();
        assert!(e.contains("MEMRA_PROCESS") && e.contains("P = 3 is not below N = 2"), "{e}");
        let e = crate::env::parse_env([("MEMRA_DIST_TIMEOUT_S".to_string(), "1.5".to_string())], &reg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("whole number of seconds"), "{e}");
    }

    #[test]
    fn configurations_that_cannot_span_processes_are_not_applicable_with_the_rule() {
        let c = |backend, tp, transport, doors: &[&str]| {
            Configuration::single(backend, tp, transport, doors.iter().map(|d| d.to_string()).collect())
        };
        use BackendKind::{Cuda, Host};
        assert_eq!(rule(&c(Cuda, 2, Transport::Nccl, &[]), 2), None);
        assert_eq!(rule(&c(Cuda, 8, Transport::Nccl, &["rank0_merge"]), 4), None);
        assert_eq!(rule(&c(Cuda, 1, Transport::HostBounce, &[]), 1), None, "one process: no rule");
        let r = rule(&c(Cuda, 2, Transport::HostBounce, &[]), 2).unwrap();
        assert!(r.contains("only the nccl transport crosses processes (host-bounce"), "{r}");
        let r = rule(&c(Cuda, 4, Transport::NativeP2p, &[]), 2).unwrap();
        assert!(r.contains("native-p2p"), "{r}");
        let r = rule(&c(Cuda, 1, Transport::Nccl, &[]), 2).unwrap();
        assert!(r.contains("TP1 cannot be split over 2 processes"), "{r}");
        let r = rule(&c(Cuda, 2, Transport::Nccl, &[]), 4).unwrap();
        assert!(r.contains("TP must be a multiple of the process count"), "{r}");
        let r = rule(&c(Host, 2, Transport::Nccl, &[]), 2).unwrap();
        assert!(r.contains("needs the cuda backend"), "{r}");
        let r = rule(&c(Cuda, 2, Transport::Nccl, &["nccl_allreduce"]), 2).unwrap();
        assert!(r.contains("MEMRA_NCCL_ALLREDUCE"), "{r}");
        let r = rule(&c(Cuda, 2, Transport::Nccl, &["canary_skip_fence"]), 2).unwrap();
        assert!(r.contains("skip_fence"), "{r}");
    }
}
