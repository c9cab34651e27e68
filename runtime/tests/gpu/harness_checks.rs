//! The harness's own behaviour, proved where CI runs (no GPU): a GPU test on a machine without
//! CUDA reads `ignored (no CUDA device: …)` and is counted as ignored, and under
//! `MEMRA_REQUIRE_GPU=1` the same test fails naming the reason. The end-to-end checks start this
//! very executable again as a child (`current_exe`, so it is always the build under test) with
//! `CUDA_VISIBLE_DEVICES=""`, which hides every device from the driver: the child sees no device
//! on a GPU machine too, and these checks hold there as well. The device-count rules, which no
//! machine here can show end to end, are checked on the policy and the precheck directly.

use crate::harness::{precheck, GpuTest, NotRun, Policy, Ran, Skip, Verdict, REQUIRE_DEVICES, REQUIRE_GPU};
use memra_runtime::backend::cuda::CudaUnavailable;
use std::process::{Command, Output};

pub fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest::new("policy_turns_each_skip_into_its_outcome", policy_turns_each_skip_into_its_outcome)
            .needs_devices(0),
        GpuTest::new("policy_refuses_bad_values", policy_refuses_bad_values).needs_devices(0),
        GpuTest::new("precheck_compares_the_declared_devices_with_the_machine", precheck_compares_declared_devices)
            .needs_devices(0),
        GpuTest::new("a_partly_run_test_is_not_a_pass", a_partly_run_test_is_not_a_pass).needs_devices(0),
        GpuTest::new("without_cuda_a_gpu_test_reads_ignored_with_the_reason", without_cuda_reads_ignored)
            .needs_devices(0),
        GpuTest::new("without_cuda_require_gpu_fails_the_test_naming_the_reason", without_cuda_require_gpu_fails)
            .needs_devices(0),
        GpuTest::new("the_harness_keeps_libtest_arguments", the_harness_keeps_libtest_arguments).needs_devices(0),
    ]
}

fn policy(require_gpu: bool, require_devices: usize) -> Policy {
    Policy { require_gpu, require_devices }
}

fn policy_turns_each_skip_into_its_outcome() -> Ran {
    let missing = Skip::Missing("no CUDA device: no CUDA driver library found".into());
    let two_of_one = Skip::Devices { need: 2, present: 1 };
    let bench = Skip::NotRequested("set MEMRA_GPU_BENCH=1".into());
    let ignored = |s: &str| Verdict::Ignored(s.to_string());

    // Default: every skip is ignored, with its reason.
    let p = Policy::default();
    assert_eq!(p.judge(&missing), ignored("no CUDA device: no CUDA driver library found"));
    assert_eq!(p.judge(&two_of_one), ignored("needs 2 devices, 1 present"));
    assert_eq!(p.judge(&bench), ignored("set MEMRA_GPU_BENCH=1"));

    // MEMRA_REQUIRE_GPU=1: a missing GPU fails; a declared multi-device test on a smaller machine
    // stays ignored (it never passes); a measurement nobody asked for stays ignored.
    let p = policy(true, 0);
    assert_eq!(
        p.judge(&missing),
        Verdict::Failed("MEMRA_REQUIRE_GPU=1 but no CUDA device: no CUDA driver library found".into())
    );
    assert_eq!(p.judge(&two_of_one), ignored("needs 2 devices, 1 present"));
    assert_eq!(p.judge(&bench), ignored("set MEMRA_GPU_BENCH=1"));

    // MEMRA_REQUIRE_DEVICES=N: a test needing up to N devices fails on a smaller machine; one
    // needing more is still ignored; a missing GPU fails (N ≥ 1 implies a GPU).
    let p = policy(false, 2);
    let Verdict::Failed(why) = p.judge(&two_of_one) else { panic!("needs 2 under MEMRA_REQUIRE_DEVICES=2 must fail") };
    assert_eq!(why, "MEMRA_REQUIRE_DEVICES=2 but this test needs 2 devices and 1 are present");
    assert_eq!(p.judge(&Skip::Devices { need: 4, present: 2 }), ignored("needs 4 devices, 2 present"));
    assert!(matches!(p.judge(&missing), Verdict::Failed(w) if w.starts_with("MEMRA_REQUIRE_DEVICES=2 but no CUDA")));
    assert_eq!(p.judge(&bench), ignored("set MEMRA_GPU_BENCH=1"));
    Ok(())
}

