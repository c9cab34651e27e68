//! The optional backend evidence of a tape (protocol 1, `memra.tape` keys `backend_census`,
//! `coverage`, `copies`): what a subject's backend itself witnessed, beyond the counters of
//! `census`. The built-in runtime writes all three, so a plan run through the protocol gives the
//! same receipt evidence as the same plan run in process (`scripts/subjects/check-identity.sh`);
//! an engine that does not count these leaves them out, and its `census` is then its census.
//!
//! - `backend_census`: counter name → count of what the backend issued (launches per kernel,
//!   copies per transport and size, peer stores, …: `memra_runtime::evidence::census`). The
//!   engagement gate compares it with the same configuration's run with the door off.
//! - `coverage`: special path → `{"count": n, "first": [prompt, step, layer, "seam"] | null}`.
//! - `copies`: `{"verified": n, "faults": [[prompt, step, layer, "seam", src_rank, dst_rank], …]}`
//!   — cross-rank copies checked against their source, and those that arrived different.

use memra_runtime::evidence::census::Census;
use memra_runtime::evidence::coverage::{Coverage, PathCount, SeamPoint};
use memra_runtime::record::{CopyFault, Record, Seam};
use memra_witness::format::PREFIX as OUTSIDE;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A place in the program on the tape: prompt, step, layer, seam name.
type WirePlace = (usize, usize, usize, String);

/// One special path's count and first place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WirePath {
    pub count: u64,
    pub first: Option<WirePlace>,
}

/// Cross-rank copies checked, and the faults: (prompt, step, layer, seam, src rank, dst rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireCopies {
    pub verified: u64,
    pub faults: Vec<(usize, usize, usize, String, usize, usize)>,
}

/// The three optional keys of `memra.tape` (fields of [`TapeMeta`](super::tape::TapeMeta)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendEvidence {
    pub backend_census: Option<BTreeMap<String, u64>>,
    pub coverage: Option<BTreeMap<String, WirePath>>,
    pub copies: Option<WireCopies>,
}

fn seam_of(name: &str, what: &str) -> Result<Seam, String> {
    Seam::parse(name).ok_or_else(|| format!("{what}: {name:?} is not a seam name (docs/DESIGN.md §3.2)"))
}

impl BackendEvidence {
    /// What a record's backend witnessed.
    pub fn of(record: &Record) -> BackendEvidence {
        let place = |p: &SeamPoint| (p.prompt, p.step, p.layer, p.seam.name().to_string());
        BackendEvidence {
            backend_census: Some(record.census.counts().clone()),
            coverage: record.coverage.as_ref().map(|c| {
                c.iter()
                    .map(|(k, v)| (k.clone(), WirePath { count: v.count, first: v.first.as_ref().map(place) }))
                    .collect()
            }),
            copies: Some(WireCopies {
                verified: record.copies_verified,
                faults: record
                    .copy_faults
                    .iter()
                    .map(|f| (f.prompt, f.step, f.layer, f.seam.name().to_string(), f.src_rank, f.dst_rank))
                    .collect(),
            }),
        }
    }

    /// Put this evidence into `record` (whose `engaged` already holds the tape's `census`): the
    /// record's census is `backend_census` when given, else the subject's `census`. A seam name
    /// that is not a seam, or a place past the run, is the error returned.
    pub fn apply(&self, record: &mut Record, layers: usize) -> Result<(), String> {
        // The subject's own word (the receipt's `census_witness` says whose): the one place outside
        // the built-in backends where a census is made (tidy: `census_is_written_only_by_backends`).
        let reported = self.backend_census.clone().unwrap_or_else(|| record.engaged.clone());
        // The outside witness's counters are added by memra-gates alone (`super::witness`).
        if let Some(k) = reported.keys().chain(record.engaged.keys()).find(|k| k.starts_with(OUTSIDE)) {
            return Err(format!(
                "census counter {k:?}: counters named {OUTSIDE}* are the outside witness's, which memra-gates adds \
                 itself; a subject may not report one"
            ));
        }
        record.census = Census::reported(reported);
        let check_layer = |layer: usize, what: &str| {
            if layer > layers {
                Err(format!("{what}: layer {layer} is past the model's {layers} layers (and the head at {layers})"))
            } else {
                Ok(())
            }
        };
        if let Some(c) = &self.coverage {
            let mut coverage = Coverage::new();
            for (path, w) in c {
                let what = format!("`coverage` of {path:?}");
                let first = match &w.first {
                    Some((prompt, step, layer, seam)) => {
                        check_layer(*layer, &what)?;
                        Some(SeamPoint { prompt: *prompt, step: *step, layer: *layer, seam: seam_of(seam, &what)? })
                    }
                    None => None,
                };
                if (w.count == 0) != first.is_none() {
                    return Err(format!("{what}: a first place is given exactly when the count is > 0"));
                }
                coverage.insert(path.clone(), PathCount { count: w.count, first });
            }
            record.coverage = Some(coverage);
        }
        if let Some(c) = &self.copies {
            record.copies_verified = c.verified;
            record.copy_faults = c
                .faults
                .iter()
                .map(|(prompt, step, layer, seam, src_rank, dst_rank)| {
                    check_layer(*layer, "`copies.faults`")?;
                    let seam = seam_of(seam, "`copies.faults`")?;
                    Ok(CopyFault {
                        prompt: *prompt,
                        step: *step,
                        layer: *layer,
                        seam,
                        src_rank: *src_rank,
                        dst_rank: *dst_rank,
                    })
                })
                .collect::<Result<_, String>>()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subject may not write the outside witness's counters itself, in either census.
    #[test]
    fn a_tape_reporting_an_outside_counter_is_refused() {
        let forged: BTreeMap<String, u64> = [("outside.launch.gemm_bf16".to_string(), 3)].into();
        let mut r = Record { engaged: forged.clone(), ..Record::default() };
        let e = BackendEvidence::default().apply(&mut r, 2).unwrap_err();
        assert!(e.contains("\"outside.launch.gemm_bf16\"") && e.contains("may not report"), "{e}");
        let mut r = Record::default();
        let ev = BackendEvidence { backend_census: Some(forged), ..BackendEvidence::default() };
        assert!(ev.apply(&mut r, 2).is_err());
        // The control: the same counter under the subject's own name is its word, accepted.
        let own: BTreeMap<String, u64> = [("torch.launch.gemm_bf16".to_string(), 3)].into();
        let mut r = Record { engaged: own.clone(), ..Record::default() };
        BackendEvidence::default().apply(&mut r, 2).unwrap();
        assert_eq!(r.census.counts(), &own);
    }
}
