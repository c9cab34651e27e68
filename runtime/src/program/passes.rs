//! How the battery is cut into passes (docs/DESIGN.md §3.6), and one pass issued.
//!
//! - **Single-token decode** (1 × 1): prompt by prompt, step by step — one lane per pass.
//! - **Rows** (`batch` B): B lanes, each holding one session (prompt) at a time and advancing it
//!   one token per pass. Lane j takes its first session at pass j, so sessions sit at different
//!   positions (ragged); a lane whose session ends takes the next prompt (continuous batching).
//!   A finished lane below a busy one is padding: it computes and is discarded.
//! - **Columns** (`columns` T): one session at a time. Its prompt is prefilled T tokens per pass;
//!   then each pass verifies T tokens: the last accepted token and T − 1 drafts. Column t is
//!   accepted while every draft before it equals the token the previous column produced (the
//!   tape's token when the run is teacher-forced); rejected columns are discarded and computed
//!   again as column 0 of the next pass, whose KV entries overwrite theirs.
//!
//! Every accepted lane's seam digests, logits and token go to the record under its (prompt,
//! step), exactly where single-token decode puts them — so the gates compare a B-row or T-column
//! run with the single-token oracle seam by seam, and `Record::lanes` names the pass and lane.

use std::collections::VecDeque;

use super::copies::{self, LaneDigests};
use super::lanes::Lane;
use super::{embed_row, step_calls, top_two, Ctx, GraphMode, Timed, STEP_SEGMENT};
use crate::backend::Op;
use crate::error::RuntimeError;
use crate::Result;

/// One session's results as its steps are accepted.
#[derive(Debug, Default)]
struct Session {
    prompt: usize,
    /// The next step to compute.
    step: usize,
    generated: Vec<u32>,
    top2: Vec<(f32, f32)>,
    digests: Vec<Vec<u64>>,
    rank_digests: Vec<Vec<Vec<u64>>>,
    lanes: Vec<(u32, u8)>,
}

impl Session {
    fn new(prompt: usize) -> Session {
        Session { prompt, ..Session::default() }
    }
}

/// Decode the whole battery in passes of the run's shape; the record gets every prompt's rows
/// in prompt order.
pub(super) fn run_battery(ctx: &mut Ctx) -> Result<()> {
    let shape = ctx.cfg.pass;
    let done = if shape.columns > 1 { columns(ctx, shape.columns)? } else { rows(ctx, shape.batch)? };
    let multi = shape.lanes() > 1;
    for s in done {
        ctx.record.digests.push(s.digests);
        ctx.record.rank_digests.push(s.rank_digests);
        ctx.record.tokens.push(s.generated);
        ctx.record.top2.push(s.top2);
        if multi {
            ctx.record.lanes.push(s.lanes);
        }
    }
    Ok(())
}

/// The token session `s` feeds at `step`: its prompt's, then the tape's (teacher-forced) or its
/// own argmax.
fn token_at(ctx: &Ctx, s: &Session, step: usize) -> Result<u32> {
    let tokens = &ctx.cfg.battery.prompts[s.prompt];
    if let Some(t) = tokens.get(step) {
        return Ok(*t);
    }
    let j = step - tokens.len();
    let missing = || RuntimeError::Battery {
        prompt: Some(s.prompt),
        rule: format!("teacher-forced tape has no token {j} for prompt {}", s.prompt),
    };
    match &ctx.cfg.forced_tokens {
        Some(f) => f.get(s.prompt).and_then(|t| t.get(j)).copied().ok_or_else(missing),
        None => s.generated.get(j).copied().ok_or_else(|| {
            RuntimeError::Contract(format!(
                "prompt {} step {step} needs generated token {j} before it was produced",
                s.prompt
            ))
        }),
    }
}

/// Accept lane `lane`'s results for session `s` (its step `s.step`).
fn accept(ctx: &mut Ctx, s: &mut Session, out: &LaneDigests, pass: usize, lane: usize) -> Result<()> {
    s.digests.push(out.0.clone());
    s.rank_digests.push(out.1.clone());
    s.lanes.push((pass as u32, lane as u8));
    if s.step + 1 >= ctx.cfg.battery.prompts[s.prompt].len() {
        let (logits, amax) =
            (ctx.at_lane(0, ctx.buffers.root.logits, lane), ctx.at_lane(0, ctx.buffers.root.amax, lane));
        let logits = ctx.backend.read(0, logits)?;
        let amax = ctx.backend.read(0, amax)?[0].to_bits();
        s.top2.push(top_two(&logits));
        s.generated.push(amax);
    }
    s.step += 1;
    Ok(())
}

