//! The command line, in two layers (STYLE.md): clap structs here only parse; `plan` turns them
//! into a checked plan before any device work starts, so a bad request fails in milliseconds.
//!
//! Exit status: 0 every gate passed, 1 a gate failed (FAIL, VOID or ERROR), 2 the harness could
//! not run (bad input, nothing tested).

use crate::error::GateError;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Build provenance stamped into the binary by build.rs.
#[derive(Debug, Clone, Copy)]
pub struct Provenance {
    pub git_rev: &'static str,
    pub kernel_digest: &'static str,
    pub rustc: &'static str,
}

#[derive(Parser, Debug)]
#[command(
    name = "memra-gates",
    about = "Proves or refutes the exactness claims of inference-engine doors",
    args_conflicts_with_subcommands = true,
    disable_version_flag = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// `memra-gates --matrix all` is `memra-gates run --matrix all`.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run configurations through the gates and write receipts (the default command).
    Run(RunArgs),
    /// Generate a deterministic model file.
    GenModel(GenModelArgs),
    /// Print the door registry.
    Doors(DoorsArgs),
    /// List the configurations of a matrix (and, with --explain, every excluded one and why).
    Matrix(MatrixArgs),
    /// Run every canary and require its gate to fail at the right place.
    Selftest(SelftestArgs),
    /// Compare two receipt sets (files or directories).
    Diff(DiffArgs),
    /// Time the canonical program on a device against the memory floor and PyTorch.
    Bench(BenchArgs),
    /// Latency plots (SVG and PNG) from receipt directories or files.
    Plot(PlotArgs),
    /// Which doors have earned default-on over the nightly history.
    Promote(PromoteArgs),
    /// Devices, byte-integrity probe and copy cost of every transport.
    Probe(ProbeArgs),
    /// Print build provenance.
    Version,
}

/// Where the model comes from.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A safetensors model file (see runtime/src/model/format.rs for the tensor names).
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Preset generated in memory when no --model is given: tiny, small, step.
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Seed of the generated weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Override the preset's layer count (required for `step`).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the KV-cache capacity (positions each rank allocates per layer), e.g. to plant
    /// an out-of-memory.
    #[arg(long)]
    pub kv_positions: Option<usize>,
    /// Fault injection: GiB held on every CUDA device before each run (a crowded device), to
    /// check that an out-of-memory becomes an ERROR receipt and the matrix goes on.
    #[arg(long, default_value_t = 0.0)]
    pub cuda_reserve_gib: f64,
}

/// Options shared by `run` and `selftest`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// all | single | pairwise | FILE (.toml/.json door sets). Without it: the doors requested by
    /// the environment and --door, at every TP size and transport.
    #[arg(long, value_name = "M")]
    pub matrix: Option<String>,
    /// TP sizes, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub tp: Vec<usize>,
    /// Transports, comma separated: host-bounce, native-p2p, nccl.
    #[arg(long, value_delimiter = ',', default_value = "host-bounce,native-p2p")]
    pub transport: Vec<String>,
    /// auto (CUDA when a driver and device are present), host, or cuda.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// A door by env name or id, `NAME`, `NAME=1` or `NAME=0` (repeatable; overrides MEMRA_*).
    #[arg(long = "door", value_name = "NAME[=0|1]")]
    pub doors: Vec<String>,
    /// Directory for receipts, summary.json, junit.xml, latency.csv, summary.md.
    #[arg(long, default_value = "memra-receipts")]
    pub out: PathBuf,
    /// Keep complete receipts already in --out and run only the missing configurations.
    #[arg(long)]
    pub resume: bool,
    /// Run only shard I of N (0-based), e.g. 0/4.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Use only the first N prompts of the battery.
    #[arg(long)]
    pub prompts: Option<usize>,
    /// Tokens generated per prompt.
    #[arg(long)]
    pub gen_tokens: Option<usize>,
    /// Seed of the default battery.
    #[arg(long, default_value_t = 1)]
    pub battery_seed: u64,
    /// Parallel host jobs (default: available cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// A door registry file instead of the built-in gates/doors.toml.
    #[arg(long, value_name = "FILE")]
    pub registry: Option<PathBuf>,
    /// Never print the progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Run as process P of N processes that share one plan, TP ranks split in contiguous blocks
    /// of TP/N (docs/multi-host.md). Needs --backend cuda and --nccl-id-dir; only nccl runs with
    /// TP a multiple of N span the processes, every other configuration is NOT-APPLICABLE.
    #[arg(long, value_name = "P/N")]
    pub process: Option<String>,
    /// Rendezvous directory shared by the processes (process 0 publishes the plan fingerprint and
    /// the NCCL unique ids there); one fresh directory per launch.
    #[arg(long, value_name = "DIR")]
    pub nccl_id_dir: Option<PathBuf>,
    /// Seconds a process waits for a rendezvous file, and the longest a distributed call may
    /// take before the process ends itself (status 2) naming the call [default: 300].
    #[arg(long, value_name = "SECONDS")]
    pub dist_timeout_s: Option<u64>,
}

