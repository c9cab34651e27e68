//! The command line's argument types, and nothing else: clap structs that only parse (ripgrep's
//! `flags` module). Every check of what the values mean — and every conflict between them —
//! happens in `crate::plan` (and the commands' own planning) before any work starts. This module
//! imports nothing of the crate, so the arguments have one direction of imports: everything may
//! read them, they read nothing.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;

/// Build provenance stamped into the binary by build.rs.
#[derive(Debug, Clone, Copy)]
pub struct Provenance {
    pub git_rev: &'static str,
    pub kernel_digest: &'static str,
    pub rustc: &'static str,
}

impl Provenance {
    /// `memra-gates 0.1.0 (git …, kernels …, rustc …)`.
    pub fn long_version(&self) -> String {
        format!(
            "{}
git revision: {}
kernel sources: {}
compiler: {}",
            env!("CARGO_PKG_VERSION"),
            self.git_rev,
            self.kernel_digest,
            self.rustc
        )
    }
}

/// Parse the process's arguments; `--version` prints `prov`. A clap error (or `--help`) comes
/// back as the error for the binary to print and map to its exit status.
pub fn parse(prov: Provenance) -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os(), prov)
}

/// [`parse`] over given arguments (tests).
pub fn parse_from<I, T>(args: I, prov: Provenance) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    // clap keeps version texts as `&'static str`; this one is made once per process.
    let long: &'static str = Box::leak(prov.long_version().into_boxed_str());
    let cmd = Cli::command().version(env!("CARGO_PKG_VERSION")).long_version(long);
    let matches = cmd.try_get_matches_from(args)?;
    Cli::from_arg_matches(&matches)
}

/// `run`'s arguments from `flags` alone (unit tests of what a command does with them).
#[cfg(test)]
pub fn run_args(flags: &[&str]) -> RunArgs {
    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        run: RunArgs,
    }
    T::parse_from(std::iter::once("t").chain(flags.iter().copied())).run
}

/// The whole command line.
#[derive(Parser, Debug)]
#[command(
    name = "memra-gates",
    about = "Proves or refutes the exactness claims of inference-engine doors",
    args_conflicts_with_subcommands = true,
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `memra-gates --matrix all` is `memra-gates run --matrix all`.
    #[command(flatten)]
    pub run: RunArgs,
}

impl Cli {
    /// The command to run: `run` when none is named.
    pub fn into_command(self) -> Command {
        self.command.unwrap_or(Command::Run(self.run))
    }
}

/// The subcommands.
// One value per process, parsed once: boxing `RunArgs` to even out the variants buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// Each door's latency against its parent configurations in one receipt set, and the cost
    /// of exactness (writes DIR/door-effects.json, prints Markdown).
    Effects(EffectsArgs),
    /// Devices, byte-integrity probe and copy cost of every transport.
    Probe(ProbeArgs),
    /// The built-in runtime as a protocol subject (docs/subject-protocol.md): run the one
    /// configuration the MEMRA_SUBJECT_* environment names and write its tape. `run --subject
    /// scripts/subjects/builtin.toml` starts it; a person has no reason to.
    Subject(SubjectArgs),
    /// Print build provenance (same as --version).
    Version,
}

