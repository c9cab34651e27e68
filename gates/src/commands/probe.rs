//! `memra-gates probe`: what the machine's transports can be trusted with, and what they cost.
//!
//! Lists the devices and placement, runs the byte-integrity probe of docs/DESIGN.md §3.5 over every
//! ordered rank pair for each transport, and times rank-0 → rank-1 copies at the seam payload
//! sizes of the presets (wall clock over back-to-back copies between two synchronisations, so
//! launch and ordering overhead are included, as they are in a decode step).

use super::Status;
use crate::args::ProbeArgs;
use crate::error::GateError;
use memra_runtime::backend::{open, Backend, Slice, Transfer};
use memra_runtime::Transport;
use std::time::Instant;

/// Seam payloads of the presets: one rank's o_join partials or a replicated hidden row, from the
/// tiny preset at TP8 (4 KiB) to the step preset's expert partials at TP1 (1 MiB).
pub const PAYLOAD_BYTES: [usize; 5] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];

/// Median microseconds of one rank-0 → rank-1 copy of `bytes` over `transport`.
fn time_copy(b: &mut dyn Backend, transport: Transport, bytes: usize, reps: usize) -> Result<f64, GateError> {
    let n = bytes / 4;
    let src = Slice::new(b.alloc(0, n)?, 0, n);
    let dst = Slice::new(b.alloc(1, n)?, 0, n);
    b.copy(Transfer::new(transport, (0, src), (1, dst)))?;
    b.collect()?;
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            b.copy(Transfer::new(transport, (0, src), (1, dst)))?;
        }
        b.collect()?;
        samples.push(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

pub fn probe(args: &ProbeArgs) -> Result<Status, GateError> {
    let registry = crate::plan::load_registry(&None)?;
    let request = crate::plan::door_request(&registry, &[])?;
    let backend = crate::plan::resolve_backend(&args.backend, request.require_gpu(&registry))?;
    let ranks = args.ranks;
    memra_runtime::config::check_tp(ranks)?;
    if ranks < 2 {
        return Err(GateError::usage("--ranks 1 has no pair to probe: use 2, 4 or 8"));
    }
    let transports: Vec<Transport> = crate::plan::parse_transports(&args.transport)?;
    let sizes = crate::suite::probe_sizes(backend);
    let mut failed = false;
    let mut report = serde_json::Map::new();
    for t in transports {
        let mut b = open(backend, ranks)?;
        crate::say!("== {} over {}: {}", t.name(), backend.name(), b.describe());
        let results = match b.probe(t, sizes) {
            Ok(r) => r,
            Err(e) => {
                crate::say!("   not available: {e}");
                report.insert(t.name().into(), serde_json::json!({"error": e.to_string()}));
                continue;
            }
        };
        let bad: Vec<_> = results.iter().filter(|p| p.bad_words > 0 || p.no_peer_access.is_some()).collect();
        crate::say!(
            "   byte-integrity probe: {} ordered pair × size checks, {} bad{}",
            results.len(),
            bad.len(),
            bad.first()
                .map(|p| format!(" (first: {}→{} {} B: {} bad words)", p.src, p.dst, p.bytes, p.bad_words))
                .unwrap_or_default()
        );
        failed |= !bad.is_empty();
        let mut timings = serde_json::Map::new();
        for &bytes in &PAYLOAD_BYTES {
            let us = time_copy(b.as_mut(), t, bytes, args.reps)?;
            crate::say!("   {:>8} B: {:>8.2} µs  {:>8.2} GB/s", bytes, us, bytes as f64 / us / 1e3);
            timings.insert(bytes.to_string(), serde_json::json!(us));
        }
        report.insert(
            t.name().into(),
            serde_json::json!({
                "placement": b.describe(),
                "probe_checks": results.len(),
                "probe_bad": bad.len(),
                "copy_median_us_by_bytes": timings,
            }),
        );
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&serde_json::Value::Object(report)).unwrap_or_default();
        memra_receipts::store::write_atomic(path, text.as_bytes())?;
    }
    Ok(if failed { Status::Failed } else { Status::Passed })
}
