//! Why a CUDA test did not run, and what that means for the run: the custom harness of the GPU
//! test binary (libtest-mimic underneath, so the output, the arguments and the filters are
//! libtest's).
//!
//! libtest's own harness can only pass or fail at run time, so a test that found no device used to
//! print `skipped` and pass: `cargo test` showed `ok` for work that never happened. Here a test
//! body returns [`Ran`]: `Ok(())` when it ran to the end, `Err(Skip)` with the reason when it
//! could not. [`Policy::judge`] turns a skip into the test's outcome:
//!
//! | skip                          | default | `MEMRA_REQUIRE_GPU=1` | `MEMRA_REQUIRE_DEVICES=N ≥ need` |
//! |-------------------------------|---------|-----------------------|----------------------------------|
//! | [`Skip::Missing`]: driver, device, NVRTC, NCCL, peer access | ignored | **failed** | **failed** |
//! | [`Skip::Devices`]: fewer than the test declares | ignored | ignored   | **failed**                       |
//! | [`Skip::NotRequested`]: opt-in measurement | ignored | ignored        | ignored                          |
//!
//! ("ignored" always with the reason: `ignored (needs 4 devices, 2 present)`.)
//!
//! So with `MEMRA_REQUIRE_GPU=1` no test passes without running its body. A test that needs N
//! devices says so when it is registered ([`GpuTest::needs_devices`]); the harness compares that
//! with the machine before the body starts, and on a machine with fewer devices the test reads
//! `ignored (needs N devices, M present)` even under `MEMRA_REQUIRE_GPU=1` — a one-GPU machine
//! cannot run it, and says so instead of passing. A machine that is supposed to have N devices
//! sets `MEMRA_REQUIRE_DEVICES=N` (a device count; it also implies `MEMRA_REQUIRE_GPU=1`), and then
//! such a test fails instead: a node that lost a GPU is caught. A device-count check inside a body
//! would escape that rule, so bodies never decide device counts themselves: the per-count cases
//! are registered one by one (`…::on_4_devices`).
//!
//! Both variables are declared in `gates/doors.toml` (every `MEMRA_*` name is), and are read
//! here, by the test binary, not by `memra-gates`.

use libtest_mimic::{Completion, Failed, Trial};
use memra_runtime::backend::cuda::{self, CudaBackend, CudaOptions, CudaUnavailable};
use memra_runtime::RuntimeError;
use std::fmt::Display;
use std::sync::OnceLock;

/// What a test body returns: it ran to the end, or why it could not.
pub type Ran = Result<(), Skip>;

/// Why a test (or a part of it) did not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Something a GPU machine has is missing here: the driver, a device, NVRTC, NCCL, or peer
    /// access between two devices. The text says which, with the library's or driver's words.
    Missing(String),
    /// The test was registered as needing `need` devices; the machine has `present` (≥ 1).
    Devices { need: usize, present: usize },
    /// An opt-in measurement that was not asked for; the text says how to ask.
    NotRequested(String),
}

/// The two environment variables that decide what a skip means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// `MEMRA_REQUIRE_GPU=1`.
    pub require_gpu: bool,
    /// `MEMRA_REQUIRE_DEVICES=N` (0 when unset or empty).
    pub require_devices: usize,
}

/// A skip, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ignored(String),
    Failed(String),
}

pub const REQUIRE_GPU: &str = "MEMRA_REQUIRE_GPU";
pub const REQUIRE_DEVICES: &str = "MEMRA_REQUIRE_DEVICES";

