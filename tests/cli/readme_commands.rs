//! The README's two commands as a newcomer types them. `cargo run` and `cargo test` export every
//! variable the build script stamps (`cargo:rustc-env`) into the environment of the program they
//! start; a stamped `MEMRA_*` name was refused by the strict door parser, so the README's main
//! command exited 2 while the binary run directly worked (.ci/run now runs both commands
//! literally; this test keeps the regression in the test command too).

use crate::util::*;

/// The environment this test binary got from cargo, minus the door and setting names the
/// registry knows (a developer's shell may set doors; those would change what runs, not whether
/// it runs). Names the registry does not know stay — exactly what cargo adds.
#[test]
fn cargo_exported_build_stamps_are_not_refused_as_unknown_doors() {
    let doors = run(&["doors", "--json"]);
    doors.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&doors.stdout).expect("doors --json is JSON");
    let known: std::collections::BTreeSet<String> = ["doors", "settings"]
        .iter()
        .flat_map(|k| v[k].as_array().expect("doors --json lists doors and settings").clone())
        .map(|d| d["env"].as_str().expect("every entry has an env name").to_string())
        .collect();
    let dir = tempdir();
    let out_dir = dir.path().join("receipts");
    let mut cmd = std::process::Command::new(bin());
    cmd.args(short_host_run("1", &out_dir, &[]));
    for (name, _) in std::env::vars() {
        if known.contains(&name) {
            cmd.env_remove(&name);
        }
    }
    let stamped: Vec<String> = std::env::vars().map(|(k, _)| k).filter(|k| k.starts_with("MG_BUILD_")).collect();
    assert!(!stamped.is_empty(), "cargo did not export the build stamps into this test's environment");
    let out = cmd.output().expect("start memra-gates");
    assert_eq!(
        out.status.code(),
        Some(0),
        "memra-gates in cargo's environment (stamps {stamped:?}) exited {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}
