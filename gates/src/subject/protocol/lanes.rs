//! The tape's lane tensors (protocol version 2; docs/DESIGN.md §3.6): in a run of several rows or
//! columns per pass, `p{p}.lanes` (U32 `[steps_p, 2]`) names, for every step of prompt `p`, the
//! pass and the lane (row or column, from 0) that computed it. The tape stays per (prompt, step) —
//! the subject batches internally and reports every session's step where single-token decode
//! puts it — so the gates compare each row or column with the single-token oracle exactly as
//! they do the built-in runtime's (`Record::lanes`, `gate::name_lane`, `gate::lanes_used`).
//!
//! Rules (each names the prompt and step that breaks it): a lane lies inside the pass shape; no
//! two steps of the tape share a (pass, lane); a session's steps follow its passes — rows: each
//! step in a later pass than the one before (a session advances one token per pass); columns:
//! the next column of the same pass, or column 0 of a later pass.

use memra_runtime::PassShape;
use std::collections::BTreeMap;

/// The tensor name of prompt `p`'s lanes.
pub fn tensor_name(p: usize) -> String {
    format!("p{p}.lanes")
}

/// Check the (pass, lane) of every step of every prompt against a run of `shape`.
pub fn check(per_prompt: &[Vec<(u32, u8)>], shape: PassShape) -> Result<(), String> {
    let lanes = shape.lanes();
    let rows = shape.batch > 1;
    let mut taken: BTreeMap<(u32, u8), (usize, usize)> = BTreeMap::new();
    for (p, steps) in per_prompt.iter().enumerate() {
        let name = tensor_name(p);
        let mut before: Option<(u32, u8)> = None;
        for (s, &(pass, lane)) in steps.iter().enumerate() {
            if usize::from(lane) >= lanes {
                return Err(format!(
                    "{name}: step {s} names lane {lane} of pass {pass}, and a {} pass has lanes 0 to {}",
                    shape.label(),
                    lanes - 1
                ));
            }
            if let Some((q, t)) = taken.insert((pass, lane), (p, s)) {
                return Err(format!(
                    "{name}: step {s} names pass {pass} lane {lane}, which computed prompt {q} step {t} already (a lane computes one step per pass)"
                ));
            }
            if let Some((bp, bl)) = before {
                let follows = if rows {
                    pass > bp
                } else {
                    (pass == bp && u32::from(lane) == u32::from(bl) + 1) || (pass > bp && lane == 0)
                };
                if !follows {
                    let rule = if rows {
                        "rows: a session advances one token per pass, so each step is in a later pass than the one before"
                    } else {
                        "columns: a step is the next column of the pass before, or column 0 of a later pass"
                    };
                    return Err(format!(
                        "{name}: step {s} is pass {pass} lane {lane} after pass {bp} lane {bl} ({rule})"
                    ));
                }
            }
            before = Some((pass, lane));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_that_break_the_schedule_are_named() {
        let b2 = PassShape::new(2, 1).unwrap();
        let t4 = PassShape::new(1, 4).unwrap();
        // Rows, ragged: prompt 0 on lane 0 from pass 0, prompt 1 on lane 1 from pass 1.
        let good = vec![vec![(0, 0), (1, 0), (2, 0)], vec![(1, 1), (2, 1), (3, 1)]];
        assert_eq!(check(&good, b2), Ok(()));
        assert_eq!(check(&[vec![(0, 0), (0, 1), (0, 2), (1, 0)]], t4), Ok(()));
        for (tape, shape, why) in [
            (vec![vec![(0, 2)]], b2, "lanes 0 to 1"),
            (vec![vec![(0, 0), (1, 0)], vec![(1, 0)]], b2, "computed prompt 0 step 1 already"),
            (vec![vec![(0, 0), (0, 1)]], b2, "later pass"),
            (vec![vec![(0, 0), (0, 2)]], t4, "next column"),
            (vec![vec![(0, 0), (1, 1)]], t4, "column 0 of a later pass"),
        ] {
            let e = check(&tape, shape).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
