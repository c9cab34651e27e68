//! The gates of docs/DESIGN.md §4.2, as pure functions over records (and, for engagement, the
//! census of the same configuration with each door off).
//!
//! Gates see only [`Record`]s — digests, captures, tokens, engagement counters — never runtime
//! internals, so a tape written by an external engine can be gated the same way (docs/DESIGN.md §10).

mod divergence;
mod engagement;
mod numeric;

pub use divergence::{
    copy_fault_in, first_difference, first_digest_divergence, lanes_used, localise, name_lane, ranks_differing,
    Element, FirstDivergence,
};
pub use engagement::{engagement, CensusBaseline};
pub use numeric::{
    all_keys_of_prompt, argmax_tape, error_budget, error_budget_gate, uncompared_seams, worst_rel, NearTie, NonFinite,
    SeamError,
};

use memra_runtime::evidence::coverage::Coverage;
use memra_runtime::record::{Record, Seam};

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
