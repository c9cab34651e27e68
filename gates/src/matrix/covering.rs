//! The 2^n enumerations (`--matrix all` and `pairwise`): the non-canary doors as bit masks, so
//! the legality of every door set is a few bit operations, and the greedy covering array that
//! `pairwise` runs.

use memra_runtime::config::Transport;
use std::collections::BTreeSet;

use super::{Axes, MAX_ENUMERATED_DOORS};
use crate::registry::{BackendKind, Registry, RegistryError};

/// The non-canary doors as bit masks, for the enumerations that range over 2^n door sets.
pub(super) struct Table<'r> {
    /// Sorted non-canary door ids; bit i of a mask is `ids[i]`.
    pub(super) ids: Vec<&'r str>,
    /// Bits of the doors each door directly requires.
    requires: Vec<u64>,
    conflicts: Vec<u64>,
    tp_ok: Vec<Vec<usize>>,
    transport_ok: Vec<Vec<Transport>>,
    backend_ok: Vec<Vec<BackendKind>>,
    /// Bits of the doors of the multi-token paths (registry `passes` declared).
    pass_doors: u64,
}

impl<'r> Table<'r> {
    pub(super) fn new(registry: &'r Registry) -> Result<Table<'r>, RegistryError> {
        let mut ids: Vec<&str> = registry.doors().iter().filter(|d| !d.is_canary()).map(|d| d.id.as_str()).collect();
        ids.sort_unstable();
        if ids.len() > MAX_ENUMERATED_DOORS {
            return Err(RegistryError::Matrix {
                thing: "door count".to_string(),
                value: ids.len().to_string(),
                rule: format!(
                    "all and pairwise range over 2^n door sets and accept at most {MAX_ENUMERATED_DOORS} doors; use single or a door-set file"
                ),
            });
        }
        let bit = |id: &str| ids.iter().position(|x| *x == id).map_or(0, |i| 1u64 << i);
        let mut t = Table {
            ids: ids.clone(),
            requires: Vec::new(),
            conflicts: Vec::new(),
            tp_ok: Vec::new(),
            transport_ok: Vec::new(),
            backend_ok: Vec::new(),
            pass_doors: 0,
        };
        for id in &ids {
            let d = registry.door(id).expect("ids come from the registry");
            // Canaries are not enumerated here, so a door that requires one gets an
            // unsatisfiable requirement (every bit) and is never enumerated either.
            let mut req = 0;
            for l in &d.requires {
                req |= if registry.door(&l.id).is_some_and(|x| x.is_canary()) { u64::MAX } else { bit(&l.id) };
            }
            t.requires.push(req);
            t.conflicts.push(d.conflicts.iter().map(|l| bit(&l.id)).fold(0, |a, b| a | b));
            t.tp_ok.push(d.tp.allowed.clone());
            t.transport_ok.push(d.transports.allowed.clone());
            t.backend_ok.push(d.backends.clone());
            if d.pass_door {
                t.pass_doors |= bit(id);
            }
        }
        Ok(t)
    }

    /// Every mask whose door rules hold ([`Table::door_rules_hold`]), ascending — the masks a
    /// loop over all 2^n would keep, found without visiting the others: doors are decided
    /// required-first, so a door joins a set only beside everything it requires (when those are
    /// decided before it) and nothing it conflicts with, and each finished set is checked whole.
    pub(super) fn legal_masks(&self) -> Vec<u64> {
        let order = self.required_first();
        let mut pos = vec![0usize; self.ids.len()];
        for (at, &i) in order.iter().enumerate() {
            pos[i] = at;
        }
        // Whether door i's requirements are all decided before it (false for one that requires a
        // canary, u64::MAX: it can never join, which the inclusion test then says at once).
        let decided_before: Vec<bool> = (0..self.ids.len())
            .map(|i| self.requires[i] == u64::MAX || self.members(self.requires[i]).all(|r| pos[r] < pos[i]))
            .collect();
        let mut out = Vec::new();
        let mut stack = vec![(0usize, 0u64)];
        while let Some((at, mask)) = stack.pop() {
            if at == order.len() {
                if self.door_rules_hold(mask) {
                    out.push(mask);
                }
                continue;
            }
            let i = order[at];
            stack.push((at + 1, mask));
            let requires_ok = !decided_before[i] || self.requires[i] & !mask == 0;
            if requires_ok && self.conflicts[i] & mask == 0 {
                stack.push((at + 1, mask | (1 << i)));
            }
        }
        out.sort_unstable();
        out
    }

    /// The doors in an order where each comes after the doors it requires (Kahn's order over
    /// `requires`; doors on a requirement cycle, which the registry refuses, go last in id order).
    fn required_first(&self) -> Vec<usize> {
        let n = self.ids.len();
        let mut placed = 0u64;
        let mut order = Vec::with_capacity(n);
        loop {
            let ready: Vec<usize> = (0..n)
                .filter(|&i| placed & (1 << i) == 0)
                .filter(|&i| self.requires[i] == u64::MAX || self.requires[i] & !placed == 0)
                .collect();
            if ready.is_empty() {
                break;
            }
            for i in ready {
                placed |= 1 << i;
                order.push(i);
            }
        }
        order.extend((0..n).filter(|&i| placed & (1 << i) == 0));
        order
    }

    pub(super) fn members(&self, mask: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.ids.len()).filter(move |i| mask & (1 << i) != 0)
    }

