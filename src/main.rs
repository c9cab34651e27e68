fn main() -> std::process::ExitCode { memra_gating::cli::main() }