/// Rows: B lanes, continuous batching, lane j starting at pass j.
fn rows(ctx: &mut Ctx, b: usize) -> Result<Vec<Session>> {
    let n_prompts = ctx.cfg.battery.prompts.len();
    let mut queue: VecDeque<usize> = (0..n_prompts).collect();
    let mut slots: Vec<Option<Session>> = (0..b).map(|_| None).collect();
    let mut done: Vec<Option<Session>> = (0..n_prompts).map(|_| None).collect();
    for pass in 0.. {
        for (j, slot) in slots.iter_mut().enumerate() {
            if slot.is_none() && pass >= j {
                *slot = queue.pop_front().map(Session::new);
            }
        }
        let Some(n) = slots.iter().rposition(Option::is_some).map(|i| i + 1) else {
            break;
        };
        let mut lanes = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        for slot in &slots[..n] {
            match slot {
                Some(s) => {
                    lanes.push(Lane { prompt: s.prompt, step: s.step, live: true });
                    tokens.push(token_at(ctx, s, s.step)?);
                }
                None => {
                    lanes.push(Lane { prompt: 0, step: 0, live: false });
                    tokens.push(0);
                }
            }
        }
        let out = run_pass(ctx, lanes, &tokens)?;
        for (j, slot) in slots[..n].iter_mut().enumerate() {
            let Some(s) = slot.as_mut() else { continue };
            accept(ctx, s, &out[j], pass, j)?;
            if s.step == ctx.cfg.battery.steps_of(s.prompt) {
                let s = slot.take().expect("checked above");
                let p = s.prompt;
                done[p] = Some(s);
            }
        }
    }
    Ok(done.into_iter().map(|s| s.expect("every prompt was queued and ran to its last step")).collect())
}

/// The drafter of a verify pass (no tape): the token that followed the last earlier occurrence
/// of the context's last token (prompt lookup), else that token again. Cheap and deterministic;
/// its hit rate only decides how many columns are accepted, never what they compute.
fn draft(context: &[u32]) -> u32 {
    let last = *context.last().expect("a verify pass starts from a known token");
    context[..context.len() - 1].iter().rposition(|&t| t == last).map_or(last, |i| context[i + 1])
}

/// Columns: one session at a time, prefill then verify passes of up to T columns.
fn columns(ctx: &mut Ctx, t: usize) -> Result<Vec<Session>> {
    let mut done = Vec::new();
    let mut pass = 0;
    for prompt in 0..ctx.cfg.battery.prompts.len() {
        let n_prompt = ctx.cfg.battery.prompts[prompt].len();
        let steps = ctx.cfg.battery.steps_of(prompt);
        let mut s = Session::new(prompt);
        while s.step < steps {
            let base = s.step;
            let mut tokens = vec![token_at(ctx, &s, base)?];
            // Everything fed so far and this pass's first token (the context ends with it).
            let mut context: Vec<u32> = ctx.cfg.battery.prompts[prompt].clone();
            context.extend(&s.generated);
            context.truncate(base + 1);
            while tokens.len() < t && base + tokens.len() < steps {
                let step = base + tokens.len();
                if base < n_prompt {
                    if step >= n_prompt {
                        break; // a prefill pass holds prompt tokens only
                    }
                    tokens.push(ctx.cfg.battery.prompts[prompt][step]);
                } else {
                    let d = match &ctx.cfg.forced_tokens {
                        Some(_) => token_at(ctx, &s, step)?,
                        None => {
                            let d = draft(&context);
                            context.push(d);
                            d
                        }
                    };
                    tokens.push(d);
                }
            }
            let lanes = (0..tokens.len()).map(|i| Lane { prompt, step: base + i, live: true }).collect();
            let out = run_pass(ctx, lanes, &tokens)?;
            for (i, lane_out) in out.iter().enumerate() {
                if i > 0 && token_at(ctx, &s, base + i)? != tokens[i] {
                    ctx.record.bump("columns.rejected_columns");
                    break;
                }
                if i > 0 && base >= n_prompt {
                    ctx.record.bump("columns.accepted_drafts");
                }
                accept(ctx, &mut s, lane_out, pass, i)?;
            }
            pass += 1;
        }
        done.push(s);
    }
    Ok(done)
}

