//! Where two records first differ (identity gates): the first layer × seam × step digest that
//! differs, the element a capture re-run localises, the rank from per-rank digest shares, and
//! the lane of a multi-lane pass that holds it (docs/DESIGN.md §4.2, §3.6).

use memra_kernels::grid::ulp_distance;
use memra_receipts::schema::{LaneAxis, LaneEvidence};
use memra_runtime::record::{Capture, CaptureKey, Record, Seam};
use memra_runtime::PassShape;
use std::collections::BTreeMap;

/// Where two records first differ, as precisely as the evidence allows: always prompt, step,
/// layer and seam (from the digests, or the copy checks); the rank whose part differed; the
/// element when a capture re-run reproduced the difference.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstDivergence {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    pub seam: Seam,
    /// Set when the difference is a cross-rank copy of the seam's tensor whose destination
    /// differs from its source: the copy's source rank (`rank` is its destination).
    pub copy_from: Option<usize>,
    /// The rank whose part differed, when the evidence names one.
    pub rank: Option<usize>,
    /// Whether the difference was reproduced: for a seam, by a re-run with a full capture of it;
    /// for a cross-rank copy (located at the copy already), by the configuration's other run
    /// showing the same fault — a deterministic transport fault, not a race.
    pub reproduced: bool,
    /// Filled in by [`localise`] from full captures (only when reproduced).
    pub element: Option<Element>,
    /// In a run of several rows or columns per pass: the pass and the row or column that computed
    /// the divergent step ([`name_lane`], from `Record::lanes`).
    pub lane: Option<LaneEvidence>,
}

/// The first differing element of a seam tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Element {
    pub index: u64,
    pub rank: Option<usize>,
    pub oracle_bits: u32,
    pub observed_bits: u32,
    pub ulp: u64,
}

impl FirstDivergence {
    /// A difference at a seam, not yet located further.
    pub fn at_seam(prompt: usize, step: usize, layer: usize, seam: Seam) -> FirstDivergence {
        FirstDivergence {
            prompt,
            step,
            layer,
            seam,
            copy_from: None,
            rank: None,
            reproduced: false,
            element: None,
            lane: None,
        }
    }

    /// One line: `L0.o_join p0 s1 [17] r1 0x… → 0x… (1 ulp)`, `L0.attn_norm p0 s0 copy r0→r1`, or
    /// `L1.o_join p0 s2 r1 (not reproduced …)`; a multi-lane run's place names its lane:
    /// `L0.o_join p3 s1 (row 2 of pass 5) …`.
    pub fn describe(&self) -> String {
        let mut s = format!("L{}.{} p{} s{}", self.layer, self.seam.name(), self.prompt, self.step);
        if let Some(l) = self.lane {
            s += &format!(" ({})", l.describe());
        }
        let rank = |r: Option<usize>| r.map(|r| format!("r{r}")).unwrap_or_else(|| "r?".into());
        if let Some(src) = self.copy_from {
            let how = if self.reproduced {
                "in both runs: a deterministic transport fault"
            } else {
                "in one run only: a race is likely"
            };
            return s + &format!(" copy r{src}→{} ({how})", rank(self.rank));
        }
        match self.element {
            Some(e) => {
                let r = e.rank.or(self.rank).map(|r| format!(" r{r}")).unwrap_or_default();
                s += &format!(" [{}]{r} 0x{:08x}→0x{:08x} ({} ulp)", e.index, e.oracle_bits, e.observed_bits, e.ulp);
            }
            None => {
                if self.rank.is_some() {
                    s += &format!(" {}", rank(self.rank));
                }
                s += " (not reproduced by the capture re-run: a race is likely)";
            }
        }
        s
    }

    pub fn key(&self) -> CaptureKey {
        CaptureKey { prompt: self.prompt, step: self.step, layer: self.layer, seam: self.seam }
    }
}

/// Name the lane of `d` in `run`, a run of `pass`'s shape: the row (batch) or column that computed
/// its (prompt, step), from `Record::lanes`. Nothing for single-token runs (or a record that does
/// not say, e.g. an external subject's).
pub fn name_lane(d: &mut FirstDivergence, run: &Record, pass: PassShape) {
    let axis = match (pass.batch > 1, pass.columns > 1) {
        (true, _) => LaneAxis::Row,
        (false, true) => LaneAxis::Column,
        (false, false) => return,
    };
    d.lane = run.lanes.get(d.prompt).and_then(|steps| steps.get(d.step)).map(|&(pass, lane)| LaneEvidence {
        axis,
        index: lane as usize,
        pass: u64::from(pass),
    });
}

/// Whether a run of `pass`'s shape really ran several lanes in one pass (docs/DESIGN.md §3.6), from
/// `Record::lanes`: `Ok` with how many passes held several of the record's steps and the widest,
/// `Err` when none did — a multi-lane configuration that decoded one token per pass would pass
/// identity vacuously. `Ok` with nothing to say for a single-token run.
pub fn lanes_used(run: &Record, pass: PassShape) -> Result<String, String> {
    if pass.lanes() == 1 {
        return Ok(String::new());
    }
    let mut per_pass: BTreeMap<u32, usize> = BTreeMap::new();
    for &(p, _) in run.lanes.iter().flatten() {
        *per_pass.entry(p).or_default() += 1;
    }
    let multi = per_pass.values().filter(|n| **n > 1).count();
    let widest = per_pass.values().copied().max().unwrap_or(0);
    let what = if pass.batch > 1 { "rows" } else { "columns" };
    if multi == 0 {
        return Err(format!(
            "{}: no pass computed more than one step ({} passes named in the record): the run did not exercise {what}",
            pass.label(),
            per_pass.len()
        ));
    }
    Ok(format!("{}: {multi} of {} passes computed several {what} (up to {widest})", pass.label(), per_pass.len()))
}