impl Policy {
    /// Parse the two variables' values (`None`: unset). Their rules are those of their
    /// `[[setting]]` entries in gates/doors.toml (formats `bool01` and `count`).
    pub fn parse(require_gpu: Option<&str>, require_devices: Option<&str>) -> Result<Policy, String> {
        let require_gpu = match require_gpu.unwrap_or("") {
            "" | "0" => false,
            "1" => true,
            v => return Err(format!("{REQUIRE_GPU}={v:?} is not a valid value: use 1 (on), 0 or empty (off)")),
        };
        let require_devices = match require_devices.unwrap_or("") {
            "" => 0,
            v if v.bytes().all(|b| b.is_ascii_digit()) => v.parse::<usize>().map_err(|_| {
                format!("{REQUIRE_DEVICES}={v:?} is not a valid value: use a whole number of devices, or empty")
            })?,
            v => {
                return Err(format!(
                    "{REQUIRE_DEVICES}={v:?} is not a valid value: use a whole number of devices, or empty"
                ))
            }
        };
        Ok(Policy { require_gpu, require_devices })
    }

    /// This process's policy (read once).
    pub fn from_env() -> Result<Policy, String> {
        static POLICY: OnceLock<Result<Policy, String>> = OnceLock::new();
        POLICY
            .get_or_init(|| {
                let var = |name: &str| std::env::var(name).ok();
                Policy::parse(var(REQUIRE_GPU).as_deref(), var(REQUIRE_DEVICES).as_deref())
            })
            .clone()
    }

    /// Whether a missing GPU, library or peer access is a failure.
    pub fn gpu_required(&self) -> bool {
        self.require_gpu || self.require_devices > 0
    }

    /// What a skip means under this policy (the table in the module documentation).
    pub fn judge(&self, skip: &Skip) -> Verdict {
        match skip {
            Skip::Missing(why) if self.gpu_required() => Verdict::Failed(format!("{} but {why}", self.describe())),
            Skip::Missing(why) => Verdict::Ignored(why.clone()),
            Skip::Devices { need, present } if self.require_devices >= *need => Verdict::Failed(format!(
                "{REQUIRE_DEVICES}={} but this test needs {need} devices and {present} are present",
                self.require_devices
            )),
            Skip::Devices { need, present } => Verdict::Ignored(format!("needs {need} devices, {present} present")),
            Skip::NotRequested(how) => Verdict::Ignored(how.clone()),
        }
    }

    fn describe(&self) -> String {
        match (self.require_gpu, self.require_devices) {
            (true, 0) => format!("{REQUIRE_GPU}=1"),
            (false, n) => format!("{REQUIRE_DEVICES}={n}"),
            (true, n) => format!("{REQUIRE_GPU}=1 and {REQUIRE_DEVICES}={n}"),
        }
    }
}

/// Whether `MEMRA_REQUIRE_GPU=1` (or `MEMRA_REQUIRE_DEVICES`) is in force, for the few bodies that
/// run without a device and must still fail when there is none (`probing_never_panics`).
pub fn gpu_required() -> bool {
    Policy::from_env().map(|p| p.gpu_required()).unwrap_or(true)
}

/// The check the harness makes before a body that needs `need` devices starts, given what the
/// machine offers (`Err`: the CUDA backend cannot run here at all, and why).
pub fn precheck(need: usize, machine: &Result<usize, CudaUnavailable>) -> Ran {
    if need == 0 {
        return Ok(());
    }
    match machine {
        Err(e) => Err(missing(e)),
        Ok(0) => Err(missing(&CudaUnavailable::NoDevice)),
        Ok(present) if *present < need => Err(Skip::Devices { need, present: *present }),
        Ok(_) => Ok(()),
    }
}

fn missing(e: &CudaUnavailable) -> Skip {
    match e {
        CudaUnavailable::NoNvrtcLibrary => Skip::Missing(format!("no NVRTC library: {e}")),
        CudaUnavailable::NoDevice => Skip::Missing("no CUDA device: the driver reports 0 devices".into()),
        _ => Skip::Missing(format!("no CUDA device: {e}")),
    }
}

/// The machine as the CUDA backend sees it: the device count, or why the backend cannot run.
fn machine() -> Result<usize, CudaUnavailable> {
    cuda::cuda_backend_available().map(|s| s.devices.len())
}

