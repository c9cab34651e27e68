//! The pass-shape axes of the matrix (docs/DESIGN.md §3.6): rows (`--batch`, sessions per pass)
//! and columns (`--columns`, consecutive tokens of one session per pass). A configuration of
//! several lanes is gated against the single-token TP1 oracle of the same model and battery —
//! that comparison is the batch-invariance and verify = decode gate — so these axes add
//! configurations, never references.
//!
//! Without `--batch` and `--columns` a matrix runs every configuration single-token and adds the
//! default multi-lane shapes with its base door set only (the empty set, or the requested doors
//! of a plain `run`): `--matrix all` every shape (b2, b4, b8, t2, t4, t8) at every TP size and
//! transport; every other matrix b4 and t4 at TP1 and TP2 (the shapes where a K split chosen by
//! B or a partition count chosen by T shows, at one and several ranks, while `run` stays about
//! a minute on two cores). With either flag, every configuration runs at every shape of their
//! product; a product with rows and columns both above 1 is excluded by the runtime's rule.

use std::collections::BTreeSet;

use memra_runtime::config::PassShape;

use super::{Configuration, MatrixKind, MatrixPlan, NotApplicable};
use crate::registry::{Registry, RegistryError};

/// Which pass shapes a matrix runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Passes {
    /// Neither flag given: every configuration single-token, plus `shapes` with the base door
    /// set at the TP sizes `tps` (where the plan has them).
    Default { shapes: Vec<PassShape>, tps: Vec<usize> },
    /// `--batch` / `--columns` given: every configuration at every shape; `refused` are the pairs
    /// of their product that are no pass (rows and columns both above 1), with the rule.
    Given { shapes: Vec<PassShape>, refused: Vec<(usize, usize, String)> },
}

/// The runtime's rule for a refused shape, without its error kind's prefix.
fn rule_of(e: memra_runtime::RuntimeError) -> String {
    match e {
        memra_runtime::RuntimeError::Contract(rule) => rule,
        other => other.to_string(),
    }
}

fn shape(b: usize, t: usize) -> PassShape {
    PassShape { batch: b, columns: t }
}

/// Check one list of `--batch` or `--columns`: each value by the runtime's rule, each once.
fn check_list(axis: &str, values: &[usize]) -> Result<(), RegistryError> {
    if values.is_empty() {
        return Err(RegistryError::Flag {
            flag: format!("--{axis}"),
            value: String::new(),
            rule: "at least one value is needed, or nothing would be tested".into(),
        });
    }
    let list = values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",");
    for (i, &n) in values.iter().enumerate() {
        let (b, t) = if axis == "batch" { (n, 1) } else { (1, n) };
        if let Err(e) = PassShape::new(b, t) {
            return Err(RegistryError::Flag { flag: format!("--{axis}"), value: list, rule: rule_of(e) });
        }
        if values[..i].contains(&n) {
            return Err(RegistryError::Flag {
                flag: format!("--{axis}"),
                value: list,
                rule: format!("{n} is given twice (each value is a column of the matrix; name it once)"),
            });
        }
    }
    Ok(())
}

impl Passes {
    /// The pass axes of a matrix of `kind` from the `--batch` and `--columns` lists (`None`: the
    /// flag was not given).
    pub fn from_flags(
        kind: Option<&MatrixKind>,
        batch: Option<&[usize]>,
        columns: Option<&[usize]>,
    ) -> Result<Passes, RegistryError> {
        if batch.is_none() && columns.is_none() {
            let all = kind == Some(&MatrixKind::All);
            let lanes: &[usize] = if all { &[2, 4, 8] } else { &[4] };
            let mut shapes: Vec<PassShape> = lanes.iter().map(|&b| shape(b, 1)).collect();
            shapes.extend(lanes.iter().map(|&t| shape(1, t)));
            let tps = if all { vec![1, 2, 4, 8] } else { vec![1, 2] };
            return Ok(Passes::Default { shapes, tps });
        }
        let (batch, columns) = (batch.unwrap_or(&[1]), columns.unwrap_or(&[1]));
        check_list("batch", batch)?;
        check_list("columns", columns)?;
        let (mut shapes, mut refused) = (Vec::new(), Vec::new());
        for &b in batch {
            for &t in columns {
                match PassShape::new(b, t) {
                    Ok(s) => shapes.push(s),
                    Err(e) => refused.push((b, t, rule_of(e))),
                }
            }
        }
        if shapes.is_empty() {
            return Err(RegistryError::Flag {
                flag: "--batch/--columns".into(),
                value: format!("{batch:?} × {columns:?}"),
                rule: format!(
                    "no pass shape is left: {}; give 1 in one of the lists (e.g. --batch 1,4 --columns 1,4)",
                    refused[0].2
                ),
            });
        }
        Ok(Passes::Given { shapes, refused })
    }

    /// No shape added: every configuration single-token, except those whose doors have no
    /// single-token work, which run at the first shape their doors allow (selftest's canaries).
    pub fn doors_own_shapes() -> Passes {
        Passes::Default { shapes: Vec::new(), tps: Vec::new() }
    }

    /// One token of one session per pass only (an external subject without --batch/--columns).
    pub fn single_only() -> Passes {
        Passes::Given { shapes: vec![PassShape::SINGLE], refused: Vec::new() }
    }