/// Identity: every layer × seam × step digest equal. Structural differences (prompt or step
/// counts) are failures too, reported at the first missing position.
pub fn first_digest_divergence(oracle: &Record, run: &Record) -> Result<Option<FirstDivergence>, String> {
    if oracle.n_layers != run.n_layers {
        return Err(format!("the run has {} layers, the oracle {}", run.n_layers, oracle.n_layers));
    }
    if oracle.digests.len() != run.digests.len() {
        return Err(format!("the run decoded {} prompts, the oracle {}", run.digests.len(), oracle.digests.len()));
    }
    for (prompt, (po, pr)) in oracle.digests.iter().zip(&run.digests).enumerate() {
        if po.len() != pr.len() {
            return Err(format!("prompt {prompt}: the run has {} steps, the oracle {}", pr.len(), po.len()));
        }
        for (step, (so, sr)) in po.iter().zip(pr).enumerate() {
            if so.len() != sr.len() {
                return Err(format!("prompt {prompt} step {step}: {} seams vs {}", sr.len(), so.len()));
            }
            if let Some(idx) = so.iter().zip(sr).position(|(a, b)| a != b) {
                let (layer, seam) = Record::seam_at(oracle.n_layers, idx);
                return Ok(Some(FirstDivergence::at_seam(prompt, step, layer, seam)));
            }
        }
    }
    Ok(None)
}

/// The first differing element of two captures of the same seam.
pub fn localise(oracle: &Capture, run: &Capture) -> Option<Element> {
    let n = oracle.bits.len().max(run.bits.len());
    (0..n).find_map(|i| {
        let (a, b) = (oracle.bits.get(i).copied(), run.bits.get(i).copied());
        if a == b {
            return None;
        }
        let (a, b) = (a.unwrap_or(0), b.unwrap_or(0));
        Some(Element {
            index: i as u64,
            rank: run.owner_of(i),
            oracle_bits: a,
            observed_bits: b,
            ulp: ulp_distance(a, b),
        })
    })
}

/// The first difference between a reference and a run in program order: the first seam digest
/// that differs, or the first cross-rank copy of the run whose destination differed from its
/// source — a copy follows the seam whose tensor it moves, so a broken broadcast is named at
/// the copy, before the seam that consumes it.
pub fn first_difference(reference: &Record, run: &Record) -> Result<Option<FirstDivergence>, String> {
    let seam = first_digest_divergence(reference, run)?;
    let copy =
        run.copy_faults.iter().min_by_key(|c| (c.prompt, c.step, Record::seam_index(run.n_layers, c.layer, c.seam)));
    let order = |p: usize, s: usize, l: usize, seam: Seam| (p, s, Record::seam_index(run.n_layers, l, seam));
    Ok(match (seam, copy) {
        (Some(d), Some(c)) if order(c.prompt, c.step, c.layer, c.seam) >= order(d.prompt, d.step, d.layer, d.seam) => {
            Some(d)
        }
        (_, Some(c)) => Some(FirstDivergence {
            copy_from: Some(c.src_rank),
            rank: Some(c.dst_rank),
            ..FirstDivergence::at_seam(c.prompt, c.step, c.layer, c.seam)
        }),
        (d, None) => d,
    })
}

/// The ranks whose share of seam `key`'s digest in `run` differs from the reference's values over
/// the same element ranges: `reference` is the reference's full capture of the seam, `owners` the
/// (rank, first element, count) ranges each rank of the run digests (from a capture of the run's
/// layout). Locates the rank of a divergence whether or not a re-run reproduces its values.
pub fn ranks_differing(
    run: &Record,
    key: CaptureKey,
    reference: &Capture,
    owners: &[(usize, usize, usize)],
) -> Vec<usize> {
    let Some(shares) = run.rank_digests.get(key.prompt).and_then(|p| p.get(key.step)) else { return Vec::new() };
    let Some(shares) = shares.get(Record::seam_index(run.n_layers, key.layer, key.seam)) else { return Vec::new() };
    let mut want = vec![0u64; shares.len()];
    for &(rank, start, len) in owners {
        let Some(bits) = reference.bits.get(start..start + len) else { continue };
        if let Some(w) = want.get_mut(rank) {
            *w = w.wrapping_add(memra_kernels::twins::digest::digest_u32(bits, start as u64));
        }
    }
    (0..shares.len()).filter(|&r| shares[r] != want[r]).collect()
}

/// Whether `other` (the same configuration's other run) has the cross-rank copy fault `d` names:
/// then the fault is deterministic, not a race.
pub fn copy_fault_in(d: &FirstDivergence, other: &Record) -> bool {
    other.copy_faults.iter().any(|c| {
        (c.prompt, c.step, c.layer, c.seam, Some(c.src_rank), Some(c.dst_rank))
            == (d.prompt, d.step, d.layer, d.seam, d.copy_from, d.rank)
    })
}