/// Where the model comes from: a file, or a preset generated in memory.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A safetensors model file (see runtime/src/model/format/mod.rs for the tensor names).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["preset", "seed", "layers"])]
    pub model: Option<PathBuf>,
    /// Preset generated in memory when no --model is given: tiny, small, step, edge [default:
    /// `run`: tiny and edge; `selftest`: edge; otherwise tiny].
    #[arg(long, value_name = "PRESET")]
    pub preset: Option<String>,
    /// Seed of the generated weights [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
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
    /// Sessions per pass (rows: batched decode, docs/DESIGN.md §3.6), comma separated from 1, 2,
    /// 4, 8; every configuration runs at each. Without --batch and --columns: single-token, plus
    /// b4 and t4 at TP1/TP2 with the base door set (`--matrix all`: b2/b4/b8/t2/t4/t8 at every
    /// TP); `matrix --explain` says which.
    #[arg(long, value_delimiter = ',', value_name = "B,…")]
    pub batch: Option<Vec<usize>>,
    /// Consecutive tokens of one session per pass (columns: verify and prefill), comma separated
    /// from 1, 2, 4, 8; a pass is rows or columns, so pairs with both above 1 are excluded.
    #[arg(long, value_delimiter = ',', value_name = "T,…")]
    pub columns: Option<Vec<usize>>,
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
    /// Split the plan over N child processes of this binary (worker i runs part i/N into
    /// --out/.workers/i: whole lanes where they fit, a larger lane cut along its doors, so that a
    /// part runs few census baselines another part provides; their receipts are moved into --out
    /// and the outputs written as one run).
    /// On CUDA it needs the CUDA multi-process service (MPS) running: a night is host-bound, and
    /// processes only share one GPU well when MPS merges their work (docs/gpu/README.md).
    #[arg(long, value_name = "N")]
    pub worker_processes: Option<usize>,
    /// Set by `--worker-processes` for its workers: this process runs part I of N of the plan
    /// (after --shard).
    #[arg(long, value_name = "I/N", hide = true)]
    pub worker_shard: Option<String>,
    /// How host runs place their ranks: `threads` (a thread per rank), `inline` (every rank's
    /// work on the job's own thread, in issue order: the same values), or `auto`: inline while
    /// several jobs fill the cores or the run has one rank, threads otherwise.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub host_ranks: String,
    /// A door registry file instead of the built-in gates/doors.toml.
    #[arg(long, value_name = "FILE", conflicts_with = "subject")]
    pub registry: Option<PathBuf>,
    /// Gate an external engine instead of the built-in runtime: the subject manifest (TOML,
    /// docs/subject-protocol.md) says how to start it, what it supports and its doors; the
    /// oracle stays the built-in canonical program.
    #[arg(long, value_name = "MANIFEST")]
    pub subject: Option<PathBuf>,
    /// The outside witness of a CUDA subject's census (with --subject; docs/subject-protocol.md):
    /// `auto` arms the CUPTI injection library built beside this binary when it and CUPTI are
    /// found (else the census stays `self-reported`), `require` refuses to run without it, `off`
    /// never arms it.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = ["auto", "require", "off"], requires = "subject")]
    pub witness: String,
    /// Never print progress (on a terminal: a line per finished configuration; elsewhere, e.g. a
    /// CI log: a plain line every --progress-every seconds).
    #[arg(long)]
    pub quiet: bool,
    /// Seconds between progress lines when stderr is not a terminal.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub progress_every: u64,
    /// Reuse an --out directory that holds another plan's receipts: remove them first (without
    /// it such a directory is refused, so a summary always describes every receipt beside it).
    #[arg(long, conflicts_with = "resume")]
    pub replace: bool,
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

/// `subject`: everything comes from the MEMRA_SUBJECT_* environment and the files it names.
#[derive(Args, Debug)]
pub struct SubjectArgs {}

/// `gen-model`.
#[derive(Args, Debug)]
pub struct GenModelArgs {
    /// Preset to generate: tiny, small, step.
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Seed of the generated weights (the model is a pure function of preset, layers and seed).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Override the preset's layer count (required for `step`).
    #[arg(long)]
    pub layers: Option<usize>,
    /// The safetensors file to write (written atomically; an existing file is replaced).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// `doors`.
#[derive(Args, Debug)]
pub struct DoorsArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// A door registry file instead of the built-in gates/doors.toml.
    #[arg(long, value_name = "FILE")]
    pub registry: Option<PathBuf>,
}

/// `matrix`: what `run` with the same flags would run (same defaults as `run`).
#[derive(Args, Debug)]
pub struct MatrixArgs {
    /// all | single | pairwise | canaries | FILE (.toml/.json door sets).
    #[arg(long, value_name = "M", default_value = "single")]
    pub matrix: String,
    /// TP sizes, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub tp: Vec<usize>,
    /// Transports, comma separated: host-bounce, native-p2p, nccl.
    #[arg(long, value_delimiter = ',', default_value = "host-bounce,native-p2p")]
    pub transport: Vec<String>,
    /// Sessions per pass (rows: batched decode, docs/DESIGN.md §3.6), comma separated from 1, 2,
    /// 4, 8; every configuration runs at each. Without --batch and --columns: single-token, plus
    /// b4 and t4 at TP1/TP2 with the base door set (`--matrix all`: b2/b4/b8/t2/t4/t8 at every
    /// TP); `matrix --explain` says which.
    #[arg(long, value_delimiter = ',', value_name = "B,…")]
    pub batch: Option<Vec<usize>>,
    /// Consecutive tokens of one session per pass (columns: verify and prefill), comma separated
    /// from 1, 2, 4, 8; a pass is rows or columns, so pairs with both above 1 are excluded.
    #[arg(long, value_delimiter = ',', value_name = "T,…")]
    pub columns: Option<Vec<usize>>,
    /// auto (as `run`: CUDA when a driver and device are present, else host), host, cuda, or
    /// host,cuda (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    pub backend: Vec<String>,
    /// Only shard I of N (0-based), e.g. 0/4.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Also list every excluded configuration with the rule that excluded it, and estimate the
    /// plan's duration from the receipts of earlier runs (--history).
    #[arg(long)]
    pub explain: bool,
    /// Receipt directories of earlier runs (one per run, of one model and battery) to estimate
    /// the plan's duration from (with --explain).
    #[arg(long, value_name = "DIR", num_args = 1.., requires = "explain")]
    pub history: Vec<PathBuf>,
    /// With --explain: the runs of each part of `run --worker-processes N` (a night takes about its
    /// largest part's time: a part also runs the census baselines other parts would provide).
    #[arg(long, value_name = "N", requires = "explain")]
    pub worker_processes: Option<usize>,
    /// A door registry file instead of the built-in gates/doors.toml.
    #[arg(long, value_name = "FILE")]
    pub registry: Option<PathBuf>,
}

