//! Atomic writes, directory layout, loading and `--resume` listing.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memra_receipts::json::{read_receipt, read_summary, receipt_to_json};
use memra_receipts::store::*;
use memra_receipts::*;

use crate::util::*;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn temp_files(dir: &Path) -> Vec<String> {
    names(dir).into_iter().filter(|n| is_temp_file_name(n)).collect()
}

#[test]
fn receipt_file_names_carry_the_run_id() {
    let dir = Path::new("/x/nightly");
    assert_eq!(receipt_path(dir, "0123456789abcdef"), PathBuf::from("/x/nightly/run-0123456789abcdef.json"));
    assert_eq!(summary_path(dir), PathBuf::from("/x/nightly/summary.json"));
    assert_eq!(run_id_from_file_name("run-0123456789abcdef.json"), Some("0123456789abcdef"));
    for bad in ["run-0123456789ABCDEF.json", "run-0123.json", "summary.json", "run-0123456789abcdef.json.tmp"] {
        assert_eq!(run_id_from_file_name(bad), None, "{bad}");
    }
    assert!(is_temp_file_name(".run-0123456789abcdef.json.4242.0.tmp"));
    assert!(!is_temp_file_name("run-0123456789abcdef.json"));
}

#[test]
fn write_receipt_leaves_only_the_final_file() {
    let dir = tempfile::tempdir().unwrap();
    let r = passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]);
    let path = write_receipt(dir.path(), &r).unwrap();
    assert_eq!(path, receipt_path(dir.path(), &r.run_id));
    assert_eq!(names(dir.path()), [format!("run-{}.json", r.run_id)]);
    assert_eq!(fs::read_to_string(&path).unwrap(), receipt_to_json(&r).unwrap());
    assert_eq!(read_receipt(&path).unwrap(), r);
}

#[test]
fn rewriting_a_receipt_is_atomic_for_concurrent_readers() {
    let dir = tempfile::tempdir().unwrap();
    let small = skipped(passing(2, Transport::NativeP2p, &[]), "no peer access");
    let big = receipt_with(small.evidence.config.clone(), 8, 6, 16); // same run_id, much longer file
    assert_eq!(small.run_id, big.run_id);
    let path = write_receipt(dir.path(), &small).unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (done, path) = (Arc::clone(&done), path.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !done.load(Ordering::Acquire) || reads < 50 {
                // With a truncate-and-write implementation this sees empty or partial files.
                let r = read_receipt(&path).unwrap_or_else(|e| panic!("read {reads} saw a partial receipt: {e}"));
                assert!(matches!(r.evidence.verdict, Verdict::Skip | Verdict::Pass));
                reads += 1;
            }
            reads
        })
    };
    for i in 0..200 {
        write_receipt(dir.path(), if i % 2 == 0 { &big } else { &small }).unwrap();
    }
    done.store(true, Ordering::Release);
    let reads = reader.join().unwrap();
    assert!(reads >= 50);
    assert_eq!(read_receipt(&path).unwrap(), small);
    assert!(temp_files(dir.path()).is_empty(), "{:?}", names(dir.path()));
}

#[test]
fn a_failed_write_keeps_the_previous_receipt_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = passing(1, Transport::HostBounce, &[]);
    let path = write_receipt(dir.path(), &good).unwrap();
    let before = fs::read(&path).unwrap();
    let mut bad = good.clone();
    bad.measurements.wall_ms = f64::NAN;
    let err = write_receipt(dir.path(), &bad).unwrap_err();
    assert!(matches!(err, ReceiptError::NonFinite { .. }), "{err:?}");
    assert_eq!(err.path(), Some(path.as_path()), "the error names the receipt file");
    assert_eq!(fs::read(&path).unwrap(), before);
    assert_eq!(names(dir.path()), [format!("run-{}.json", good.run_id)]);
}

#[test]
fn writing_into_a_missing_directory_is_an_io_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-there");
    let err = write_receipt(&missing, &passing(1, Transport::HostBounce, &[])).unwrap_err();
    assert!(matches!(err, ReceiptError::Io { action: "create temporary file", .. }), "{err:?}");
    assert!(err.to_string().contains("not-there"), "{err}");
    assert!(!missing.exists());
}

