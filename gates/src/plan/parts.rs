//! The parts of a plan for `run --worker-processes N`: which worker process runs which
//! configurations. A configuration's census baselines are the same configuration with one door
//! off (`crate::suite` census): one process runs a baseline once and a configuration's own run
//! serves every superset that asks for it, but only inside that process. `--shard`'s blocks of
//! every lane (made so that N concurrent shards each get every TP size) cut that lattice
//! everywhere: `--matrix all` on CUDA in 8 shards needs 79,150 runs against one process's
//! 47,152. The workers share one GPU and one clock, so they need no TP balance: a part here is
//! whole lanes where they fit, and a lane too heavy is cut along its doors — the sets without a
//! door need nothing from the sets with it, and each set with it only its baselines with the door
//! off — into pieces packed heaviest first. The same plan in 8 parts: 52,776 runs, the heaviest
//! part 29,952 rank-runs (0.147 of the plan's 204,324) against the heaviest shard's 54,742 (0.268).
//!
//! The weight of a piece is its rank-runs ([`rank_runs`]): the runs one process makes of it (its
//! configurations' two each and the baselines none of its own runs provides), each times its TP
//! size. `matrix --explain --worker-processes N` prints both for every part.

use crate::env::DoorRequest;
use crate::error::GateError;
use crate::matrix::{self, MatrixPlan};
use crate::registry::Registry;
use std::collections::{BTreeSet, HashSet};

/// Lanes are cut, heaviest piece first, until no piece weighs more than a part's share over
/// this; after each cut the pieces are packed, and the packing whose heaviest part is lightest is
/// kept (each cut costs baselines, so cutting further stops paying once the parts are even).
const FINEST_PIECE_PER_SHARE: usize = 2;

/// What each configuration of a plan's `legal` list costs a process: runs (2, or 0 for one that
/// does not run), its ranks (a run's host time grows with them, [`rank_runs`]), the baseline key
/// its own run provides and the keys it asks for.
struct Costs {
    runs: Vec<usize>,
    ranks: Vec<usize>,
    provides: Vec<Option<usize>>,
    asks: Vec<Vec<usize>>,
}

impl Costs {
    /// The costs of `plan`'s `legal` list, in its order.
    fn of(registry: &Registry, plan: &MatrixPlan, req: &DoorRequest) -> Result<Costs, GateError> {
        let legal_only = MatrixPlan { legal: plan.legal.clone(), ..MatrixPlan::default() };
        let jobs = super::jobs_of(registry, &legal_only, req, 1, None)?;
        let ids = crate::suite::baseline_ids(&jobs);
        Ok(Costs {
            runs: jobs.iter().map(|j| if j.not_run.is_none() { 2 } else { 0 }).collect(),
            ranks: jobs.iter().map(|j| j.tp).collect(),
            provides: ids.iter().map(|(own, _)| *own).collect(),
            asks: ids.into_iter().map(|(_, asks)| asks).collect(),
        })
    }

    /// Rank-runs of one process running `members`: their own runs and each baseline none of them
    /// provides (a baseline has its configuration's TP), each times its ranks.
    fn weight(&self, members: &[usize]) -> usize {
        let provided: HashSet<usize> = members.iter().filter_map(|&m| self.provides[m]).collect();
        let mut asked: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for &m in members {
            for &k in self.asks[m].iter().filter(|k| !provided.contains(k)) {
                asked.insert(k, self.ranks[m]);
            }
        }
        members.iter().map(|&m| self.runs[m] * self.ranks[m]).sum::<usize>() + asked.values().sum::<usize>()
    }
}

/// A plan's weight as the parts are cut by: each run (a configuration's two, and each census
/// baseline none of its own runs provides) times its ranks. A CUDA run is host-bound, driving
/// every rank's launches from one thread, so its time grows with its TP size: one H100, `tiny`'s
/// `--matrix all --shard 7/200` in one process, 282 / 610 / 1,087 ms per configuration at TP2 /
/// 4 / 8 over native-p2p (docs/gpu/2026-12-06-parts): parts of equal runs would leave a part of
/// TP8 configurations about 3.9× as long as a part of TP2 ones.
pub fn rank_runs(registry: &Registry, plan: &MatrixPlan, req: &DoorRequest) -> Result<usize, GateError> {
    let costs = Costs::of(registry, plan, req)?;
    Ok(costs.weight(&(0..plan.legal.len()).collect::<Vec<_>>()))
}

