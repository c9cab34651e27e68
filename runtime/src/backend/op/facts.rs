//! Everything the code knows about one [`Op`] besides its arithmetic (which is the host twin's):
//! its name, the slices it touches, and the kernel the census names it by. Backends and the
//! census read these; nothing else names an op.

use super::{span, GroupId, Op, RowOrder, Slice, WeightId};

impl Op {
    /// Every slice an op touches (for bounds checks before queueing); an op's store target
    /// ([`Op::store_target`]) comes last. A multi-lane op touches each slice's span over its
    /// lanes. The list is [`Op::map_slices`]'s, so the two can never disagree.
    pub fn slices(&self) -> Vec<Slice> {
        match *self {
            Op::AttentionRows { rows, q, k, v, gate, pos, out, pitch: p, .. } => vec![
                span(q, p.q, rows),
                span(k, p.kv, rows),
                span(v, p.kv, rows),
                span(gate, p.gate, rows),
                span(pos, p.pos, rows),
                span(out, p.out, rows),
            ],
            Op::FoldLanes { lanes, parts, parts_pitch, out, out_pitch, .. } => {
                vec![span(parts, parts_pitch, lanes), span(out, out_pitch, lanes)]
            }
            _ => {
                let mut all = Vec::new();
                self.clone().map_slices(|s| all.push(*s));
                all
            }
        }
    }