    /// Every requirement present and no conflict — and the enumerations' family rule: a set
    /// holding a door of the multi-token paths holds only such doors and what they require.
    /// Crossing them with every subset of the single-token doors would multiply `all` by each
    /// (77 377 configurations instead of ~5 400 per backend) while their mechanisms touch only
    /// the per-lane launches (docs/DESIGN.md §3.6); among themselves they are crossed fully.
    pub(super) fn door_rules_hold(&self, mask: u64) -> bool {
        self.members(mask).all(|i| self.requires[i] & !mask == 0 && self.conflicts[i] & mask == 0)
            && self.pass_family_only(mask)
    }

    fn pass_family_only(&self, mask: u64) -> bool {
        let mut family = mask & self.pass_doors;
        if family == 0 {
            return true;
        }
        loop {
            let grown = self.members(family).fold(family, |acc, i| acc | self.requires[i]);
            if grown == family {
                return mask & !family == 0;
            }
            family = grown;
        }
    }

    /// Legal and applicable (door rules are checked by the caller).
    pub(super) fn runs(&self, mask: u64, backend: BackendKind, tp: usize, transport: Transport) -> bool {
        self.members(mask).all(|i| {
            self.tp_ok[i].contains(&tp)
                && self.transport_ok[i].contains(&transport)
                && self.backend_ok[i].contains(&backend)
        })
    }

    pub(super) fn set_of(&self, mask: u64) -> BTreeSet<String> {
        self.members(mask).map(|i| self.ids[i].to_string()).collect()
    }

    pub(super) fn conflicting_pairs(&self) -> Vec<(&'r str, &'r str)> {
        let mut out = Vec::new();
        for i in 0..self.ids.len() {
            for j in i + 1..self.ids.len() {
                if self.conflicts[i] & (1 << j) != 0 {
                    out.push((self.ids[i], self.ids[j]));
                }
            }
        }
        out
    }

    /// Greedy covering array over door on/off settings. A pair of settings (door i = a,
    /// door j = b) is coverable when some legal door set with that pair runs somewhere on the
    /// requested axes; the baseline is taken first, then repeatedly the set that covers the most
    /// uncovered pairs (ties: the smallest mask), until every coverable pair is covered.
    pub(super) fn covering(&self, axes: &Axes) -> Vec<u64> {
        let n = self.ids.len();
        let candidates: Vec<u64> =
            self.legal_masks().into_iter().filter(|&m| axes.each().any(|(b, tp, t)| self.runs(m, b, tp, t))).collect();
        let pair_index = |i: usize, j: usize, mask: u64| {
            let a = usize::from(mask & (1 << i) != 0);
            let b = usize::from(mask & (1 << j) != 0);
            ((i * n + j) << 2) | (a << 1) | b
        };
        let pairs_of = |mask: u64| (0..n).flat_map(move |i| (i + 1..n).map(move |j| pair_index(i, j, mask)));
        let mut coverable = vec![false; n * n * 4];
        for &m in &candidates {
            for p in pairs_of(m) {
                coverable[p] = true;
            }
        }
        let mut covered = vec![false; n * n * 4];
        let mut remaining = coverable.iter().filter(|c| **c).count();
        let mut chosen = Vec::new();
        let mut take = |m: u64, covered: &mut Vec<bool>, remaining: &mut usize| {
            for p in pairs_of(m) {
                if !covered[p] {
                    covered[p] = true;
                    *remaining -= 1;
                }
            }
            chosen.push(m);
        };
        if candidates.contains(&0) {
            take(0, &mut covered, &mut remaining);
        }
        while remaining > 0 {
            let mut best = (0usize, 0u64);
            for &m in &candidates {
                let gain = pairs_of(m).filter(|&p| !covered[p]).count();
                if gain > best.0 {
                    best = (gain, m);
                }
            }
            if best.0 == 0 {
                break; // cannot happen: every coverable pair comes from some candidate
            }
            take(best.1, &mut covered, &mut remaining);
        }
        chosen
    }
}
