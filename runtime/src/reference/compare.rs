//! The comparison of a record with the f64 reference: per seam the normwise relative error
//! against [`REFERENCE_REL_BOUND`](super::REFERENCE_REL_BOUND), the router ids, and the token tape
//! outside near-ties.
//!
//! # The metric and the bound
//! Per seam tensor, the normwise relative error `max_i |got_i − ref_i| / max_i |ref_i|` (a NaN
//! anywhere, or a nonzero error against an all-zero reference, is infinite). The router seam
//! compares its ids exactly and its weights by the same metric. A seam passes when its worst
//! tensor is within [`REFERENCE_REL_BOUND`]. The token tape passes when every generated token
//! equals the reference argmax wherever the reference's top-two margin, relative to its largest
//! `|logit|`, exceeds the bound; closer margins are near-ties, listed and not judged.

use super::step::{ReferenceRun, RouterEvent};
use crate::evidence::record::{CaptureKey, Record, Seam};
use std::collections::BTreeMap;
use std::fmt;

/// The worst normwise relative error of one seam over every compared tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct SeamError {
    pub seam: Seam,
    /// Tensors compared (all layers, steps and prompts).
    pub tensors: usize,
    /// `max` over tensors of `max_i |got_i − ref_i| / max_i |ref_i|` (router: weights only).
    pub max_rel: f64,
    /// The tensor holding the worst error and the element where its largest difference is.
    pub worst: Option<(CaptureKey, usize)>,
    /// The first tensor over the bound in (prompt, step, layer) order, the element of its
    /// largest difference and its error: where a failure of this seam is named.
    pub first_over: Option<(CaptureKey, usize, f64)>,
}

/// One generated token compared with the reference argmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TapeEntry {
    pub prompt: usize,
    /// Index among the prompt's generated tokens.
    pub index: usize,
    pub got: u32,
    pub reference: u32,
    /// The reference's `(top1 − top2) / max |logit|`.
    pub margin_rel: f64,
}

/// What [`compare`] found. [`ComparisonReport::passed`] is the verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct ComparisonReport {
    pub bound: f64,
    /// Per seam that had captures, in program order (layer seams, then head seams).
    pub seams: Vec<SeamError>,
    /// The worst seam: (seam, its error).
    pub worst: Option<(Seam, f64)>,
    /// Router seams whose ids differ from the reference's: (key, program ids, reference ids).
    pub router_id_mismatches: Vec<(CaptureKey, Vec<u32>, Vec<u32>)>,
    /// Router near-ties the reference resolved by adopting the program's ids.
    pub router_near_ties: Vec<RouterEvent>,
    /// Router decisions that differ by more than the bound.
    pub router_disagreements: Vec<RouterEvent>,
    /// Generated tokens compared on the tape.
    pub tape_compared: usize,
    /// Tokens that differ from the reference argmax where the margin exceeds the bound.
    pub tape_mismatches: Vec<TapeEntry>,
    /// Tokens whose reference margin is within the bound (agreeing or not; not judged).
    pub tape_near_ties: Vec<TapeEntry>,
    /// Anything that could not be compared (a capture the reference lacks, a length mismatch, a
    /// tape that is not the one the reference was forced with), one line each.
    pub problems: Vec<String>,
}

impl ComparisonReport {
    /// PASS: something was compared, every seam within the bound (NaN never passes), router
    /// ids equal, no router disagreement, the tape agrees outside near-ties, no problems.
    pub fn passed(&self) -> bool {
        let compared: usize = self.seams.iter().map(|s| s.tensors).sum();
        compared > 0
            && self.tape_compared > 0
            && self.seams.iter().all(|s| s.max_rel <= self.bound)
            && self.router_id_mismatches.is_empty()
            && self.router_disagreements.is_empty()
            && self.tape_mismatches.is_empty()
            && self.problems.is_empty()
    }
}

impl fmt::Display for ComparisonReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "reference comparison (bound {:e}): {}", self.bound, if self.passed() { "PASS" } else { "FAIL" })?;
        writeln!(f, "{:<11} {:>8} {:>12}  worst at", "seam", "tensors", "max rel err")?;
        for s in &self.seams {
            let at = s.worst.map_or(String::from("-"), |(k, i)| {
                format!("prompt {} step {} layer {} element {i}", k.prompt, k.step, k.layer)
            });
            writeln!(f, "{:<11} {:>8} {:>12.3e}  {at}", s.seam.name(), s.tensors, s.max_rel)?;
        }
        if let Some((seam, e)) = self.worst {
            writeln!(f, "worst seam: {} at {e:.3e}", seam.name())?;
        }
        writeln!(
            f,
            "token tape: {} compared, {} mismatches, {} near-ties",
            self.tape_compared,
            self.tape_mismatches.len(),
            self.tape_near_ties.len()
        )?;
        for t in self.tape_mismatches.iter().chain(&self.tape_near_ties) {
            writeln!(
                f,
                "  prompt {} token {}: program {} reference {} (margin {:.3e})",
                t.prompt, t.index, t.got, t.reference, t.margin_rel
            )?;
        }
        for e in self.router_near_ties.iter().chain(&self.router_disagreements) {
            writeln!(
                f,
                "  router {} prompt {} step {} layer {}: reference {:?} program {:?} (gap {:.3e})",
                if e.adopted { "near-tie" } else { "DISAGREEMENT" },
                e.key.prompt,
                e.key.step,
                e.key.layer,
                e.reference,
                e.canonical,
                e.gap_rel
            )?;
        }
        for (k, got, r) in &self.router_id_mismatches {
            writeln!(f, "  router ids differ at {k:?}: program {got:?} reference {r:?}")?;
        }
        for p in &self.problems {
            writeln!(f, "  problem: {p}")?;
        }
        Ok(())
    }
}