    /// Apply `f` to every slice the op touches, store target last (rows and columns: the program
    /// moves an op to another lane's buffers this way; a multi-lane op's first lane's slices).
    pub fn map_slices(&mut self, mut f: impl FnMut(&mut Slice)) {
        let slices: Vec<&mut Slice> = match self {
            Op::GemvRows { x, out, .. } | Op::GemvPartials { x, out, .. } => vec![x, out],
            Op::GemvRowsBatch { items, x } => std::iter::once(x).chain(items.iter_mut().map(|i| &mut i.1)).collect(),
            Op::Fold { parts, out, .. } => vec![parts, out],
            Op::Add { a, b, out } => vec![a, b, out],
            Op::Scale { x, out, .. } => vec![x, out],
            Op::RmsNorm { x, w, out, .. } => vec![x, w, out],
            Op::AddRmsNorm { x, a, w, h, out, .. } => vec![x, a, w, h, out],
            Op::FoldAddRmsNorm { parts, x, w, a, h, out, .. } => vec![parts, x, w, a, h, out],
            Op::QkNormRope { x, w, cos_sin, .. } => vec![x, w, cos_sin],
            Op::Attention { q, k, v, gate, out, .. } => vec![q, k, v, gate, out],
            Op::Router { logits, bias, out, .. } => vec![logits, bias, out],
            Op::Swiglu { gate, up, out, .. } => vec![gate, up, out],
            Op::Combine { y, w, out } => vec![y, w, out],
            Op::CombineShared { y, w, out } => vec![y, w, out],
            Op::CombineScaled { route, y, w, macros, out } => vec![route, y, w, macros, out],
            Op::ResidualAdd { h, a, b, sum, out } => vec![h, a, b, sum, out],
            Op::Argmax { x, out } => vec![x, out],
            Op::FlipLowBit { x } => vec![x],
            Op::SetU32 { out, .. } => vec![out],
            Op::IncU32 { out, .. } => vec![out],
            Op::AttentionRows { q, k, v, gate, pos, out, .. } => vec![q, k, v, gate, pos, out],
            Op::FoldLanes { parts, out, .. } => vec![parts, out],
            Op::QkNormRopeAt { x, w, table, pos, .. } => vec![x, w, table, pos],
            Op::AttentionAt { q, k, v, gate, pos, out, .. } => vec![q, k, v, gate, pos, out],
            Op::AppendAt { src, cache, pos } => vec![src, cache, pos],
            Op::RopeAppend { q, k, v, q_norm, k_norm, table, pos, q_out, k_out, k_cache, v_cache, .. } => {
                vec![q, k, v, q_norm, k_norm, table, pos, q_out, k_out, k_cache, v_cache]
            }
            Op::ExpertGateUp { route, x, act, .. } => vec![route, x, act],
            Op::ExpertGateUpRows { route, x, gate, up, .. } => vec![route, x, gate, up],
            Op::ExpertDown { route, act, out, .. } => vec![route, act, out],
            Op::FoldSlots { route, parts, out, .. } => vec![route, parts, out],
            Op::FoldCombineResidual { parts, w, h, out, sum, x, .. } => vec![parts, w, h, out, sum, x],
            Op::SelectSlots { route, src, out, .. } => vec![route, src, out],
            Op::CombineOwned { route, y, w, out, .. } => vec![route, y, w, out],
            Op::ExpertDownCombine { route, act, parts, w, out, .. } => vec![route, act, parts, w, out],
            Op::MirrorSel { src, out } => vec![src, out],
        };
        slices.into_iter().for_each(&mut f);
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::GemvRows { .. } => "gemv_rows",
            Op::GemvRowsBatch { .. } => "gemv_rows_batch",
            Op::GemvPartials { .. } => "gemv_partials",
            Op::Fold { .. } => "fold",
            Op::Add { .. } => "add",
            Op::Scale { .. } => "scale",
            Op::RmsNorm { .. } => "rmsnorm",
            Op::AddRmsNorm { .. } => "add_rmsnorm",
            Op::FoldAddRmsNorm { .. } => "fold_add_rmsnorm",
            Op::QkNormRope { .. } => "qk_norm_rope",
            Op::Attention { .. } => "attention",
            Op::Router { .. } => "router",
            Op::Swiglu { .. } => "swiglu",
            Op::Combine { .. } => "combine",
            Op::CombineShared { .. } => "combine_shared",
            Op::CombineScaled { .. } => "combine_scaled",
            Op::ResidualAdd { .. } => "residual_add",
            Op::Argmax { .. } => "argmax",
            Op::FlipLowBit { .. } => "flip_low_bit",
            Op::SetU32 { .. } => "set_u32",
            Op::IncU32 { .. } => "inc_u32",
            Op::AttentionRows { walk_once: false, .. } => "attention_rows",
            Op::AttentionRows { walk_once: true, .. } => "attention_cols_walk_once",
            Op::FoldLanes { .. } => "fold_lanes",
            Op::QkNormRopeAt { .. } => "qk_norm_rope_at",
            Op::AttentionAt { .. } => "attention_at",
            Op::AppendAt { .. } => "append_at",
            Op::RopeAppend { .. } => "rope_append",
            Op::ExpertGateUp { .. } => "expert_gate_up",
            Op::ExpertGateUpRows { .. } => "expert_gate_up_rows",
            Op::ExpertDown { .. } => "expert_down",
            Op::FoldSlots { .. } => "fold_slots",
            Op::FoldCombineResidual { .. } => "fold_combine_residual",
            Op::SelectSlots { .. } => "select_slots",
            Op::CombineOwned { .. } => "combine_owned",
            Op::ExpertDownCombine { .. } => "expert_down_combine",
            Op::MirrorSel { .. } => "mirror_sel",
        }
    }

    /// The kernel this op runs, as the census names it: the op's name, its variant where the op
    /// has one (`gemv_rows_tree`, `router_dev`, `fold_reverse`, `expert_down_combine.reverse`), and for GEMVs and grouped expert
    /// ops the weight storage it reads (`gemv_rows.f32`, `expert_gate_up.nvfp4`). `weight` and
    /// `group` give the storage of a rank's weight and expert group.
    pub fn kernel(&self, weight: impl Fn(WeightId) -> &'static str, group: impl Fn(GroupId) -> &'static str) -> String {
        let name = self.name();
        match self {
            Op::GemvRows { w, order: RowOrder::Tree, .. } => format!("gemv_rows_tree.{}", weight(*w)),
            Op::GemvRows { w, .. } | Op::GemvPartials { w, .. } => format!("{name}.{}", weight(*w)),
            Op::GemvRowsBatch { items, .. } => {
                format!("{name}.{}", items.first().map(|i| weight(i.0)).unwrap_or("empty"))
            }
            Op::Router { device_variant: true, .. } => "router_dev".to_string(),
            Op::Fold { reverse: true, .. } => "fold_reverse".to_string(),
            // The planted reversed owner sum stays in the fused sweep's family (SEL_DOWN8's and
            // NVFP4_EP2's census count `launch.expert_down_combine.*`).
            Op::ExpertDownCombine { group: g, reverse: true, .. } => format!("{name}.reverse.{}", group(*g)),
            // Only the verify-partitions canary walks other partitions than the program's.
            Op::AttentionAt { partition, .. } | Op::AttentionRows { partition, .. }
                if *partition != memra_kernels::twins::attention::ATTN_PARTITION =>
            {
                format!("{name}_split")
            }
            Op::ExpertGateUp { group: g, .. }
            | Op::ExpertGateUpRows { group: g, .. }
            | Op::ExpertDown { group: g, .. }
            | Op::ExpertDownCombine { group: g, .. } => format!("{name}.{}", group(*g)),
            _ => name.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_named_with_variant_and_storage() {
        let s = Slice::new(0, 0, 1);
        let fmt = |w: WeightId| if w == 0 { "bf16" } else { "f32" };
        let grp = |_| "nvfp4";
        let rows = |w, order| Op::GemvRows { w, x: s, out: s, order };
        assert_eq!(rows(0, RowOrder::Canonical).kernel(fmt, grp), "gemv_rows.bf16");
        assert_eq!(rows(1, RowOrder::Tree).kernel(fmt, grp), "gemv_rows_tree.f32");
        let fold = |reverse| Op::Fold { parts: s, n_parts: 1, reverse, out: s };
        assert_eq!(fold(false).kernel(fmt, grp), "fold");
        assert_eq!(fold(true).kernel(fmt, grp), "fold_reverse");
        assert_eq!(Op::FlipLowBit { x: s }.kernel(fmt, grp), "flip_low_bit");
        let owner = memra_kernels::twins::experts::SlotOwner {
            rule: memra_kernels::twins::experts::OwnerRule { experts: 8, div: 1, modulo: 2 },
            want: 0,
        };
        let dc = |reverse| Op::ExpertDownCombine {
            group: 0,
            route: s,
            owner,
            act: s,
            act_pitch: 1,
            parts: s,
            parts_pitch: 1,
            w: s,
            out: s,
            reverse,
        };
        assert_eq!(dc(false).kernel(fmt, grp), "expert_down_combine.nvfp4");
        assert_eq!(dc(true).kernel(fmt, grp), "expert_down_combine.reverse.nvfp4");
    }
}