/// Part `index` of `count` ([`worker_parts`]).
pub fn worker_part(
    registry: &Registry,
    plan: &MatrixPlan,
    req: &DoorRequest,
    index: usize,
    count: usize,
) -> Result<MatrixPlan, GateError> {
    // `matrix::shard` checks the part number (and names the rule) before any work.
    matrix::shard(plan, index, count)?;
    Ok(worker_parts(registry, plan, req, count)?.swap_remove(index))
}

/// The `count` parts of `plan`: a partition (every configuration in exactly one part, in the
/// plan's order within each part). Excluded and NOT-APPLICABLE entries, which run nothing, are
/// dealt as `--shard` deals them.
pub fn worker_parts(
    registry: &Registry,
    plan: &MatrixPlan,
    req: &DoorRequest,
    count: usize,
) -> Result<Vec<MatrixPlan>, GateError> {
    matrix::shard(plan, 0, count)?;
    let members = assign(registry, plan, req, count)?;
    members
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let dealt = matrix::shard(plan, i, count)?;
            Ok(MatrixPlan { legal: m.iter().map(|&c| plan.legal[c].clone()).collect(), ..dealt })
        })
        .collect()
}

/// The `legal` indices of every part of `count` (each sorted).
fn assign(
    registry: &Registry,
    plan: &MatrixPlan,
    req: &DoorRequest,
    count: usize,
) -> Result<Vec<Vec<usize>>, GateError> {
    let costs = Costs::of(registry, plan, req)?;
    // Lanes: a baseline has its configuration's backend, TP, transport and pass shape.
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    let mut lane_of = std::collections::HashMap::new();
    for (i, c) in plan.legal.iter().enumerate() {
        let k = (c.backend, c.tp, c.transport, c.batch, c.columns);
        let at = *lane_of.entry(k).or_insert_with(|| {
            lanes.push(Vec::new());
            lanes.len() - 1
        });
        lanes[at].push(i);
    }
    let mut pieces: Vec<(usize, Vec<usize>)> = lanes.into_iter().map(|l| (costs.weight(&l), l)).collect();
    let share = pieces.iter().map(|(w, _)| w).sum::<usize>().div_ceil(count.max(1));
    let finest = (share / FINEST_PIECE_PER_SHARE).max(1);
    // A packing counts once every part can have a piece (no part empty while another has two).
    let enough = count.min(plan.legal.len());
    let key = |packed: &(usize, Vec<(usize, Vec<usize>)>)| (packed.0, packed.1.iter().map(|(w, _)| w).sum::<usize>());
    let mut best = (pieces.len() >= enough).then(|| pack(&pieces, count));
    loop {
        let heaviest =
            (0..pieces.len()).filter(|&p| pieces[p].1.len() > 1).max_by_key(|&p| (pieces[p].0, usize::MAX - p));
        let Some(p) = heaviest.filter(|&p| pieces[p].0 > finest || pieces.len() < enough) else { break };
        let (with, without) = cut(plan, &costs, &pieces[p].1);
        pieces[p] = (costs.weight(&without), without);
        pieces.push((costs.weight(&with), with));
        if pieces.len() >= enough {
            let packed = pack(&pieces, count);
            if best.as_ref().is_none_or(|b| key(&packed) < key(b)) {
                best = Some(packed);
            }
        }
    }
    Ok(best
        .unwrap_or_else(|| pack(&pieces, count))
        .1
        .into_iter()
        .map(|(_, mut m)| {
            m.sort_unstable();
            m
        })
        .collect())
}