/// `selftest`.
#[derive(Args, Debug)]
pub struct SelftestArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// auto (CUDA when a driver and device are present), host, or cuda.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Directory for the canaries' receipts and summary.
    #[arg(long, default_value = "memra-selftest")]
    pub out: PathBuf,
    /// Use only the first N prompts of the battery (default 2: canaries fire early).
    #[arg(long, default_value_t = 2)]
    pub prompts: usize,
    /// Seed of the flip canary's element (chosen among the elements of its seam's tensor and
    /// recorded in its receipt), unless MEMRA_CANARY_FLIP_AT names one.
    #[arg(long, default_value_t = 1)]
    pub flip_seed: u64,
    /// Run every canary at these sessions per pass (rows), comma separated from 1, 2, 4, 8 (1:
    /// single-token, the default; `--batch 1,4` runs both).
    #[arg(long, value_delimiter = ',', value_name = "B,…")]
    pub batch: Option<Vec<usize>>,
    /// Run every canary at these tokens per pass (columns), comma separated from 1, 2, 4, 8.
    #[arg(long, value_delimiter = ',', value_name = "T,…")]
    pub columns: Option<Vec<usize>>,
    /// FOR TESTING SELFTEST ITSELF: run this canary with its defect removed (selftest must fail).
    #[arg(long, value_name = "CANARY_ID")]
    pub disarm: Option<String>,
}

/// `diff`.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The baseline receipts: a receipt file or a directory of them.
    pub old: PathBuf,
    /// The receipts to judge against OLD: a receipt file or a directory of them.
    pub new: PathBuf,
    /// md | text | json
    #[arg(long, default_value = "md")]
    pub format: String,
    /// Relative latency slowdown that counts as a regression (METRICS.md); by default 0.5 for
    /// host receipts and 0.1 for CUDA receipts.
    #[arg(long)]
    pub threshold: Option<f64>,
}

/// `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// auto (CUDA when a driver and device are present), host (needs --allow-host), or cuda.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Timed decode steps (after warm-up); each gives one sample per layer × seam.
    #[arg(long, default_value_t = 24)]
    pub steps: usize,
    /// Untimed decode steps before the timed ones.
    #[arg(long, default_value_t = 4)]
    pub warmup: usize,
    /// Bytes of the device-to-device copy that measures the bandwidth.
    #[arg(long, default_value_t = 1 << 30)]
    pub copy_bytes: usize,
    /// Python with PyTorch for the side-by-side layer.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The PyTorch anchor script.
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
    /// Launch every CUDA kernel plainly, each scheduled only after the one before it completed,
    /// instead of with programmatic dependent launch (sm_90 and later): the anchor of an A/B of
    /// the launch order in one binary (no bit can differ; the receipt's
    /// `extra.launch_programmatic` says which was timed).
    #[arg(long)]
    pub serialized_launches: bool,
    /// Directory to write the performance receipt into (`run-<id>.json`, like every receipt).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// A door to time, by env name or id, `NAME`, `NAME=1` or `NAME=0` (repeatable; overrides
    /// MEMRA_*): e.g. `--door decode_v2 --door f32_mirror` for the batched attention of rows. The
    /// set must be one the matrix could run at TP1 over host-bounce at this pass shape, every door
    /// must engage, and the receipt names the set (`--compare` refuses another).
    #[arg(long = "door", value_name = "NAME[=0|1]")]
    pub doors: Vec<String>,
    /// Sessions per pass (rows: 1, 2, 4 or 8): B sessions decode together; the table adds the
    /// per-token latency, per-pass latency ÷ B.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Tokens of one session per pass (columns: 1, 2, 4 or 8), teacher-forced so every column is
    /// accepted; the table adds the per-token latency, per-pass latency ÷ T.
    #[arg(long, default_value_t = 1)]
    pub columns: usize,
    /// A performance receipt an earlier bench wrote (`run-<id>.json`): after the run, judge every
    /// seam, whole layer (per token for rows or columns) and the step FASTER / SAME / SLOWER /
    /// AMBIGUOUS against it by the door-effect noise rule (METRICS.md, "Door effects"). Exit status 3 when any
    /// is SLOWER; 2 when BASE is another configuration or device.
    #[arg(long, value_name = "BASE.json")]
    pub compare: Option<PathBuf>,
    /// With --compare: judge this existing performance receipt against BASE; nothing is run.
    #[arg(long, value_name = "NEW.json", requires = "compare")]
    pub against: Option<PathBuf>,
    /// Judge issue 27's targets (one H200, `step`, TP1, b1, --graph) from this existing b1
    /// receipt, and from ncu's profile of the same build with --ncu; nothing is run. Every row
    /// MET / NOT MET / NOT MEASURED; exit status 0 only when every row is MET.
    #[arg(long, value_name = "RECEIPT.json", conflicts_with = "compare")]
    pub targets: Option<PathBuf>,
    /// With --targets: ncu's CSV of one b1 bench (`ncu --metrics gpu__time_duration.sum --csv`,
    /// the program's own lines may be in it), for the single-row kernels' times.
    #[arg(long, value_name = "PROFILE.csv", requires = "targets")]
    pub ncu: Option<PathBuf>,
}