/// A verify/prefill pass (columns) first reads every layer's KV length mirror on every rank
/// for each of its lanes that ran before: each must hold the position that lane's previous pass
/// appended at — the engine's verify and prefill read these mirrors, which is why LEN_MIRROR_LAZY
/// yields in a columns run. A skipped copy leaves a mirror stale, and this read names it.
fn read_len_mirrors(ctx: &mut Ctx, lanes: usize) -> Result<()> {
    for i in 0..lanes {
        let Some(want) = ctx.lane_pos.get(i).copied().flatten() else { continue };
        for r in 0..ctx.placement.tp {
            for l in 0..ctx.buffers.ranks[r].len_mirror.len() {
                let s = ctx.at_lane(r, ctx.buffers.ranks[r].len_mirror[l], i);
                let got = ctx.backend.read(r, s)?[0].to_bits() as usize;
                if got != want {
                    return Err(RuntimeError::Contract(format!(
                        "layer {l} rank {r} lane {i}: the KV length mirror holds position {got}, but the lane's \
                         previous pass appended at {want}; a verify/prefill pass reads every layer's mirror, so no \
                         copy into it may be skipped in a run with such passes"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Issue one pass: each lane's embedding and device-held position, every layer and the head
/// for all lanes (one graph segment under GRAPH), then collect: per lane, its digests.
fn run_pass(ctx: &mut Ctx, lanes: Vec<Lane>, tokens: &[u32]) -> Result<Vec<LaneDigests>> {
    ctx.active = (0..lanes.len()).collect();
    ctx.pass = lanes;
    if ctx.cfg.pass.columns > 1 {
        read_len_mirrors(ctx, tokens.len())?;
    }
    for (i, &token) in tokens.iter().enumerate() {
        let embed = embed_row(ctx.model, token);
        let x = ctx.at_lane(0, ctx.buffers.root.x, i);
        ctx.backend.write(0, x, &embed)?;
        // The position every rope and attention launch reads (battery validation keeps it
        // inside the cache): device-held, so a captured pass replays unchanged at every position.
        // DCW: a lane that moved forward by at most a pass's lanes since its previous pass (one
        // token for a row, the accepted columns for a column) advances on the device counter; a
        // session start, or a lane that went back, falls back to the host write.
        let pos = ctx.pass[i].step;
        let by = ctx.lane_pos.get(i).copied().flatten().filter(|&p| p < pos && pos - p <= ctx.pass.len().max(1));
        let by = by.filter(|_| ctx.cfg.doors.dcw).map(|p| (pos - p) as u32);
        for r in 0..ctx.placement.tp {
            let out = ctx.at_lane(r, ctx.buffers.ranks[r].pos, i);
            let op = match by {
                Some(by) => Op::IncU32 { out, by },
                None => Op::SetU32 { out, value: pos as u32 },
            };
            ctx.backend.launch(r, op)?;
        }
        let counter = by.is_some();
        if counter {
            ctx.count("dcw.device_increments");
        }
        if ctx.lane_pos.len() <= i {
            ctx.lane_pos.resize(i + 1, None);
        }
        ctx.lane_pos[i] = Some(pos);
    }
    if ctx.graph_mode() != GraphMode::Step {
        step_calls(ctx)?;
    } else {
        ctx.in_segment(STEP_SEGMENT, step_calls)?;
    }
    let got = ctx.backend.collect()?;
    let out = copies::settle(ctx, &got.digests);
    // Timing: for each interval, the slowest rank's (end − begin).
    for (what, start, end) in ctx.timed.drain(..) {
        let dur =
            got.marks_ns.iter().filter_map(|m| Some(m.get(end)?.saturating_sub(*m.get(start)?))).max().unwrap_or(0);
        match what {
            Timed::Seam(idx) => ctx.record.timings_ns[idx].push(dur),
            Timed::Layer(l) => ctx.record.layer_timings_ns[l].push(dur),
        }
    }
    ctx.marks = 0;
    Ok(out)
}