    /// Apply the axes to `plan`, a single-token plan whose base door set is `base`; then hold
    /// every configuration to its doors' pass shapes (registry `passes`).
    pub fn apply(&self, plan: MatrixPlan, base: &BTreeSet<String>, registry: &Registry) -> MatrixPlan {
        // Relocating single-token configurations is for plans the user gave no shapes to.
        let (defaults, relocate) = match self {
            Passes::Default { shapes, .. } => (shapes.clone(), true),
            Passes::Given { .. } => (Vec::new(), false),
        };
        place_by_door_passes(self.apply_axes(plan, base), registry, &defaults, relocate).finish()
    }

    fn apply_axes(&self, mut plan: MatrixPlan, base: &BTreeSet<String>) -> MatrixPlan {
        match self {
            Passes::Default { shapes, tps } => {
                let mut more: Vec<Configuration> = Vec::new();
                for c in plan.legal.iter().filter(|c| c.doors == *base && tps.contains(&c.tp)) {
                    more.extend(shapes.iter().map(|&s| c.clone().with_pass(s)));
                }
                plan.legal.extend(more);
                plan.pass_notes = vec![format!(
                    "passes: every configuration single-token; {} with the base door set [{}] only, at TP {} (no --batch/--columns: docs/DESIGN.md §3.6); each is gated against the single-token TP1 oracle (batch invariance, verify = decode)",
                    labels(shapes),
                    base.iter().cloned().collect::<Vec<_>>().join(", "),
                    tps.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
                )];
                plan.pass_notes.push(
                    "passes: other door sets at several lanes are left out by default; --batch 1,2,4,8 --columns 1,2,4,8 runs every door set at every shape".into(),
                );
            }
            Passes::Given { shapes, refused } => {
                let legal = std::mem::take(&mut plan.legal);
                plan.legal = legal.iter().flat_map(|c| shapes.iter().map(move |&s| c.clone().with_pass(s))).collect();
                let na = std::mem::take(&mut plan.not_applicable);
                plan.not_applicable = na
                    .iter()
                    .flat_map(|n| {
                        shapes.iter().map(move |&s| NotApplicable {
                            config: n.config.clone().with_pass(s),
                            reason: n.reason.clone(),
                        })
                    })
                    .collect();
                plan.pass_notes = vec![format!(
                    "passes: every configuration at {} (--batch/--columns); each multi-lane one is gated against the single-token TP1 oracle",
                    labels(shapes)
                )];
                for (b, t, rule) in refused {
                    plan.pass_notes.push(format!("passes: EXCLUDED b{b}×t{t}: {rule}"));
                }
            }
        }
        plan
    }
}

/// The first door of `doors` with nothing to do in passes of `shape`, as its reason.
fn refused_at(registry: &Registry, doors: &BTreeSet<String>, shape: PassShape) -> Option<String> {
    doors.iter().filter_map(|id| registry.door(id)).find_map(|d| d.not_at_pass(shape))
}

/// A door whose mechanism has no work at a shape (its registry `passes`) makes a configuration
/// with it at that shape NOT-APPLICABLE, with the door's reason — never a run that would be VOID.
/// With `relocate` (no shapes were asked for), a single-token configuration moved out this way runs instead at the `defaults` shapes its
/// doors allow, or, when they allow none of those, at the first shape they all allow (so every
/// door of a plan runs somewhere); a door set that allows no shape at all stays NOT-APPLICABLE.
fn place_by_door_passes(
    mut plan: MatrixPlan,
    registry: &Registry,
    defaults: &[PassShape],
    relocate: bool,
) -> MatrixPlan {
    let legal = std::mem::take(&mut plan.legal);
    let mut moved = Vec::new();
    for c in legal {
        match refused_at(registry, &c.doors, c.pass()) {
            None => plan.legal.push(c),
            Some(reason) => moved.push((c, reason)),
        }
    }
    let every: Vec<PassShape> =
        [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (1, 8)].map(|(b, t)| shape(b, t)).to_vec();
    let mut placed = Vec::new();
    for (c, reason) in moved {
        let fits = |s: &PassShape| refused_at(registry, &c.doors, *s).is_none();
        let mut shapes: Vec<PassShape> = defaults.iter().copied().filter(fits).collect();
        if shapes.is_empty() {
            shapes.extend(every.iter().copied().find(fits));
        }
        // A shape the matrix was asked for, or no shape the doors allow: NOT-APPLICABLE, with
        // the door's reason; a single-token configuration that runs elsewhere is moved, not lost.
        if !relocate || c.pass() != PassShape::SINGLE || shapes.is_empty() {
            plan.not_applicable.push(NotApplicable { config: c, reason });
            continue;
        }
        for s in shapes {
            let c = c.clone().with_pass(s);
            if !plan.legal.contains(&c) && !placed.contains(&c) {
                placed.push(c);
            }
        }
    }
    if !placed.is_empty() {
        plan.pass_notes.push(format!(
            "passes: {} configuration(s) whose doors have no work in single-token decode run at the shapes their doors allow (registry `passes`)",
            placed.len()
        ));
    }
    plan.legal.extend(placed);
    plan
}

/// `1×1, b4, t4`.
fn labels(shapes: &[PassShape]) -> String {
    shapes.iter().map(|s| if s.lanes() == 1 { "1×1".to_string() } else { s.label() }).collect::<Vec<_>>().join(", ")
}