/// `plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Receipt files or directories (with --history: one directory per night).
    #[arg(required = true)]
    pub receipts: Vec<PathBuf>,
    /// Directory for the SVG and PNG files.
    #[arg(long, default_value = "memra-plots")]
    pub out: PathBuf,
    /// One line per seam across the receipt sets, ordered by their date: the median over the
    /// configurations (one screen), or one panel per configuration with --per-config.
    #[arg(long)]
    pub history: bool,
    /// With --history: one panel per configuration instead of their median.
    #[arg(long, requires = "history")]
    pub per_config: bool,
    /// One chart of what each door buys: a row per door, its step-latency ratio against its
    /// parent sets per TP size with the noise interval, across the nights given (one directory
    /// per night, like --history): `door-effects.{svg,png}`.
    #[arg(long, conflicts_with = "history")]
    pub doors: bool,
}

/// `effects`.
#[derive(Args, Debug)]
pub struct EffectsArgs {
    /// One night's receipt directory.
    pub dir: PathBuf,
    /// Print only; do not write DIR/door-effects.json.
    #[arg(long)]
    pub no_write: bool,
}

/// `promote`.
#[derive(Args, Debug)]
pub struct PromoteArgs {
    /// Nightly receipt directories (one per night).
    #[arg(long = "history", required = true, num_args = 1..)]
    pub history: Vec<PathBuf>,
    /// Nights every door must have passed.
    #[arg(long, default_value_t = 7)]
    pub nights: usize,
    /// full (every legal combination containing the door, docs/DESIGN.md §7) or ran (every receipt that
    /// contains the door passed).
    #[arg(long, default_value = "full")]
    pub coverage: String,
    /// Nights of the window in which a door must pay: faster beyond noise at every TP size it
    /// ran (or its declared benefit). Default: two thirds of --nights, rounded up.
    #[arg(long, value_name = "K")]
    pub gain_nights: Option<usize>,
    /// Write the updated defaults block here.
    #[arg(long, default_value = "doors-defaults.toml")]
    pub out: PathBuf,
    /// The door registry the history is judged against (default: the built-in gates/doors.toml).
    #[arg(long, value_name = "FILE")]
    pub registry: Option<PathBuf>,
    /// Judge the history of an external subject: its manifest's doors are the registry
    /// (docs/subject-protocol.md).
    #[arg(long, value_name = "MANIFEST", conflicts_with = "registry")]
    pub subject: Option<PathBuf>,
}

/// `probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// auto (CUDA when a driver and device are present), host, or cuda.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Ranks to place (one per device when there are enough, else co-resident).
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Transports to probe, comma separated: host-bounce, native-p2p, nccl.
    #[arg(long, value_delimiter = ',', default_value = "host-bounce,native-p2p,nccl")]
    pub transport: Vec<String>,
    /// Copies per timed batch.
    #[arg(long, default_value_t = 50)]
    pub reps: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}
