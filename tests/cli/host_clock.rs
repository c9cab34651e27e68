//! `MEMRA_HOST_CLOCK=1` (runtime/src/host_clock.rs): `run` prints where its runs' host time went,
//! and prints nothing of it unless asked.

use crate::util::*;

#[test]
fn the_host_clock_table_is_printed_only_when_asked() {
    let dir = tempdir();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let extra = ["--transport", "host-bounce", "--quiet"];
    let on = run_env(&short_host_run("1", &a, &extra), &[("MEMRA_HOST_CLOCK", "1")]);
    on.expect_code(0);
    let line = on.stderr.lines().find(|l| l.starts_with("run (program::run_prepared)")).unwrap_or_else(|| {
        panic!("no `run` line in the host clock table:\n{}", on.stderr);
    });
    let calls: u64 = line.split_whitespace().nth(2).and_then(|c| c.parse().ok()).unwrap_or(0);
    assert!(calls >= 2, "the table counts {calls} runs of the program (a configuration runs at least twice): {line}");
    let off = run(&short_host_run("1", &b, &extra));
    off.expect_code(0);
    assert!(!off.stderr.contains("host clock"), "the table was printed without MEMRA_HOST_CLOCK=1:\n{}", off.stderr);
}
