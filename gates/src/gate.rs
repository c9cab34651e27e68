//! The gates of docs/DESIGN.md §4.2, as pure functions over records (and, for engagement, the
//! census of the same configuration with each door off).
//!
//! Gates see only [`Record`]s — digests, captures, tokens, engagement counters — never runtime
//! internals, so a tape written by an external engine can be gated the same way (docs/DESIGN.md §10).

use crate::job::CensusDecl;
use memra_kernels::grid::ulp_distance;
use memra_receipts::schema::{LaneAxis, LaneEvidence};
use memra_runtime::evidence::coverage::Coverage;
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

/// What one gate concluded, with the detail a receipt shows either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass(String),
    Fail(String),
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Pass(_))
    }

    pub fn detail(&self) -> &str {
        match self {
            Outcome::Pass(d) | Outcome::Fail(d) => d,
        }
    }

    /// Pass with `pass`'s detail when `check` holds its ground (`Ok`), else fail with the reason.
    pub fn of(check: Result<String, String>) -> Outcome {
        match check {
            Ok(d) => Outcome::Pass(d),
            Err(d) => Outcome::Fail(d),
        }
    }
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

/// Copies: every cross-rank copy's destination equalled its source.
pub fn copies(run: &Record) -> Outcome {
    match run.copy_faults.first() {
        None if run.copies_verified == 0 => Outcome::Fail(
            "no cross-rank copy was verified at its destination: ranks exchanged data unchecked".to_string(),
        ),
        None => Outcome::Pass(format!("{} cross-rank copies verified at their destination", run.copies_verified)),
        Some(c) => Outcome::Fail(format!(
            "{} of {} cross-rank copies arrived different from their source; first: L{}.{} p{} s{} rank {} → rank {}",
            run.copy_faults.len(),
            run.copies_verified,
            c.layer,
            c.seam.name(),
            c.prompt,
            c.step,
            c.src_rank,
            c.dst_rank
        )),
    }
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

/// Determinism of the evidence itself: the canonical evidence of the two runs (digests, tokens,
/// top-two logits, census, coverage, call-site counters, copy checks; `crate::record_evidence`),
/// compared byte for byte, section by section.
pub fn determinism(first: &[(&'static str, String)], second: &[(&'static str, String)]) -> Outcome {
    let names: Vec<&str> = first.iter().map(|s| s.0).collect();
    for ((name, a), (name_b, b)) in first.iter().zip(second) {
        if name != name_b {
            return Outcome::Fail(format!("the two runs' evidence has different sections ({name} vs {name_b})"));
        }
        if a != b {
            let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            return Outcome::Fail(format!(
                "two runs of the same configuration wrote different evidence: `{name}` differs first at byte {at}"
            ));
        }
    }
    if first.len() != second.len() {
        return Outcome::Fail("the two runs' evidence has a different number of sections".into());
    }
    let bytes: usize = first.iter().map(|s| s.1.len()).sum();
    Outcome::Pass(format!("two runs wrote byte-identical evidence ({bytes} bytes: {})", names.join(", ")))
}

/// Non-triviality: the run must produce varied, non-degenerate output (a run that writes zeros
/// can match a broken oracle "exactly").
pub fn non_triviality(run: &Record) -> Outcome {
    Outcome::of(non_triviality_check(run))
}

fn non_triviality_check(run: &Record) -> Result<String, String> {
    let tokens: Vec<u32> = run.tokens.iter().flatten().copied().collect();
    if tokens.is_empty() {
        return Err("no token was generated".into());
    }
    // A one-token tape cannot vary; the residual and logits checks below still apply.
    if tokens.len() > 1 && tokens.iter().all(|t| *t == tokens[0]) {
        return Err(format!("every generated token is {}", tokens[0]));
    }
    let steps: Vec<&(f32, f32)> = run.top2.iter().flatten().collect();
    if steps.iter().all(|(a, b)| a == b) {
        return Err("the top-two logits are equal at every step (constant logits)".into());
    }
    if let Some((a, _)) = steps.iter().find(|(a, _)| !a.is_finite()) {
        return Err(format!("a top logit is not finite ({a})"));
    }
    // Per prompt: each step feeds another token at another position, so no seam of the step's
    // end (the last residual, the logits) may repeat one value over a whole prompt — a subject
    // that writes step 0's values again at every step fails here, named by its prompt.
    let residual_last = Record::seam_index(run.n_layers, run.n_layers.saturating_sub(1), Seam::Residual);
    let logits = Record::seam_index(run.n_layers, run.n_layers, Seam::Logits);
    for (p, prompt) in run.digests.iter().enumerate() {
        for (idx, what) in [(residual_last, "the last layer's residual"), (logits, "the logits")] {
            let rows: Vec<u64> = prompt.iter().filter_map(|r| r.get(idx).copied()).collect();
            if rows.len() > 1 && rows.iter().all(|d| *d == rows[0]) {
                return Err(format!("prompt {p}: {what} is identical at all {} steps", rows.len()));
            }
        }
        let top2 = run.top2.get(p).map(Vec::as_slice).unwrap_or_default();
        if top2.len() > 1
            && top2.iter().all(|t| t.0.to_bits() == top2[0].0.to_bits() && t.1.to_bits() == top2[0].1.to_bits())
        {
            return Err(format!("prompt {p}: the top-two logits are the same at all {} generating steps", top2.len()));
        }
    }
    Ok(format!("{} tokens, {} distinct; every prompt's steps differ", tokens.len(), distinct(&tokens)))
}

fn distinct(t: &[u32]) -> usize {
    let mut v = t.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// A door's census declaration and the census of its configuration with the door off (or why that
/// run failed).
pub type CensusBaseline<'a> = (&'a CensusDecl, Result<BTreeMap<String, u64>, String>);

/// Engagement, witnessed by the backend: for every enabled door, each census change it declares
/// holds between the census of the same configuration with the door off (`off`, or why that
/// run failed) and this run's census. Call-site counters are not consulted.
pub fn engagement(run: &BTreeMap<String, u64>, doors: &[CensusBaseline]) -> Outcome {
    let mut held = Vec::new();
    let mut missing = Vec::new();
    for (decl, off) in doors {
        match off {
            Err(e) => missing.push(format!("{} (its census baseline could not run: {e})", decl.door)),
            Ok(off) => {
                let mut checks: Vec<Result<String, String>> = decl.changes.iter().map(|c| c.check(off, run)).collect();
                checks.extend(host_round_trip(decl, off, run).map(Err));
                checks.extend(outside_witness(off, run));
                let failed: Vec<&String> = checks.iter().filter_map(|c| c.as_ref().err()).collect();
                if failed.is_empty() {
                    held.push(format!(
                        "{}: {}",
                        decl.door,
                        checks.iter().flatten().cloned().collect::<Vec<_>>().join(", ")
                    ));
                } else {
                    let f: Vec<&str> = failed.iter().map(|s| s.as_str()).collect();
                    missing.push(format!("{} (census against the door off: {})", decl.door, f.join(", ")));
                }
            }
        }
    }
    if missing.is_empty() {
        Outcome::Pass(if held.is_empty() { "no door enabled".to_string() } else { held.join("; ") })
    } else {
        Outcome::Fail(format!("enabled but not witnessed by the backend: {}", missing.join("; ")))
    }
}

/// Where an outside witness counted the run (`outside.processes` in its census: a CUDA start of
/// an external subject, `subject::protocol::witness`), the door must change what it saw — some
/// kernel launched or some copy issued, by name and count — against the same configuration with
/// the door off. A door that only writes its own counter leaves the witness's counts unchanged:
/// its engagement rests on the subject's word alone. `None` when no witness counted the run.
fn outside_witness(off: &BTreeMap<String, u64>, on: &BTreeMap<String, u64>) -> Option<Result<String, String>> {
    use memra_witness::format::{PREFIX, PROCESSES};
    let seen = *on.get(PROCESSES)?;
    if seen == 0 {
        return Some(Err("the outside witness saw no CUDA work in this run".into()));
    }
    if !off.contains_key(PROCESSES) {
        return Some(Err("the run without the door has no outside count to compare with".into()));
    }
    let outside = |c: &BTreeMap<String, u64>| {
        c.iter()
            .filter(|(k, _)| k.starts_with(PREFIX) && k.as_str() != PROCESSES)
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    let (a, b): (BTreeMap<String, u64>, BTreeMap<String, u64>) = (outside(off), outside(on));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    // What appeared first (the door's own work), then what vanished or changed count.
    let mut moved: Vec<(bool, String)> = keys
        .into_iter()
        .filter_map(|k| {
            let (x, y) = (a.get(k).copied().unwrap_or(0), b.get(k).copied().unwrap_or(0));
            (x != y).then(|| (x != 0, format!("{} {x} → {y}", clip_name(&k[PREFIX.len()..]))))
        })
        .collect();
    moved.sort_by_key(|(was_there, _)| *was_there);
    let moved: Vec<String> = moved.into_iter().map(|(_, m)| m).collect();
    Some(if moved.is_empty() {
        let launches: u64 = b.iter().filter(|(k, _)| k.starts_with("outside.launch.")).map(|(_, v)| v).sum();
        Err(format!(
            "the outside witness counted the same work with the door on as off ({launches} kernel launches, {} kinds \
             of kernel and call): only the subject's own counters say it engaged",
            b.len()
        ))
    } else {
        let shown = moved.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
        let more = if moved.len() > 3 { format!(" and {} more", moved.len() - 3) } else { String::new() };
        Ok(format!("outside witness: {shown}{more}"))
    })
}

/// A kernel's name as a detail shows it: at most 64 characters.
fn clip_name(name: &str) -> String {
    if name.chars().count() <= 64 {
        name.to_string()
    } else {
        name.chars().take(63).collect::<String>() + "…"
    }
}

/// The census families of a host round trip: a read from one rank's memory, a write into another's.
const ROUND_TRIP: [&str; 2] = ["read.", "write."];

/// A door whose run issues more host reads *and* more host writes than the same configuration
/// with it off, and declares neither family: the signature of a mechanism replaced by a host
/// round trip (read the bytes out of one rank, write them into another), which can satisfy a
/// declared `fewer` (the copies it replaced are gone) while the device does none of the work.
/// Reads alone grow legitimately (MOE_DIRECT reads the route on expert-parallel owners); no door
/// writes more from the host.
fn host_round_trip(decl: &CensusDecl, off: &BTreeMap<String, u64>, on: &BTreeMap<String, u64>) -> Option<String> {
    let declared =
        |family: &str| decl.changes.iter().any(|c| c.counter.split('+').any(|t| t.trim().starts_with(family)));
    if ROUND_TRIP.iter().any(|f| declared(f)) {
        return None;
    }
    let sum =
        |c: &BTreeMap<String, u64>, f: &str| c.iter().filter(|(k, _)| k.starts_with(f)).map(|(_, v)| *v).sum::<u64>();
    let moves: Vec<(u64, u64)> = ROUND_TRIP.iter().map(|f| (sum(off, f), sum(on, f))).collect();
    moves.iter().all(|(a, b)| b > a).then(|| {
        format!(
            "a host round trip: read.* {} → {} and write.* {} → {} with the door on, which it does not declare \
             (its mechanism read and wrote through the host)",
            moves[0].0, moves[0].1, moves[1].0, moves[1].1
        )
    })
}

/// Coverage: every path the model claims was reached — in the oracle's coverage of the model and
/// battery, and (where the run's backend counts coverage, and the run is held to identity) in
/// the run's own.
pub fn coverage(claims: &[&str], oracle: Option<&Coverage>, own: Option<&Coverage>) -> Outcome {
    if claims.is_empty() {
        return Outcome::Pass("the model claims no special path".into());
    }
    let Some(oracle) = oracle else {
        return Outcome::Fail("the oracle counted no coverage, so no claim can be checked".into());
    };
    let count = |c: &Coverage, p: &str| c.get(p).map_or(0, |x| x.count);
    let mut missing: Vec<String> =
        claims.iter().filter(|p| count(oracle, p) == 0).map(|p| format!("{p} (oracle)")).collect();
    if let Some(own) = own {
        missing.extend(claims.iter().filter(|p| count(own, p) == 0).map(|p| format!("{p} (this run)")));
    }
    if missing.is_empty() {
        let counts: Vec<String> = claims.iter().map(|p| format!("{p} {}", count(oracle, p))).collect();
        Outcome::Pass(format!("every claimed path reached: {}", counts.join(", ")))
    } else {
        Outcome::Fail(format!("claimed but never reached: {}", missing.join(", ")))
    }
}

/// A step whose oracle top-two margin lies within the budget: reported, never hidden.
#[derive(Debug, Clone, PartialEq)]
pub struct NearTie {
    pub prompt: usize,
    pub token_index: usize,
    pub margin: f32,
    pub oracle_token: u32,
    pub run_token: u32,
}

/// Argmax tape under teacher forcing: every token equals the oracle's except at near-ties.
///
/// A step is a near-tie when the oracle's top-1 − top-2 logit margin is at or below what the
/// door's declared budget allows to move: `max(margin_budget, 2 · rel_budget · |top-1 logit|)`
/// — each of the two logits may move by the declared relative error of the logits (normwise,
/// so relative to the largest logit), hence twice. Near-ties are reported, never hidden.
pub fn argmax_tape(oracle: &Record, run: &Record, margin_budget: f32, rel_budget: f64) -> (Outcome, Vec<NearTie>) {
    let mut ties = Vec::new();
    let mut flips = Vec::new();
    for (p, (to, tr)) in oracle.tokens.iter().zip(&run.tokens).enumerate() {
        for (i, (a, b)) in to.iter().zip(tr).enumerate() {
            let (t1, t2) = oracle.top2[p][i];
            let margin = t1 - t2;
            let allowed = margin_budget.max((2.0 * rel_budget) as f32 * t1.abs());
            if margin <= allowed {
                ties.push(NearTie { prompt: p, token_index: i, margin, oracle_token: *a, run_token: *b });
            } else if a != b {
                flips.push(format!("prompt {p} token {i}: oracle {a}, run {b} (margin {margin})"));
            }
        }
    }
    if oracle.tokens.len() != run.tokens.len() || oracle.tokens.iter().zip(&run.tokens).any(|(a, b)| a.len() != b.len())
    {
        return (Outcome::Fail("the run's token tape has a different shape from the oracle's".into()), ties);
    }
    let compared: usize = oracle.tokens.iter().map(Vec::len).sum();
    let outcome = if compared == 0 {
        Outcome::Fail("no generated token was compared".to_string())
    } else if flips.is_empty() {
        Outcome::Pass(format!("tape equal outside {} near-tie(s) of {compared} tokens", ties.len()))
    } else {
        Outcome::Fail(format!("{} argmax flip(s) outside near-ties; first: {}", flips.len(), flips[0]))
    };
    (outcome, ties)
}

/// Per layer × seam error of a run against the oracle, from full captures.
#[derive(Debug, Clone, PartialEq)]
pub struct SeamError {
    pub layer: usize,
    pub seam: Seam,
    pub max_ulp: u64,
    /// Normwise: max |run − oracle| / max |oracle| over the seam tensor, max over steps; NaN
    /// when a compared element is not finite on one side and differs ([`SeamError::non_finite`]).
    pub max_rel: f64,
    /// The first compared element (in prompt, step, index order) whose bits differ and of which
    /// one side is NaN or ±inf: an error no relative bound can hold.
    pub non_finite: Option<NonFinite>,
}

/// An element of a seam tensor that is NaN or ±inf in the run or the oracle (and not the same bits
/// in both).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    pub prompt: usize,
    pub step: usize,
    pub index: usize,
    pub oracle_bits: u32,
    pub run_bits: u32,
}

impl SeamError {
    /// `L1.logits p0 s2 [17]: the run has NaN (0x7fc00000) where the oracle has 0.25`, for the
    /// first non-finite element of this seam.
    pub fn describe_non_finite(&self) -> Option<String> {
        let n = self.non_finite?;
        let show = |b: u32| {
            let v = f32::from_bits(b);
            if v.is_finite() {
                format!("{v:e}")
            } else {
                format!("{v} (0x{b:08x})")
            }
        };
        Some(format!(
            "L{}.{} p{} s{} [{}]: the run has {} where the oracle has {}",
            self.layer,
            self.seam.name(),
            n.prompt,
            n.step,
            n.index,
            show(n.run_bits),
            show(n.oracle_bits)
        ))
    }
}

/// The worst relative error of `errors`, NaN when any is NaN (`f64::max` would drop it).
pub fn worst_rel(errors: &[SeamError]) -> f64 {
    errors.iter().map(|e| e.max_rel).fold(0.0f64, |a, b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
}

/// Error budget over every captured seam present in both records. Router ids are compared as
/// ids: any difference is a routing flip, and from the flip on, that step compares different
/// experts — the flipped layer's expert, join and residual seams, every seam of the layers after
/// it and the head (final norm, logits) of that step are left out of the relative error (a
/// flip in the last layer once read as a 19 % error at its residual and logits, on `step` with
/// W8, while every other seam stayed under 2 %). Seams before the flip, and every other step,
/// are compared; the argmax tape gate holds the flip itself to a near tie.
pub fn error_budget(oracle: &Record, run: &Record) -> (Vec<SeamError>, usize) {
    let mut acc: BTreeMap<(usize, Seam), (u64, f64, Option<NonFinite>)> = BTreeMap::new();
    // (prompt, step) → the first layer whose routing flipped.
    let mut first_flip: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut flips = 0;
    for (key, co) in &oracle.captures {
        if key.seam == Seam::Router {
            if let Some(cr) = run.captures.get(key) {
                let k = co.bits.len() / 2;
                if co.bits[..k] != cr.bits[..k] {
                    flips += 1;
                    let l = first_flip.entry((key.prompt, key.step)).or_insert(key.layer);
                    *l = (*l).min(key.layer);
                }
            }
        }
    }
    let after_flip = |key: &CaptureKey| {
        first_flip
            .get(&(key.prompt, key.step))
            .is_some_and(|&l| key.layer > l || (key.layer == l && key.seam > Seam::Router))
    };
    for (key, co) in &oracle.captures {
        let Some(cr) = run.captures.get(key) else { continue };
        if after_flip(key) {
            continue;
        }
        let skip = if key.seam == Seam::Router { co.bits.len() / 2 } else { 0 };
        let (mut max_ulp, mut max_abs, mut max_ref) = (0u64, 0f64, 0f64);
        let mut non_finite = None;
        for (i, (a, b)) in co.bits.iter().zip(&cr.bits).enumerate().skip(skip) {
            let (fa, fb) = (f32::from_bits(*a) as f64, f32::from_bits(*b) as f64);
            // `f64::max` drops NaN: a NaN or ±inf that differs from the oracle is recorded apart.
            if a != b && !(fa.is_finite() && fb.is_finite()) {
                non_finite.get_or_insert(NonFinite {
                    prompt: key.prompt,
                    step: key.step,
                    index: i,
                    oracle_bits: *a,
                    run_bits: *b,
                });
                continue;
            }
            max_ulp = max_ulp.max(ulp_distance(*a, *b));
            max_abs = max_abs.max((fa - fb).abs());
            max_ref = max_ref.max(fa.abs());
        }
        let rel = if non_finite.is_some() {
            f64::NAN
        } else if max_abs == 0.0 {
            0.0
        } else {
            max_abs / max_ref.max(f64::MIN_POSITIVE)
        };
        let e = acc.entry((key.layer, key.seam)).or_insert((0, 0.0, None));
        e.0 = e.0.max(max_ulp);
        e.1 = if rel.is_nan() || e.1.is_nan() { f64::NAN } else { e.1.max(rel) };
        // Captures iterate in key order (prompt, step, layer, seam): the first one found is first.
        e.2 = e.2.or(non_finite);
    }
    let errors = acc
        .into_iter()
        .map(|((layer, seam), (max_ulp, max_rel, non_finite))| SeamError { layer, seam, max_ulp, max_rel, non_finite })
        .collect();
    (errors, flips)
}

/// The error-budget gate of `run` against the oracle's full captures (`oracle`): a non-finite
/// value that differs from the oracle fails, named by seam, prompt, step and element; else the
/// worst normwise relative error must be within `rel_budget`. Also returns the per-seam errors.
pub fn error_budget_gate(oracle: &Record, run: &Record, rel_budget: f64) -> (Outcome, Vec<SeamError>) {
    let (errors, flips) = error_budget(oracle, run);
    let worst = worst_rel(&errors);
    let bitwise = errors.iter().all(|e| e.max_ulp == 0 && e.non_finite.is_none());
    let uncompared = uncompared_seams(oracle, &errors);
    // The first non-finite element in program order: (prompt, step, digest column).
    let non_finite = errors
        .iter()
        .filter_map(|e| {
            e.non_finite.map(|n| ((n.prompt, n.step, Record::seam_index(run.n_layers, e.layer, e.seam)), e))
        })
        .min_by_key(|(at, _)| *at);
    let outcome = if errors.is_empty() {
        Outcome::Fail("no seam was compared: the error-budget captures are missing".to_string())
    } else if let Some((_, e)) = non_finite {
        let seams = errors.iter().filter(|e| e.non_finite.is_some()).count();
        Outcome::Fail(format!(
            "a value that is not finite cannot be within a relative budget: {} ({seams} seam(s) hold NaN or ±inf)",
            e.describe_non_finite().unwrap_or_default()
        ))
    } else if worst.is_nan() || worst > rel_budget {
        Outcome::Fail(format!("max normwise relative error {worst:.3e} exceeds the budget {rel_budget:.1e}"))
    } else {
        Outcome::Pass(format!(
            "max normwise relative error {worst:.3e} within {rel_budget:.1e}; {flips} routing flip(s) excluded{}{}",
            match uncompared.first() {
                // Said, never hidden: a model built with router ties (`edge`) can flip at
                // every step, and then these seams were compared nowhere.
                Some((layer, seam)) => format!(
                    "; {} seam(s) never compared (flips at every step), first layer {layer} {}",
                    uncompared.len(),
                    seam.name()
                ),
                None => String::new(),
            },
            if bitwise { "; NOTE: bit-identical to the oracle — the NUMERIC class may be mislabeled" } else { "" }
        ))
    };
    (outcome, errors)
}

/// Two optional outcomes of one gate as one: a failure if either failed, else a pass with both
/// details; `None` when neither was evaluated.
pub fn both(a: Option<Outcome>, b: Option<Outcome>) -> Option<Outcome> {
    match (a, b) {
        (Some(a), Some(b)) => Some(match (a.passed(), b.passed()) {
            (true, true) => Outcome::Pass(format!("{}; {}", a.detail(), b.detail())),
            (false, false) => Outcome::Fail(format!("{}; {}", a.detail(), b.detail())),
            (false, true) => a,
            (true, false) => b,
        }),
        (a, b) => a.or(b),
    }
}

/// Whether `other` (the same configuration's other run) has the cross-rank copy fault `d` names:
/// then the fault is deterministic, not a race.
pub fn copy_fault_in(d: &FirstDivergence, other: &Record) -> bool {
    other.copy_faults.iter().any(|c| {
        (c.prompt, c.step, c.layer, c.seam, Some(c.src_rank), Some(c.dst_rank))
            == (d.prompt, d.step, d.layer, d.seam, d.copy_from, d.rank)
    })
}

/// The (layer, seam) pairs the oracle captured that `errors` never compared: routing flips
/// at every step can leave a seam out everywhere (the `edge` model's router ties under
/// DEV_ROUTER), and the gate's detail must say so rather than read as if it compared them.
pub fn uncompared_seams(oracle: &Record, errors: &[SeamError]) -> Vec<(usize, Seam)> {
    let compared: std::collections::BTreeSet<(usize, Seam)> = errors.iter().map(|e| (e.layer, e.seam)).collect();
    let captured: std::collections::BTreeSet<(usize, Seam)> =
        oracle.captures.keys().map(|k| (k.layer, k.seam)).collect();
    captured.difference(&compared).copied().collect()
}

/// Every seam key of prompt 0 (for error-budget captures).
pub fn all_keys_of_prompt(record_shape: &Record, prompt: usize) -> Vec<CaptureKey> {
    let steps = record_shape.digests.get(prompt).map(|d| d.len()).unwrap_or(0);
    let per = record_shape.seams_per_step();
    (0..steps)
        .flat_map(|step| {
            (0..per).map(move |i| {
                let (layer, seam) = Record::seam_at(record_shape.n_layers, i);
                CaptureKey { prompt, step, layer, seam }
            })
        })
        .collect()
}