fn policy_refuses_bad_values() -> Ran {
    assert_eq!(Policy::parse(None, None), Ok(Policy::default()));
    assert_eq!(Policy::parse(Some(""), Some("")), Ok(Policy::default()));
    assert_eq!(Policy::parse(Some("0"), Some("0")), Ok(Policy::default()));
    assert_eq!(Policy::parse(Some("1"), None), Ok(policy(true, 0)));
    assert_eq!(Policy::parse(None, Some("8")), Ok(policy(false, 8)));
    for bad in ["yes", "true", " 1", "2"] {
        let e = Policy::parse(Some(bad), None).unwrap_err();
        assert!(e.starts_with(&format!("{REQUIRE_GPU}={bad:?} is not a valid value")), "{e}");
    }
    for bad in ["two", "-1", "2 ", "1.5"] {
        let e = Policy::parse(None, Some(bad)).unwrap_err();
        assert!(e.starts_with(&format!("{REQUIRE_DEVICES}={bad:?} is not a valid value")), "{e}");
    }
    Ok(())
}

fn precheck_compares_declared_devices() -> Ran {
    let no_driver: Result<usize, CudaUnavailable> = Err(CudaUnavailable::NoDriverLibrary);
    // needs 0: the body decides, whatever the machine.
    assert_eq!(precheck(0, &no_driver), Ok(()));
    let Err(Skip::Missing(why)) = precheck(1, &no_driver) else { panic!("no driver must be a missing GPU") };
    assert!(why.starts_with("no CUDA device: no CUDA driver library found"), "{why}");
    let Err(Skip::Missing(why)) = precheck(1, &Err(CudaUnavailable::NoNvrtcLibrary)) else { panic!("no NVRTC") };
    assert!(why.starts_with("no NVRTC library"), "{why}");
    let no_device = Err(Skip::Missing("no CUDA device: the driver reports 0 devices".into()));
    assert_eq!(precheck(1, &Ok(0)), no_device, "0 devices is no device, not too few");
    assert_eq!(precheck(2, &Err(CudaUnavailable::NoDevice)), no_device);
    assert_eq!(precheck(1, &Ok(1)), Ok(()));
    assert_eq!(precheck(2, &Ok(1)), Err(Skip::Devices { need: 2, present: 1 }));
    assert_eq!(precheck(8, &Ok(2)), Err(Skip::Devices { need: 8, present: 2 }));
    assert_eq!(precheck(2, &Ok(8)), Ok(()));
    Ok(())
}

fn a_partly_run_test_is_not_a_pass() -> Ran {
    let mut all = NotRun::new();
    all.ran();
    all.ran();
    assert_eq!(all.finish(), Ok(()));
    let mut part = NotRun::new();
    part.ran();
    part.note("TP2 native-p2p", "no peer access between devices 0 and 1");
    let Err(Skip::Missing(why)) = part.finish() else { panic!("a part not run must be a skip") };
    assert_eq!(why, "1 part(s) not run (1 ran and passed): TP2 native-p2p: no peer access between devices 0 and 1");
    Ok(())
}

// ---------------------------------------------------------------- this executable as a child

/// A GPU test that needs one device, and one registered as needing two.
const ONE_DEVICE_TEST: &str = "cuda_kernels::digest_matches_twin";
const TWO_DEVICE_TEST: &str = "cuda_kernels::program_over_nccl_equals_tp1::on_2_devices";

/// This executable with `args`, no device visible, no inherited `MEMRA_*`, and `env` set.
fn child(args: &[&str], env: &[(&str, &str)]) -> Output {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut cmd = Command::new(&exe);
    cmd.args(args).arg("--color").arg("never");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MEMRA_") {
            cmd.env_remove(&name);
        }
    }
    cmd.env("CUDA_VISIBLE_DEVICES", "").env_remove("RUST_BACKTRACE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()))
}