/// A CUDA backend over `tp` ranks, or the reason it cannot be made here.
pub fn cuda_backend(tp: usize, opts: CudaOptions) -> Result<CudaBackend, Skip> {
    match CudaBackend::with_options(tp, opts) {
        Ok(b) => Ok(b),
        Err(RuntimeError::Unavailable(reason)) => {
            Err(Skip::Missing(format!("the CUDA backend is unavailable (TP{tp}, {:?}): {reason}", opts.placement)))
        }
        Err(e) => panic!("creating the CUDA backend (TP{tp}, {opts:?}) failed: {e}"),
    }
}

/// Parts of one test that could not run (a device pair without peer access): the body notes them,
/// runs the rest, and reports them as its skip at the end — a partly run test is not a pass.
#[derive(Debug, Default)]
pub struct NotRun {
    parts: Vec<String>,
    ran: usize,
}

impl NotRun {
    pub fn new() -> NotRun {
        NotRun::default()
    }

    /// A part that ran to the end.
    pub fn ran(&mut self) {
        self.ran += 1;
    }

    /// A part that could not run, and why.
    pub fn note(&mut self, what: impl Display, why: impl Display) {
        self.parts.push(format!("{what}: {why}"));
    }

    /// `Ok` when every part ran; else a [`Skip::Missing`] naming what did not (and how much did).
    pub fn finish(self) -> Ran {
        if self.parts.is_empty() {
            return Ok(());
        }
        Err(Skip::Missing(format!(
            "{} part(s) not run ({} ran and passed): {}",
            self.parts.len(),
            self.ran,
            self.parts.join("; ")
        )))
    }
}

/// One registered GPU test: its name, the devices it needs, and its body.
pub struct GpuTest {
    name: String,
    needs_devices: usize,
    body: Box<dyn FnOnce() -> Ran + Send>,
}

impl GpuTest {
    /// A test that needs one CUDA device (driver, device and NVRTC).
    pub fn new(name: impl Into<String>, body: impl FnOnce() -> Ran + Send + 'static) -> GpuTest {
        GpuTest { name: name.into(), needs_devices: 1, body: Box::new(body) }
    }

    /// A test that needs `n` devices (one rank per device); on a machine with fewer it is not
    /// started, and reads `ignored (needs n devices, m present)` unless `MEMRA_REQUIRE_DEVICES`
    /// asks for n. `0`: the body runs everywhere and decides itself (host-only checks, NVRTC).
    pub fn needs_devices(mut self, n: usize) -> GpuTest {
        self.needs_devices = n;
        self
    }

    /// One test per device count: `name::on_N_devices`, needing N devices, running `body(N)`.
    pub fn per_device_count(name: &str, counts: &[usize], body: fn(usize) -> Ran) -> Vec<GpuTest> {
        counts
            .iter()
            .map(|&n| GpuTest::new(format!("{name}::on_{n}_devices"), move || body(n)).needs_devices(n))
            .collect()
    }

    /// Prefix the name with its module (`cuda_kernels::…`), as libtest names the tests of a module.
    pub fn in_module(mut self, module: &str) -> GpuTest {
        self.name = format!("{module}::{}", self.name);
        self
    }

    /// The libtest-mimic trial: precheck, body, and the policy's verdict on a skip. A panic in the
    /// body is a failure (libtest-mimic catches it).
    pub fn into_trial(self, policy: Policy) -> Trial {
        let GpuTest { name, needs_devices, body } = self;
        Trial::ignorable_test(name, move || {
            let ran = precheck(needs_devices, &machine()).and_then(|()| body());
            match ran {
                Ok(()) => Ok(Completion::Completed),
                Err(skip) => match policy.judge(&skip) {
                    Verdict::Ignored(why) => Ok(Completion::ignored_with(why)),
                    Verdict::Failed(why) => Err(Failed::from(why)),
                },
            }
        })
    }
}
