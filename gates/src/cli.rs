//! The command line (in progress).
pub fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(2)
}
