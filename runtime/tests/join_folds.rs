//! The join folds' inputs and their provenance (issue 26, docs/DESIGN.md §3.4 "Signed zeros at the
//! joins"). A fold of K-block partials from +0.0 and a fold started from the first partial differ
//! only where every partial is −0.0, and a canonical partial is never −0.0 (it is itself a sum
//! from +0.0). That proof holds only while every partial a join folds comes from a producer that
//! sums from +0.0. This test enumerates, on `tiny` and `edge` at several TP sizes and doors, the
//! producer of every element every partial-folding op reads (following copies and peer stores to
//! the op that computed the bytes) and fails on any producer outside [`PARTIAL_PRODUCERS`] — a
//! future scaled or multiplied partial must revisit the proof (and make `edge` reach it) first.
//! It also reads the partials at each fold: none is −0.0 in a canonical run, and with the
//! signed-zero canary planted (sums from −0.0) the same reading does find −0.0 partials (the
//! negative control of the reading).

use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{capability, Backend, BufId, JoinFence, Op, Slice, Transfer};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, Canary, DoorSet, RunConfig, Transport};
use std::collections::BTreeMap;

/// The ops whose outputs a join may fold: K-block partials, each a sum from +0.0 (dot32 lanes and
/// their butterfly; E4M3's fold of scaled blocks; NVFP4 and W8 alike) — never −0.0.
const PARTIAL_PRODUCERS: [&str; 2] = ["gemv_partials", "expert_down"];
/// The provenance of an element no op wrote (a host write of data that is not −0.0).
const HOST_WRITE: &str = "host_write";
const NEG_ZERO: u32 = 0x8000_0000;

/// Hooks on a host backend that remember, per element of every buffer, which op last wrote it (a
/// copy or a peer store hands on its source's producers), and inspect every partial-folding op.
#[derive(Default)]
struct Provenance {
    /// (rank, buffer) → the producer of each element.
    producers: Vec<((usize, BufId), Vec<&'static str>)>,
    /// Partial-folding op name → (ops checked, elements whose parts are all −0.0, −0.0 parts).
    folds: BTreeMap<&'static str, (u64, u64, u64)>,
    /// Producers outside `PARTIAL_PRODUCERS` found under a fold: (fold op, producer).
    foreign: BTreeMap<(&'static str, &'static str), u64>,
}

impl Provenance {
    fn backend(tp: usize) -> Intercepted<HostBackend, Provenance> {
        Intercepted::new(HostBackend::new(tp).unwrap(), Provenance::default())
    }

    fn buffer(&mut self, rank: usize, buf: BufId) -> &mut Vec<&'static str> {
        let i = self.producers.iter().position(|(k, _)| *k == (rank, buf)).expect("an allocated buffer");
        &mut self.producers[i].1
    }

    fn mark(&mut self, rank: usize, offset: usize, buf: BufId, kinds: &[&'static str]) {
        let b = self.buffer(rank, buf);
        let end = (offset + kinds.len()).min(b.len());
        b[offset..end].copy_from_slice(&kinds[..end - offset]);
    }

    fn kinds(&mut self, rank: usize, buf: BufId, offset: usize, len: usize) -> Vec<&'static str> {
        let b = self.buffer(rank, buf);
        b[offset..(offset + len).min(b.len())].to_vec()
    }

    /// Record the store of `op` (run on `rank`, storing into `out_rank`'s memory).
    fn stored(&mut self, out_rank: usize, op: &Op) {
        let name = op.name();
        let (target, span) = match *op {
            Op::ExpertDown { out, slots, out_pitch, .. } => (out, out.len.max(slots * out_pitch)),
            _ => {
                let t = *op.slices().last().expect("an op stores somewhere");
                (t, t.len)
            }
        };
        self.mark(out_rank, target.offset, target.buf, &vec![name; span]);
    }

    /// The parts a partial-folding op reads: its slice and the length it spans (lanes, slots).
    fn parts_of(op: &Op) -> Option<(Slice, usize)> {
        let span = |s: Slice, len: usize| Slice { len, ..s };
        match *op {
            Op::Fold { parts, .. } | Op::FoldAddRmsNorm { parts, .. } => Some((parts, parts.len)),
            Op::FoldLanes { lanes, parts, parts_pitch, .. } => {
                Some((parts, span(parts, (lanes - 1) * parts_pitch + parts.len).len))
            }
            Op::FoldSlots { slots, parts, parts_pitch, .. } => {
                Some((parts, span(parts, slots.saturating_sub(1) * parts_pitch + parts.len).len))
            }
            Op::FoldCombineResidual { parts, pitch, w, .. } => {
                Some((parts, span(parts, w.len * pitch + parts.len).len))
            }
            _ => None,
        }
    }

