//! The engagement gate (docs/DESIGN.md §4.2): each door's census against the census of the same
//! configuration with that door off — the counters it declares must move as declared, a witness
//! counted outside the program must agree, and a mechanism replaced by a host round trip fails.

use super::Outcome;
use crate::job::CensusDecl;
use std::collections::BTreeMap;

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
