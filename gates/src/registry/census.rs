//! A door's declared census change: the expression language of `census = [...]` in
//! `gates/doors.toml` (documented in [`super::file`]) and its one evaluation.
//!
//! The census (`memra_runtime::evidence::census`) counts what a backend really issued. A door
//! declares what must change in it when the door is on, against the same configuration with the
//! door off: `{ counter = "peer_store.gemv_partials.*", change = "appears" }`. A counter is a
//! census counter name, or a prefix ending in `.*` that sums every counter under it; a change is
//! one of `more`, `fewer`, `appears` (0 with the door off, > 0 with it on) and `vanishes` (the
//! reverse). Every declared change must hold, or the door did not engage.

use std::collections::BTreeMap;

use serde::Deserialize;

/// How a counter must move when the door is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    More,
    Fewer,
    Appears,
    Vanishes,
}

impl Change {
    pub fn name(self) -> &'static str {
        match self {
            Change::More => "more",
            Change::Fewer => "fewer",
            Change::Appears => "appears",
            Change::Vanishes => "vanishes",
        }
    }

    /// Whether the move from `off` (door off) to `on` (door on) is this change.
    pub fn holds(self, off: u64, on: u64) -> bool {
        match self {
            Change::More => on > off,
            Change::Fewer => on < off,
            Change::Appears => off == 0 && on > 0,
            Change::Vanishes => off > 0 && on == 0,
        }
    }
}

/// What a door saves when its purpose is not speed (`benefit` in `gates/doors.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Saves {
    /// Kernel launches (a `launch.*` counter, or any counter of what is issued).
    Launches,
    /// Device bytes (a counter that counts bytes).
    DeviceBytes,
}

impl Saves {
    pub fn name(self) -> &'static str {
        match self {
            Saves::Launches => "launches",
            Saves::DeviceBytes => "device-bytes",
        }
    }
}

/// A door's declared benefit: `counter` (a census counter or pattern, as in `census`) must be
/// lower with the door on than in its parent configuration, in every comparison of a night.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Benefit {
    pub saves: Saves,
    pub counter: String,
    pub why: String,
}

impl Benefit {
    /// The counter's value in `census` (summed like a census change's).
    pub fn value(&self, census: &BTreeMap<String, u64>) -> u64 {
        CensusChange { counter: self.counter.clone(), change: Change::Fewer }.value(census)
    }
}

/// One declared census change of a door.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CensusChange {
    pub counter: String,
    pub change: Change,
}

impl CensusChange {
    /// The counter's value in `census`: exact, or summed over a `prefix.*` pattern; a sum of
    /// terms (`a + b`) adds the terms' values — one mechanism that issues different kernels in
    /// different door combinations is witnessed by the sum of them.
    pub fn value(&self, census: &BTreeMap<String, u64>) -> u64 {
        self.counter.split('+').map(|term| term_value(term.trim(), census)).sum()
    }

    /// The declaration against two censuses: `Ok(detail)` when it holds, `Err(detail)` otherwise.
    pub fn check(&self, off: &BTreeMap<String, u64>, on: &BTreeMap<String, u64>) -> Result<String, String> {
        let (a, b) = (self.value(off), self.value(on));
        let text = format!("{} {} ({a} → {b})", self.counter, self.change.name());
        if self.change.holds(a, b) {
            Ok(text)
        } else {
            Err(text)
        }
    }
}

fn term_value(term: &str, census: &BTreeMap<String, u64>) -> u64 {
    match term.strip_suffix('*') {
        Some(prefix) => census.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| *v).sum(),
        None => census.get(term).copied().unwrap_or(0),
    }
}

/// Why a counter expression is not well formed, or `None`: one or more terms joined by ` + `,
/// each `<family>[.<detail>…]` with a family of `families`, non-empty segments, and `*` only as
/// a whole last segment; no term twice.
pub fn counter_rule(counter: &str, families: &[&str]) -> Option<String> {
    let terms: Vec<&str> = counter.split('+').map(str::trim).collect();
    if terms.len() > 1 {
        let distinct: std::collections::BTreeSet<&str> = terms.iter().copied().collect();
        if distinct.len() != terms.len() {
            return Some("a sum names each counter once".into());
        }
        return terms.iter().find_map(|t| term_rule(t, families).map(|r| format!("term {t:?}: {r}")));
    }
    term_rule(counter, families)
}

fn term_rule(counter: &str, families: &[&str]) -> Option<String> {
    let segments: Vec<&str> = counter.split('.').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Some("a counter is dot-separated segments, none of them empty".into());
    }
    if !families.contains(&segments[0]) {
        return Some(format!("the census families are {}", families.join(", ")));
    }
    let stars = segments.iter().enumerate().filter(|(_, s)| s.contains('*')).map(|(i, s)| (i, *s)).collect::<Vec<_>>();
    match stars[..] {
        [] => None,
        [(i, "*")] if i + 1 == segments.len() && i > 0 => None,
        _ => Some("`*` stands only as the whole last segment (`family.prefix.*`)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_and_patterns() {
        let census: BTreeMap<String, u64> = [("copy.native-p2p.8", 2), ("copy.native-p2p.16", 3), ("copy.local.8", 1)]
            .map(|(k, v)| (k.into(), v))
            .into();
        let c = |counter: &str, change| CensusChange { counter: counter.into(), change };
        assert_eq!(c("copy.native-p2p.*", Change::More).value(&census), 5);
        assert_eq!(c("copy.*", Change::More).value(&census), 6);
        assert_eq!(c("copy.local.8", Change::More).value(&census), 1);
        assert_eq!(c("peer_store.*", Change::More).value(&census), 0);
        // A sum adds its terms (a pattern and an exact counter here).
        assert_eq!(c("copy.native-p2p.* + copy.local.8", Change::More).value(&census), 6);
        assert_eq!(c("copy.local.8 + peer_store.x", Change::More).value(&census), 1);
        assert!(Change::Appears.holds(0, 1) && !Change::Appears.holds(1, 2));
        assert!(Change::Vanishes.holds(3, 0) && !Change::Vanishes.holds(3, 1));
        assert!(Change::Fewer.holds(3, 1) && !Change::Fewer.holds(1, 1));
        let empty = BTreeMap::new();
        assert!(c("copy.*", Change::Vanishes).check(&census, &empty).is_ok());
        assert!(c("copy.*", Change::More).check(&census, &empty).is_err());
    }

    #[test]
    fn counter_patterns_are_checked() {
        let f = ["launch", "copy", "doorbell"];
        assert_eq!(counter_rule("launch.fold", &f), None);
        assert_eq!(counter_rule("copy.native-p2p.*", &f), None);
        assert_eq!(counter_rule("doorbell", &f), None);
        assert_eq!(counter_rule("launch.select_slots + copy.native-p2p.*", &f), None);
        assert!(counter_rule("launch.a + launch.a", &f).is_some(), "a term twice");
        assert!(counter_rule("launch.a + launches.b", &f).is_some(), "an unknown family in a term");
        assert!(counter_rule("launch.a + ", &f).is_some(), "an empty term");
        assert!(counter_rule("launches.fold", &f).is_some());
        assert!(counter_rule("launch..x", &f).is_some());
        assert!(counter_rule("launch.fo*", &f).is_some());
        assert!(counter_rule("launch.*.x", &f).is_some());
        assert!(counter_rule("*", &f).is_some());
    }
}
