//! An interrupted run (Ctrl-C, SIGINT; or SIGTERM) ends at once, as before — every receipt is
//! written atomically, so what is on disk is complete — but first says what was kept and the
//! command that continues: the same command line with `--resume`.

use std::path::PathBuf;

/// The exit status of a run ended by SIGINT (128 + 2, as a shell reports it).
pub const INTERRUPTED_EXIT: i32 = 130;

/// `arg` quoted for a POSIX shell when it needs it.
fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The command line that continues this run: this process's arguments, with `--resume` added
/// (and `--replace` dropped: the directory now holds this plan's receipts).
pub fn resume_command() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "memra-gates".to_string();
    }
    args.retain(|a| a != "--replace");
    if !args.iter().any(|a| a == "--resume") {
        args.push("--resume".to_string());
    }
    args.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
}

/// Complete receipts (`run-*.json`) in `dir`.
fn receipts_in(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(memra_receipts::store::RECEIPT_PREFIX) && n.ends_with(memra_receipts::store::RECEIPT_SUFFIX)
        })
        .count()
}

/// From now on, SIGINT or SIGTERM prints what `dirs` hold and the `--resume` command, then ends
/// the process with [`INTERRUPTED_EXIT`]. A failure to install the handler leaves the default
/// (the run still ends at once on a signal, silently).
pub fn report_on_interrupt(dirs: Vec<PathBuf>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else { return };
    let resume = resume_command();
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
            let kept: Vec<String> =
                dirs.iter().map(|d| format!("{} complete receipt(s) in {}", receipts_in(d), d.display())).collect();
            eprintln!(
                "\nmemra-gates: interrupted ({name}): kept {}; the configuration(s) in progress were not written and \
                 no summary was written.\nmemra-gates: continue with: {resume}",
                kept.join(", ")
            );
            std::process::exit(if sig == SIGINT { INTERRUPTED_EXIT } else { 128 + SIGTERM });
        }
    });
}