/// `pieces` packed into `count` parts, heaviest first, each into the lightest part (fewest
/// members on a tie, so no part is left empty while another holds two pieces of nothing to run;
/// then the lowest index): (the heaviest part's weight, the parts).
fn pack(pieces: &[(usize, Vec<usize>)], count: usize) -> (usize, Vec<(usize, Vec<usize>)>) {
    let mut order: Vec<&(usize, Vec<usize>)> = pieces.iter().collect();
    order.sort_by_key(|(w, m)| (usize::MAX - w, m[0]));
    let mut parts: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); count];
    for (w, m) in order {
        let at = (0..count).min_by_key(|&i| (parts[i].0, parts[i].1.len(), i)).expect("count >= 1");
        parts[at].0 += w;
        parts[at].1.extend_from_slice(m);
    }
    (parts.iter().map(|(w, _)| *w).max().unwrap_or(0), parts)
}

/// `members` (one lane, at least two door sets) cut by the door that costs fewest rank-runs — the
/// sets with it and without it weigh least together; the more even cut on a tie: (with, without), both
/// non-empty. (Cheapest first beat most even first: `--matrix all` on CUDA in 8 parts needs
/// 52,776 runs, the heaviest part 29,952 rank-runs, against 54,352 and 33,792; the packing evens
/// the parts out.)
fn cut(plan: &MatrixPlan, costs: &Costs, members: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let doors: BTreeSet<&String> = members.iter().flat_map(|&m| plan.legal[m].doors.iter()).collect();
    let split =
        |d: &String| -> (Vec<usize>, Vec<usize>) { members.iter().partition(|&&m| plan.legal[m].doors.contains(d)) };
    let best =
        doors.into_iter().map(split).filter(|(with, without)| !with.is_empty() && !without.is_empty()).min_by_key(
            |(with, without)| {
                let (a, b) = (costs.weight(with), costs.weight(without));
                (a + b, a.max(b))
            },
        );
    // Door sets of one lane are distinct, so some door is in one set and not another.
    best.unwrap_or_else(|| {
        let (a, b) = members.split_at(members.len() / 2);
        (b.to_vec(), a.to_vec())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{MatrixKind, Passes};
    use memra_runtime::backend::BackendKind;
    use memra_runtime::Transport;

    /// `kind` on CUDA at `tps` over every transport, with the default pass shapes (as `run`
    /// and `matrix` plan it).
    fn plan(registry: &Registry, kind: &str, tps: &[usize]) -> MatrixPlan {
        let kind = MatrixKind::parse(kind).unwrap();
        let p = matrix::enumerate(registry, &kind, tps, &Transport::ALL, &[BackendKind::Cuda]).unwrap();
        Passes::from_flags(Some(&kind), None, None).unwrap().apply(p, &Default::default(), registry)
    }

    /// Runs of one process running `p` (as `matrix --explain` counts them).
    fn runs(registry: &Registry, p: &MatrixPlan) -> usize {
        let jobs = crate::plan::jobs_of(registry, p, &DoorRequest::default(), 1, None).unwrap();
        2 * jobs.iter().filter(|j| j.not_run.is_none()).count() + crate::suite::unshared_baselines(&jobs)
    }

    #[test]
    fn parts_partition_the_plan_each_in_the_plans_order() {
        let registry = Registry::builtin().unwrap();
        for (kind, tps) in [("single", &[1, 2, 4, 8][..]), ("single", &[8][..]), ("all", &[1, 2][..])] {
            let p = plan(&registry, kind, tps);
            for n in [1, 2, 3, 5, 8] {
                let parts = worker_parts(&registry, &p, &DoorRequest::default(), n).unwrap();
                assert_eq!(parts.len(), n);
                let mut at: Vec<usize> = Vec::new();
                for part in &parts {
                    let idx: Vec<usize> =
                        part.legal.iter().map(|c| p.legal.iter().position(|x| x == c).unwrap()).collect();
                    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{kind} part of {n} out of the plan's order");
                    at.extend(idx);
                    assert!(!part.legal.is_empty(), "{kind}: an empty part of {n} ({} configurations)", p.legal.len());
                }
                at.sort_unstable();
                assert_eq!(at, (0..p.legal.len()).collect::<Vec<_>>(), "{kind}: parts of {n} are not a partition");
                let mut na: Vec<_> = parts.iter().flat_map(|s| s.not_applicable.clone()).collect();
                na.sort();
                assert_eq!(na, p.not_applicable);
                let mut ex: Vec<_> = parts.iter().flat_map(|s| s.excluded.clone()).collect();
                ex.sort();
                assert_eq!(ex, p.excluded);
                if n == 1 {
                    assert_eq!(parts[0].legal, p.legal, "one part is the plan");
                }
            }
        }
    }

    /// What the parts are for: `--matrix all`'s parts need fewer runs in all than its shards, and
    /// the heaviest part (the night's time, in rank-runs) is lighter than the heaviest shard.
    #[test]
    fn parts_need_fewer_runs_than_shards_and_the_heaviest_is_lighter() {
        let registry = Registry::builtin().unwrap();
        let p = plan(&registry, "all", &[1, 2, 4, 8]);
        let req = DoorRequest::default();
        let whole = runs(&registry, &p);
        for n in [4, 8] {
            let parts = worker_parts(&registry, &p, &req, n).unwrap();
            let shards: Vec<MatrixPlan> = (0..n).map(|i| matrix::shard(&p, i, n).unwrap()).collect();
            let total = |plans: &[MatrixPlan]| plans.iter().map(|q| runs(&registry, q)).sum::<usize>();
            let heaviest =
                |plans: &[MatrixPlan]| plans.iter().map(|q| rank_runs(&registry, q, &req).unwrap()).max().unwrap();
            assert!(total(&parts) >= whole, "{n} parts need fewer runs than the whole plan's {whole}");
            assert!(total(&parts) < total(&shards), "{n} parts: {} runs, shards {}", total(&parts), total(&shards));
            assert!(
                heaviest(&parts) < heaviest(&shards),
                "{n} parts: the heaviest {} rank-runs, shards {}",
                heaviest(&parts),
                heaviest(&shards)
            );
            assert!(heaviest(&parts) * n >= rank_runs(&registry, &p, &req).unwrap());
        }
    }

    /// A cut by a door leaves the sets without it closed under taking a door off (they need no
    /// baseline the sets with it provide), and a set with it needs from them only baselines that
    /// switch the door off (its own census decl, or a door's it requires).
    #[test]
    fn a_cut_costs_only_the_baselines_that_switch_its_door_off() {
        let registry = Registry::builtin().unwrap();
        let p = plan(&registry, "all", &[2]);
        let costs = Costs::of(&registry, &p, &DoorRequest::default()).unwrap();
        let legal_only = MatrixPlan { legal: p.legal.clone(), ..MatrixPlan::default() };
        let jobs = crate::plan::jobs_of(&registry, &legal_only, &DoorRequest::default(), 1, None).unwrap();
        let lane: Vec<usize> = (0..p.legal.len())
            .filter(|&i| (p.legal[i].transport, p.legal[i].batch, p.legal[i].columns) == (Transport::NativeP2p, 1, 1))
            .collect();
        let (with, without) = cut(&p, &costs, &lane);
        assert!(!with.is_empty() && !without.is_empty());
        let from_with: HashSet<usize> = with.iter().filter_map(|&m| costs.provides[m]).collect();
        let crossing = without.iter().flat_map(|&m| costs.asks[m].iter()).filter(|k| from_with.contains(k)).count();
        assert_eq!(crossing, 0, "the sets without the cut's door ask for baselines of the sets with it");
        let door = p.legal[with[0]]
            .doors
            .iter()
            .find(|d| {
                with.iter().all(|&m| p.legal[m].doors.contains(*d))
                    && !without.iter().any(|&m| p.legal[m].doors.contains(*d))
            })
            .expect("a door in every set of one side and in none of the other");
        let from_without: HashSet<usize> = without.iter().filter_map(|&m| costs.provides[m]).collect();
        for &m in &with {
            let asked = costs.asks[m].iter().filter(|k| from_without.contains(k)).count();
            let env = &registry.door(door).expect("a registry door").env;
            let door_off = jobs[m].census.iter().filter(|d| !d.off_vars.contains_key(env)).count();
            assert!(asked <= door_off, "{} asks the other side for {asked} baselines", p.legal[m].label());
        }
    }
}