    /// Before a partial-folding op runs on `rank`: the producers of what it reads, and the parts'
    /// signed zeros.
    fn inspect(&mut self, inner: &mut HostBackend, rank: usize, op: &Op) -> memra_runtime::Result<()> {
        let Some((parts, len)) = Provenance::parts_of(op) else { return Ok(()) };
        let name = op.name();
        let len = len.min(self.buffer(rank, parts.buf).len() - parts.offset);
        for k in self.kinds(rank, parts.buf, parts.offset, len) {
            if !PARTIAL_PRODUCERS.contains(&k) && k != HOST_WRITE {
                *self.foreign.entry((name, k)).or_insert(0) += 1;
            }
        }
        let values = inner.read(rank, Slice { len, ..parts })?;
        let n_parts = match *op {
            Op::Fold { n_parts, .. }
            | Op::FoldAddRmsNorm { n_parts, .. }
            | Op::FoldLanes { n_parts, .. }
            | Op::FoldSlots { n_parts, .. }
            | Op::FoldCombineResidual { n_parts, .. } => n_parts,
            _ => unreachable!("parts_of names the folds"),
        };
        let width = match *op {
            Op::Fold { out, .. } | Op::FoldLanes { out, .. } => out.len,
            Op::FoldAddRmsNorm { a, .. } => a.len,
            _ => parts.len / n_parts.max(1),
        };
        let e = self.folds.entry(name).or_insert((0, 0, 0));
        e.0 += 1;
        e.2 += values.iter().filter(|v| v.to_bits() == NEG_ZERO).count() as u64;
        // The first vector of parts (one slot, one lane): elements whose every part is −0.0.
        if width > 0 && n_parts * width <= values.len() {
            let all_neg = (0..width).filter(|i| (0..n_parts).all(|p| values[p * width + i].to_bits() == NEG_ZERO));
            e.1 += all_neg.count() as u64;
        }
        Ok(())
    }
}

impl Hooks<HostBackend> for Provenance {
    fn alloc(&mut self, inner: &mut HostBackend, rank: usize, len: usize) -> memra_runtime::Result<BufId> {
        let id = inner.alloc(rank, len)?;
        self.producers.push(((rank, id), vec!["unwritten"; len]));
        Ok(id)
    }
    fn write(&mut self, inner: &mut HostBackend, rank: usize, dst: Slice, data: &[f32]) -> memra_runtime::Result<()> {
        let kinds: Vec<&'static str> =
            data.iter().map(|v| if v.to_bits() == NEG_ZERO { "host_write_of_neg_zero" } else { HOST_WRITE }).collect();
        self.mark(rank, dst.offset, dst.buf, &kinds);
        inner.write(rank, dst, data)
    }
    fn launch(&mut self, inner: &mut HostBackend, rank: usize, op: Op) -> memra_runtime::Result<()> {
        self.inspect(inner, rank, &op)?;
        self.stored(rank, &op);
        inner.launch(rank, op)
    }
    fn copy(&mut self, inner: &mut HostBackend, c: Transfer) -> memra_runtime::Result<()> {
        let ((src_rank, src), (dst_rank, dst)) = (c.from, c.to);
        let kinds = self.kinds(src_rank, src.buf, src.offset, src.len);
        self.mark(dst_rank, dst.offset, dst.buf, &kinds);
        inner.copy(c)
    }
    fn launch_peer_store(
        &mut self,
        inner: &mut HostBackend,
        rank: usize,
        op: Op,
        out_rank: usize,
        fence: JoinFence,
    ) -> memra_runtime::Result<()> {
        self.inspect(inner, rank, &op)?;
        self.stored(out_rank, &op);
        capability::peer_stores(inner)?.launch_peer_store(rank, op, out_rank, fence)
    }
}

fn model(preset: &str) -> Model {
    generate(&ModelConfig::preset(preset, None).unwrap(), 1).unwrap()
}

