//! The door effects of one receipt set as Markdown (`memra-gates effects`, the nightly report):
//! the door × TP summaries, and the cost of exactness line and table. Every number is defined in
//! METRICS.md, "Door effects".

use super::{door_nights, DoorEffects, ExactnessCost};

fn us(ns: u64) -> String {
    let v = ns as f64 / 1e3;
    if v >= 1000.0 {
        format!("{:.2} ms", v / 1e3)
    } else {
        format!("{v:.1} µs")
    }
}

fn short(door: &str) -> &str {
    door.strip_prefix("MEMRA_").unwrap_or(door)
}

/// `default ÷ fastest` and its interval: the inverse of the comparison's ratio and bounds.
pub fn cost_of(c: &ExactnessCost) -> (f64, f64, f64) {
    (1.0 / c.step.ratio, 1.0 / c.step.hi, 1.0 / c.step.lo)
}

/// One line: `Cost of exactness (…): host tp1 host-bounce ×1.04 [0.69, 1.56] AMBIGUOUS · …`.
pub fn exactness_line(e: &DoorEffects) -> String {
    if e.exactness_cost.is_empty() {
        return "Cost of exactness: not stated (no passing canonical default beside other passing sets)".to_string();
    }
    let parts: Vec<String> = e
        .exactness_cost
        .iter()
        .map(|c| {
            let (r, lo, hi) = cost_of(c);
            format!(
                "{} tp{} {} ×{r:.2} [{lo:.2}, {hi:.2}] (fastest {})",
                c.backend.as_str(),
                c.tp,
                c.transport.as_str(),
                c.step.effect
            )
        })
        .collect();
    format!(
        "Cost of exactness (step latency of the canonical default ÷ the fastest door set that passed, NUMERIC doors included): {}",
        parts.join(" · ")
    )
}

/// The Markdown section.
pub fn to_markdown(e: &DoorEffects) -> String {
    let mut s = String::new();
    let r = &e.rule;
    s.push_str(&format!(
        "Step latency with each door ÷ the same configuration without it, same night (median over its configurations at each TP size; interval `[r/(1+ν), r·(1+ν)]`, ν ≥ {} on host, ≥ {} on CUDA; SAME needs ν ≤ {}; METRICS.md, door effects). {} comparison(s).\n\n",
        r.host_floor,
        r.cuda_floor,
        r.same_max_noise,
        e.effects.len()
    ));
    let nights = door_nights(e);
    if nights.is_empty() {
        s.push_str("No door effect: no configuration with a door passed beside its parent set.\n\n");
    } else {
        s.push_str(
            "| door | backend | TP | ratio | interval | effect | configs FASTER / SAME / SLOWER / AMBIGUOUS |\n",
        );
        s.push_str("|---|---|---|---|---|---|---|\n");
        for n in &nights {
            s.push_str(&format!(
                "| {} | {} | {} | ×{:.2} | [{:.2}, {:.2}] | {} | {} / {} / {} / {} |\n",
                short(&n.door),
                n.backend.as_str(),
                n.tp,
                n.ratio,
                n.lo,
                n.hi,
                n.effect,
                n.counts[0],
                n.counts[1],
                n.counts[2],
                n.counts[3]
            ));
        }
        s.push('\n');
    }
    s.push_str(&exactness_line(e));
    s.push_str("\n\n");
    if !e.exactness_cost.is_empty() {
        s.push_str("| backend | TP | transport | default step | fastest passing set | its step | default ÷ fastest | interval | fastest vs default |\n");
        s.push_str("|---|---|---|---|---|---|---|---|---|\n");
        for c in &e.exactness_cost {
            let (r, lo, hi) = cost_of(c);
            let doors = if c.fastest_doors.is_empty() {
                "the default itself".to_string()
            } else {
                c.fastest_doors.iter().map(|d| short(d)).collect::<Vec<_>>().join(" + ")
            };
            s.push_str(&format!(
                "| {} | {} | {} | {} | {doors} | {} | ×{r:.2} | [{lo:.2}, {hi:.2}] | {} |\n",
                c.backend.as_str(),
                c.tp,
                c.transport.as_str(),
                us(c.step.parent_median_ns),
                us(c.step.median_ns),
                c.step.effect
            ));
        }
        s.push('\n');
    }
    s
}
