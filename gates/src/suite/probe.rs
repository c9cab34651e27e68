//! The byte-integrity probe as a gate (docs/DESIGN.md §3.5): before the first job at TP > 1 over a
//! transport, every ordered rank pair copies a hashed pattern over that transport — host-bounce
//! and nccl as well as native-p2p — at a ladder of sizes from one 4-byte word up (odd word counts
//! included) and at every payload size the model's program really copies, and every wrong word
//! is counted. A pair without peer access makes the job SKIP (it cannot run); a wrong word FAILs
//! the probe gate, and the job still runs, so its identity verdict is shown beside the probe's.

use super::{Evaluation, Phase, Suite};
use crate::gate::Outcome;
use crate::job::Job;
use memra_receipts::schema::{Gate, GateResult, Verdict};
use memra_runtime::backend::{open, BackendKind, ProbeResult, PROBE_SIZES_BYTES};
use memra_runtime::Transport;

/// The ladder of probe sizes on a backend: every rung on devices; on the host backend the 64 MiB
/// rung is left out (arena-to-arena copies are plain memcpy, and 56 ordered pairs × 64 MiB would
/// dominate a CI run) — the receipt lists exactly the sizes probed.
pub fn probe_sizes(backend: BackendKind) -> &'static [usize] {
    match backend {
        BackendKind::Cuda => &PROBE_SIZES_BYTES,
        BackendKind::Host => &PROBE_SIZES_BYTES[..PROBE_SIZES_BYTES.len() - 1],
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

impl Suite<'_> {
    /// The probe of (backend, TP, transport), run once: the ladder and the model's payloads.
    fn probe(&self, backend: BackendKind, tp: usize, transport: Transport) -> Result<Vec<ProbeResult>, String> {
        self.in_phase(Phase::Probe, |_| self.probe_once(backend, tp, transport))
    }

    fn probe_once(&self, backend: BackendKind, tp: usize, transport: Transport) -> Result<Vec<ProbeResult>, String> {
        let mut probes = self.probes.lock().expect("probe lock");
        probes
            .entry((backend, tp, transport))
            .or_insert_with(|| {
                let mut sizes = probe_sizes(backend).to_vec();
                let payloads = memra_runtime::program::payloads::copy_payload_bytes(&self.runtime.model.config, tp)
                    .map_err(|e| e.to_string())?;
                sizes.extend(payloads);
                sizes.sort_unstable();
                sizes.dedup();
                let mut b = open(backend, tp).map_err(|e| e.to_string())?;
                b.probe(transport, &sizes).map_err(|e| e.to_string())
            })
            .clone()
    }

    /// The probe gate of a job at TP > 1. Returns false when the job cannot run here (a pair
    /// without peer access: SKIP); a corrupt or failed probe is a FAIL of the probe gate, and
    /// the job goes on.
    pub(super) fn probe_gate(&self, job: &Job, ev: &mut Evaluation) -> bool {
        if job.tp < 2 {
            return true;
        }
        let t = job.transport.name();
        let outcome = match self.probe(job.backend, job.tp, job.transport) {
            Err(e) => Outcome::Fail(format!("the {t} byte-integrity probe could not run: {e}")),
            Ok(results) => {
                ev.probe = results.clone();
                if let Some(p) = results.iter().find(|p| p.no_peer_access.is_some()) {
                    ev.verdict = Verdict::Skip;
                    ev.reason = Some(format!(
                        "no peer access from rank {} to rank {}: {}",
                        p.src,
                        p.dst,
                        p.no_peer_access.clone().unwrap_or_default()
                    ));
                    return false;
                }
                let mut sizes: Vec<usize> = results.iter().map(|p| p.bytes).collect();
                sizes.sort_unstable();
                sizes.dedup();
                match results.iter().find(|p| p.bad_words > 0) {
                    Some(p) => Outcome::Fail(format!(
                        "the {t} byte-integrity probe found {} wrong words copying {} bytes from rank {} to rank {}: copies are corrupt here",
                        p.bad_words, p.bytes, p.src, p.dst
                    )),
                    None => Outcome::Pass(format!(
                        "{} {t} copies of {} sizes ({} … {}) between every ordered rank pair: every word arrived",
                        results.len(),
                        sizes.len(),
                        human(sizes.first().copied().unwrap_or(0)),
                        human(sizes.last().copied().unwrap_or(0))
                    )),
                }
            }
        };
        let verdict = if outcome.passed() { Verdict::Pass } else { Verdict::Fail };
        ev.gates.push(GateResult { gate: Gate::Probe, verdict, detail: outcome.detail().to_string() });
        true
    }
}