/// Normwise relative error `max_i |got_i − ref_i| / max_i |ref_i|` and the index of the largest
/// difference; NaN anywhere → infinite; an all-zero reference gives 0 only if `got` is all zero.
fn normwise(got: impl Iterator<Item = f64>, reference: &[f64]) -> (f64, usize) {
    let mut max_diff = 0.0f64;
    let mut at = 0;
    for (i, (g, r)) in got.zip(reference).enumerate() {
        let d = (g - r).abs();
        if d.is_nan() {
            return (f64::INFINITY, i);
        }
        if d > max_diff {
            max_diff = d;
            at = i;
        }
    }
    let scale = reference.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    let rel = if max_diff == 0.0 { 0.0 } else { max_diff / scale };
    (if rel.is_nan() { f64::INFINITY } else { rel }, at)
}

/// Compare every captured seam tensor of `record` and its token tape with the reference (see
/// the module docs for the metric). `bound` is normally [`REFERENCE_REL_BOUND`](crate::reference::REFERENCE_REL_BOUND).
pub fn compare(reference: &ReferenceRun, record: &Record, bound: f64) -> ComparisonReport {
    let mut stats: BTreeMap<(bool, usize), SeamError> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut router_id_mismatches = Vec::new();
    let k = reference.top_k;
    for (key, cap) in &record.captures {
        let Some(r) = reference.tensors.get(key) else {
            problems.push(format!("capture {key:?} has no reference tensor (another battery or model?)"));
            continue;
        };
        if cap.bits.len() != r.len() {
            problems.push(format!(
                "{} at {key:?}: the program's tensor has {} elements, the reference's {}",
                key.seam.name(),
                cap.bits.len(),
                r.len()
            ));
            continue;
        }
        let (rel, at) = if key.seam == Seam::Router {
            let got: Vec<u32> = cap.bits[..k].to_vec();
            let want: Vec<u32> = r[..k].iter().map(|v| *v as u32).collect();
            if got != want {
                router_id_mismatches.push((*key, got, want));
            }
            let (rel, at) = normwise(cap.bits[k..].iter().map(|b| f32::from_bits(*b) as f64), &r[k..]);
            (rel, at + k)
        } else {
            normwise(cap.bits.iter().map(|b| f32::from_bits(*b) as f64), r)
        };
        let head = key.layer == reference.n_layers;
        let entry = stats.entry((head, key.seam.slot())).or_insert(SeamError {
            seam: key.seam,
            tensors: 0,
            max_rel: 0.0,
            worst: None,
            first_over: None,
        });
        entry.tensors += 1;
        if entry.first_over.is_none() && (rel.is_nan() || rel > bound) {
            entry.first_over = Some((*key, at, rel));
        }
        if entry.worst.is_none() || rel > entry.max_rel {
            entry.max_rel = rel;
            entry.worst = Some((*key, at));
        }
    }
    let seams: Vec<SeamError> = stats.into_values().collect();
    let worst = seams.iter().map(|s| (s.seam, s.max_rel)).fold(None, |acc: Option<(Seam, f64)>, s| match acc {
        Some(a) if a.1 >= s.1 => Some(a),
        _ => Some(s),
    });

    // Token tape.
    let mut tape_compared = 0;
    let mut tape_mismatches = Vec::new();
    let mut tape_near_ties = Vec::new();
    if record.tokens.len() != reference.tokens.len() {
        problems.push(format!(
            "the record has {} prompts on its tape, the reference {}",
            record.tokens.len(),
            reference.tokens.len()
        ));
    }
    for (p, (got, want)) in record.tokens.iter().zip(&reference.tokens).enumerate() {
        let fed = &reference.forced[p];
        if got.len() != want.len() || got[..fed.len().min(got.len())] != fed[..] {
            problems.push(format!(
                "prompt {p}: the record's tape {got:?} is not the tape the reference was forced with ({fed:?} then one more)"
            ));
            continue;
        }
        for (j, (g, w)) in got.iter().zip(want).enumerate() {
            tape_compared += 1;
            let entry = TapeEntry { prompt: p, index: j, got: *g, reference: w.argmax, margin_rel: w.margin_rel };
            if w.margin_rel > bound {
                if *g != w.argmax {
                    tape_mismatches.push(entry);
                }
            } else {
                tape_near_ties.push(entry);
            }
        }
    }

    let (router_near_ties, router_disagreements) =
        reference.router_events.iter().cloned().partition(|e: &RouterEvent| e.adopted && e.gap_rel <= bound);
    ComparisonReport {
        bound,
        seams,
        worst,
        router_id_mismatches,
        router_near_ties,
        router_disagreements,
        tape_compared,
        tape_mismatches,
        tape_near_ties,
        problems,
    }
}