#[derive(Args, Debug)]
pub struct GenModelArgs {
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub layers: Option<usize>,
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct DoorsArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_name = "FILE")]
    pub registry: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct MatrixArgs {
    #[arg(long, default_value = "single")]
    pub matrix: String,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub tp: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "host-bounce,native-p2p,nccl")]
    pub transport: Vec<String>,
    /// host, cuda, or both (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "host,cuda")]
    pub backend: Vec<String>,
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Also list every excluded configuration with the rule that excluded it.
    #[arg(long)]
    pub explain: bool,
    #[arg(long, value_name = "FILE")]
    pub registry: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct SelftestArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value = "auto")]
    pub backend: String,
    #[arg(long, default_value = "memra-selftest")]
    pub out: PathBuf,
    /// Use only the first N prompts of the battery (default 2: canaries fire early).
    #[arg(long, default_value_t = 2)]
    pub prompts: usize,
    /// FOR TESTING SELFTEST ITSELF: run this canary with its defect removed (selftest must fail).
    #[arg(long, value_name = "CANARY_ID")]
    pub disarm: Option<String>,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    pub old: PathBuf,
    pub new: PathBuf,
    /// md | text | json
    #[arg(long, default_value = "md")]
    pub format: String,
    /// Relative latency change reported beyond the old run's [min, max] band.
    #[arg(long, default_value_t = memra_receipts::DEFAULT_THRESHOLD)]
    pub threshold: f64,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Timed decode steps (after warm-up); each gives one sample per layer × seam.
    #[arg(long, default_value_t = 24)]
    pub steps: usize,
    #[arg(long, default_value_t = 4)]
    pub warmup: usize,
    /// Bytes of the device-to-device copy that measures the bandwidth.
    #[arg(long, default_value_t = 1 << 30)]
    pub copy_bytes: usize,
    /// Python with PyTorch for the side-by-side layer.
    #[arg(long, default_value = "python3")]
    pub python: String,
    #[arg(long, default_value = "scripts/bench/torch_layer.py")]
    pub torch_script: PathBuf,
    /// Skip the PyTorch anchor.
    #[arg(long)]
    pub no_torch: bool,
    /// Time the host backend when no device is present (no memory floor).
    #[arg(long)]
    pub allow_host: bool,
    /// Run with MEMRA_STEP_TP_GRAPH: the whole decode step is captured once and replayed
    /// (the warm-up must cover the record and capture passes: at least 2 steps).
    #[arg(long)]
    pub graph: bool,
    /// Write the performance receipt here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Receipt files or directories (with --history: one directory per night).
    #[arg(required = true)]
    pub receipts: Vec<PathBuf>,
    #[arg(long, default_value = "memra-plots")]
    pub out: PathBuf,
    /// One line per seam across the receipt sets, ordered by their date.
    #[arg(long)]
    pub history: bool,
}

#[derive(Args, Debug)]
pub struct PromoteArgs {
    /// Nightly receipt directories (one per night).
    #[arg(long = "history", required = true, num_args = 1..)]
    pub history: Vec<PathBuf>,
    /// Nights every door must have passed.
    #[arg(long, default_value_t = 7)]
    pub nights: usize,
    /// full (every legal combination containing the door, DESIGN §7) or ran (every receipt that
    /// contains the door passed).
    #[arg(long, default_value = "full")]
    pub coverage: String,
    /// Write the updated defaults block here.
    #[arg(long, default_value = "doors-defaults.toml")]
    pub out: PathBuf,
    #[arg(long, value_name = "FILE")]
    pub registry: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ProbeArgs {
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Ranks to place (one per device when there are enough, else co-resident).
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    #[arg(long, value_delimiter = ',', default_value = "host-bounce,native-p2p,nccl")]
    pub transport: Vec<String>,
    /// Copies per timed batch.
    #[arg(long, default_value_t = 50)]
    pub reps: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Entry point: parse, run, print the error chain once, map to an exit status.
pub fn main(prov: Provenance) -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        None => crate::commands::run(&cli.run, prov),
        Some(Command::Run(a)) => crate::commands::run(&a, prov),
        Some(Command::GenModel(a)) => crate::commands::gen_model(&a),
        Some(Command::Doors(a)) => crate::commands::doors(&a),
        Some(Command::Matrix(a)) => crate::commands::matrix(&a),
        Some(Command::Selftest(a)) => crate::selftest::selftest(&a, prov),
        Some(Command::Diff(a)) => crate::commands::diff(&a),
        Some(Command::Bench(a)) => crate::bench::bench(&a, prov),
        Some(Command::Plot(a)) => crate::commands::plot(&a),
        Some(Command::Promote(a)) => crate::commands::promote(&a),
        Some(Command::Probe(a)) => crate::probe_cmd::probe(&a),
        Some(Command::Version) => {
            crate::say!("memra-gates {}", env!("CARGO_PKG_VERSION"));
            crate::say!("git revision: {}", prov.git_rev);
            crate::say!("kernel sources: {}", prov.kernel_digest);
            crate::say!("compiler: {}", prov.rustc);
            Ok(0)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("memra-gates: error: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            ExitCode::from(2)
        }
    }
}

/// Shorthand for errors at the edge.
pub fn input(msg: impl Into<String>) -> GateError {
    GateError::Input(msg.into())
}