/// The child's stdout, each line behind `| ` so that, quoted in a failure message, its `test …`
/// lines are not read as this run's results (scripts/gpu/check.sh greps for them).
fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).lines().map(|l| format!("    | {l}\n")).collect()
}

/// The `test NAME ... OUTCOME` line of `name`.
fn result_line(out: &str, name: &str) -> String {
    let prefix = format!("    | test {name} ... ");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(lines.len(), 1, "one result line for {name} expected in:\n{out}");
    lines[0][prefix.len()..].to_string()
}

fn without_cuda_reads_ignored() -> Ran {
    for name in [ONE_DEVICE_TEST, TWO_DEVICE_TEST] {
        let o = child(&["--exact", name], &[]);
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(0), "an ignored test is not a failure:\n{out}");
        let line = result_line(&out, name);
        assert!(line.starts_with("ignored (no CUDA device: "), "{name}: {line}");
        assert!(out.contains("0 passed; 0 failed; 1 ignored;"), "counted as ignored, not passed:\n{out}");
    }
    Ok(())
}

fn without_cuda_require_gpu_fails() -> Ran {
    for name in [ONE_DEVICE_TEST, TWO_DEVICE_TEST] {
        let o = child(&["--exact", name], &[(REQUIRE_GPU, "1")]);
        let out = stdout(&o);
        assert_ne!(o.status.code(), Some(0), "MEMRA_REQUIRE_GPU=1 without a device must fail:\n{out}");
        assert_eq!(result_line(&out, name), "FAILED", "{out}");
        assert!(out.contains("0 passed; 1 failed; 0 ignored;"), "{out}");
        // The failure section names the variable and the reason.
        let reason = format!("{REQUIRE_GPU}=1 but no CUDA device: ");
        assert!(out.contains(&format!("| ---- {name} ----")) && out.contains(&reason), "{out}");
    }
    // The same under MEMRA_REQUIRE_DEVICES=2 for the test declared as needing 2 devices.
    let o = child(&["--exact", TWO_DEVICE_TEST], &[(REQUIRE_DEVICES, "2")]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains(&format!("{REQUIRE_DEVICES}=2 but no CUDA device: ")), "{}", stdout(&o));
    // A value the variable does not accept stops the run before any test (exit 2).
    let o = child(&["--exact", ONE_DEVICE_TEST], &[(REQUIRE_GPU, "yes")]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("MEMRA_REQUIRE_GPU=\"yes\" is not a valid value"), "{err}");
    Ok(())
}

/// `--list`, a filter and `--ignored` behave as libtest's (scripts/gpu/check.sh relies on them).
fn the_harness_keeps_libtest_arguments() -> Ran {
    let o = child(&["--list"], &[]);
    let list = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{list}");
    let names: Vec<&str> =
        list.lines().filter_map(|l| l.strip_prefix("    | ")?.strip_suffix(": test")).collect();
    for module in ["cuda_kernels::", "cuda_direct::", "cuda_graph::", "harness_checks::"] {
        assert!(names.iter().any(|n| n.starts_with(module)), "no {module} test in --list:\n{list}");
    }
    assert!(names.contains(&ONE_DEVICE_TEST) && names.contains(&TWO_DEVICE_TEST), "{list}");
    // A substring filter runs every match and counts the rest as filtered out.
    let o = child(&["cuda_kernels::digest_matches_twin"], &[]);
    let out = stdout(&o);
    let filtered = names.len() - 1;
    assert!(out.contains(&format!("0 passed; 0 failed; 1 ignored; 0 measured; {filtered} filtered out")), "{out}");
    // `--ignored` runs only tests marked ignored before they start; here none is.
    let o = child(&["--ignored", "cuda_kernels::digest_matches_twin"], &[]);
    assert!(stdout(&o).contains("0 passed; 0 failed; 0 ignored;"), "{}", stdout(&o));
    Ok(())
}