fn run(model: &Model, tp: usize, doors: DoorSet) -> Provenance {
    let mut battery = Battery::default_for(model.config.vocab, 1);
    battery.prompts.truncate(2);
    battery.gen_tokens = 3;
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery).unwrap();
    cfg.doors = doors;
    let mut b = Provenance::backend(tp);
    program::run(model, &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {doors:?}: {e}"));
    b.hooks
}

#[test]
fn every_join_fold_reads_partials_summed_from_plus_zero_and_none_is_negative_zero() {
    let configs = [
        (1, DoorSet::default()),
        (2, DoorSet::default()),
        (2, DoorSet { oproj_direct: true, oproj_tail: true, ..DoorSet::default() }),
        (2, DoorSet { oproj_direct: true, moe_direct: true, ..DoorSet::default() }),
        (4, DoorSet { step_ep: true, ..DoorSet::default() }),
    ];
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for preset in ["tiny", "edge"] {
        let m = model(preset);
        for (tp, doors) in configs {
            let b = run(&m, tp, doors);
            let what = format!("{preset} TP{tp} {doors:?}");
            assert!(b.foreign.is_empty(), "{what}: a join folds values no partial producer wrote: {:?}", b.foreign);
            for (op, (n, all_neg, neg)) in &b.folds {
                assert_eq!((*all_neg, *neg), (0, 0), "{what}: {op} read −0.0 partials ({n} ops)");
                *seen.entry(op).or_insert(0) += n;
            }
        }
    }
    eprintln!("partial folds inspected: {seen:?}");
    // The enumeration must see the joins it is about: the o_join and the moe_join's slot folds.
    assert!(seen.get("fold").copied().unwrap_or(0) > 0, "no o_join fold inspected: {seen:?}");
    assert!(seen.get("fold_add_rmsnorm").copied().unwrap_or(0) > 0, "no OPROJ_TAIL fold inspected: {seen:?}");
    assert!(
        seen.get("fold_combine_residual").or(seen.get("fold_slots")).copied().unwrap_or(0) > 0,
        "no moe_join fold inspected: {seen:?}"
    );
}

#[test]
fn the_reading_sees_negative_zero_partials_where_sums_start_from_negative_zero() {
    // Negative control: edge's all-−0.0 K-block of the o_proj gives a −0.0 partial when sums
    // start from −0.0 (the signed-zero canary), and the inspection reads it at the o_join fold.
    let m = model("edge");
    let b = run(&m, 2, DoorSet { canary: Some(Canary::SignedZero), ..DoorSet::default() });
    let neg: u64 = b.folds.values().map(|f| f.2).sum();
    assert!(neg > 0, "the canary's −0.0 partials were not seen at any fold: {:?}", b.folds);
    assert!(b.foreign.is_empty(), "{:?}", b.foreign);
}

#[test]
fn a_planted_scaled_partial_is_a_foreign_producer_and_its_negative_zeros_are_seen() {
    // Negative control of the enumeration: partials written by a product (here `Scale` by −1.0
    // of +0.0 values, so every part is −0.0) instead of a partial producer — the shape of a
    // future scaled partial — are named, and the fold reads elements whose parts are all −0.0.
    let mut b = Provenance::backend(1);
    let (x, parts, out) = (b.alloc(0, 8).unwrap(), b.alloc(0, 8).unwrap(), b.alloc(0, 4).unwrap());
    b.write(0, Slice { buf: x, offset: 0, len: 8 }, &[0.0; 8]).unwrap();
    let whole = |buf, len| Slice { buf, offset: 0, len };
    b.launch(0, Op::Scale { x: whole(x, 8), s: -1.0, out: whole(parts, 8) }).unwrap();
    b.launch(0, Op::Fold { parts: whole(parts, 8), n_parts: 2, reverse: false, out: whole(out, 4) }).unwrap();
    assert_eq!(b.hooks.foreign.get(&("fold", "scale")), Some(&8), "{:?}", b.hooks.foreign);
    assert_eq!(b.hooks.folds.get("fold"), Some(&(1, 4, 8)), "one fold, 4 elements of all −0.0 parts, 8 −0.0 parts");
    // The canonical fold from +0.0 turns them into +0.0.
    assert!(b.read(0, whole(out, 4)).unwrap().iter().all(|v| v.to_bits() == 0), "the fold starts from +0.0");
}
