//! The PyTorch anchor computes what `bench` compares the program with (`scripts/bench/torch_layer_check.py`,
//! on the CPU at a small shape): a verify pass of T columns equals T single-token steps of one
//! session; `--distinct D` reads exactly D distinct experts; the grouped-GEMM form computes the
//! reference form's layer. Each check's planted defect (a column that sees the next, D − 1
//! experts, expert offsets shifted by one) fails that check and no other. Needs python3 with
//! PyTorch; without it the test says so and passes (`.ci/run` does not install PyTorch).

use crate::util::*;

fn check(plant: Option<&str>) -> std::process::Output {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(repo("scripts/bench/torch_layer_check.py"));
    if let Some(p) = plant {
        cmd.args(["--plant", p]);
    }
    cmd.output().expect("python3 runs")
}

#[test]
fn the_anchor_verifies_columns_as_steps_reads_the_distinct_experts_asked_and_its_forms_agree() {
    let has_torch =
        std::process::Command::new("python3").args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !has_torch {
        eprintln!("skipped: no PyTorch (python3 -c 'import torch' failed)");
        return;
    }
    let out = check(None);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("3 checks passed"), "{stdout}{stderr}");

    for (plant, caught_by) in [("causal", "columns"), ("distinct", "distinct"), ("groups", "forms")] {
        let out = check(Some(plant));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--plant {plant} was not caught: {stderr}");
        let failed: Vec<&str> = stderr
            .lines()
            .filter_map(|l| l.strip_prefix("torch_layer_check: FAIL: "))
            .filter_map(|l| l.split(':').next())
            .collect();
        assert_eq!(failed, vec![caught_by], "--plant {plant}: {stderr}");
    }
}
