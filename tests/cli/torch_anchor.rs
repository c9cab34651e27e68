//! The PyTorch anchor computes what `bench` compares the program with: `scripts/bench/test_torch_layer.py`
//! (unittest, on the CPU at small shapes) — every form that runs on the CPU agrees and is timed, a
//! form that computes something else is refused, a verify pass of T columns equals T single-token
//! steps of one session, `--distinct D` reads exactly D distinct experts, and the grouped-GEMM form
//! computes the reference form's layer, each check with its planted defect failing it. Needs
//! python3 with PyTorch; without it the test says so and passes (`.ci/run` does not install
//! PyTorch), except on a GPU CI machine (`MEMRA_REQUIRE_GPU=1`), where `bench` needs the anchor:
//! there a missing PyTorch fails.

use crate::util::*;

#[test]
fn the_anchor_verifies_columns_as_steps_reads_the_distinct_experts_asked_and_its_forms_agree() {
    let has_torch =
        std::process::Command::new("python3").args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !has_torch {
        assert!(
            std::env::var("MEMRA_REQUIRE_GPU").as_deref() != Ok("1"),
            "MEMRA_REQUIRE_GPU=1 and no PyTorch (python3 -c 'import torch' failed): bench's anchor cannot run here"
        );
        eprintln!("skipped: no PyTorch (python3 -c 'import torch' failed)");
        return;
    }
    let out = std::process::Command::new("python3")
        .arg(repo("scripts/bench/test_torch_layer.py"))
        .output()
        .expect("python3 runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "test_torch_layer.py failed:\n{report}");
    let ran: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no unittest summary:\n{report}"));
    assert!(ran >= 6 && !report.contains("skipped"), "ran {ran} tests, some skipped?\n{report}");
}