#[test]
fn load_dir_reads_receipts_sorted_and_ignores_temp_and_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let receipts = [
        passing(1, Transport::HostBounce, &[]),
        passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]),
        failing(passing(4, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)])),
    ];
    for r in &receipts {
        write_receipt(dir.path(), r).unwrap();
    }
    // An interrupted write, other exports, the summary.
    fs::write(dir.path().join(format!(".run-{}.json.999.0.tmp", receipts[0].run_id)), b"{\"schema_ver").unwrap();
    fs::write(dir.path().join("junit.xml"), b"<testsuite/>").unwrap();
    fs::write(dir.path().join("notes.json"), b"not a receipt").unwrap();
    write_summary(dir.path(), &Summary::from_receipts("all", &receipts)).unwrap();

    let loaded = load_dir(dir.path()).unwrap();
    let mut ids: Vec<&str> = receipts.iter().map(|r| r.run_id.as_str()).collect();
    ids.sort();
    assert_eq!(loaded.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), ids);
    let scan = scan_dir(dir.path()).unwrap();
    assert_eq!(scan.temp_files.len(), 1);
    assert!(scan.broken.is_empty());
    let summary = read_summary(&summary_path(dir.path())).unwrap();
    assert_eq!(summary.rows.len(), 3);
}

#[test]
fn resume_lists_complete_runs_and_reports_broken_receipts() {
    let dir = tempfile::tempdir().unwrap();
    let done_pass = passing(1, Transport::HostBounce, &[]);
    let done_skip = skipped(passing(8, Transport::NativeP2p, &[]), "no peer access");
    write_receipt(dir.path(), &done_pass).unwrap();
    write_receipt(dir.path(), &done_skip).unwrap();

    // A receipt cut short (written by something that did not write atomically).
    let cut = passing(2, Transport::HostBounce, &[]);
    let text = receipt_to_json(&cut).unwrap();
    fs::write(receipt_path(dir.path(), &cut.run_id), &text[..text.len() / 2]).unwrap();
    // A receipt from a future build.
    let future = passing(4, Transport::HostBounce, &[]);
    let text = receipt_to_json(&future).unwrap().replacen("\"schema_version\": 2", "\"schema_version\": 9", 1);
    fs::write(receipt_path(dir.path(), &future.run_id), text).unwrap();
    // A receipt under another run's name.
    fs::write(receipt_path(dir.path(), "00000000000000aa"), receipt_to_json(&done_pass).unwrap()).unwrap();

    let scan = scan_dir(dir.path()).unwrap();
    let complete = scan.complete();
    assert_eq!(complete.len(), 2, "{complete:?}");
    assert_eq!(complete[&done_pass.run_id], Verdict::Pass);
    assert_eq!(complete[&done_skip.run_id], Verdict::Skip);
    assert!(!complete.contains_key(&cut.run_id) && !complete.contains_key(&future.run_id));

    assert_eq!(scan.broken.len(), 3, "{:?}", scan.broken);
    let kinds: Vec<&str> = scan
        .broken
        .iter()
        .map(|e| match e {
            ReceiptError::Syntax { .. } => "syntax",
            ReceiptError::UnsupportedVersion { .. } => "version",
            ReceiptError::Misnamed { .. } => "misnamed",
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    for k in ["syntax", "version", "misnamed"] {
        assert!(kinds.contains(&k), "{kinds:?}");
    }
    for e in &scan.broken {
        assert!(e.path().is_some_and(|p| p.starts_with(dir.path())), "{e}");
    }
    // Strict loading refuses the directory, naming the first broken file.
    let err = load_dir(dir.path()).unwrap_err();
    assert_eq!(err.to_string(), scan.broken[0].to_string());
}

#[test]
fn scanning_a_missing_directory_is_an_error() {
    let err = scan_dir(Path::new("/definitely/not/here")).unwrap_err();
    assert!(matches!(err, ReceiptError::Io { action: "list directory", .. }), "{err:?}");
}
