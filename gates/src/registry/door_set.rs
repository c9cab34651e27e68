//! The mapping between registry door ids and the runtime's explicit door values
//! ([`DoorSet`]): door ids are the `DoorSet` field names, canaries map onto [`Canary`]. The
//! destructuring in [`door_set_fields`] and the exhaustive match in [`canary_id`] make a door
//! added to the runtime fail to compile here until it is mapped.

use std::collections::BTreeSet;

use memra_runtime::config::{Canary, DoorSet};

use super::{FlipAt, Registry, RegistryError, SettingValue, CANARY_FLIP_AT};

impl Registry {
    /// The runtime's explicit door values for a set of enabled door ids. `flip_at` places the
    /// flip-bit canary; `None` takes the registry's `MEMRA_CANARY_FLIP_AT` default. Every id must
    /// map to a runtime field or canary, and at most one canary may be enabled: nothing is
    /// silently ignored.
    /// `enabled` is any borrowed collection of ids: `&BTreeSet<String>`, `&[&str]`, `&Vec<String>`.
    pub fn to_door_set<'a, C>(&self, enabled: &'a C, flip_at: Option<FlipAt>) -> Result<DoorSet, RegistryError>
    where
        C: ?Sized,
        &'a C: IntoIterator,
        <&'a C as IntoIterator>::Item: AsRef<str>,
    {
        let enabled: BTreeSet<String> = enabled.into_iter().map(|s| s.as_ref().to_string()).collect();
        let mut ds = DoorSet::default();
        let mut canaries = Vec::new();
        for id in &enabled {
            let id = id.as_str();
            let Some(door) = self.door(id) else {
                return Err(RegistryError::UnknownName {
                    name: format!("door id {id:?}"),
                    kind: "door".to_string(),
                    rule: format!("enabled doors must be declared in {}", self.origin),
                    suggestion: crate::text::nearest(id, self.ids()).map(str::to_string),
                });
            };
            if door.is_canary() {
                let at = flip_at.or_else(|| self.default_flip_at());
                let canary = canary_of(id, at).ok_or_else(|| RegistryError::NoRuntimeField {
                    id: id.to_string(),
                    rule: "the runtime's canaries are canary_flip_bit, canary_reverse_kblocks, canary_stale_buffer, canary_skip_fence, canary_tie_break, canary_signed_zero, canary_clamp, canary_silent_fallback, canary_broken_broadcast (and canary_flip_bit needs MEMRA_CANARY_FLIP_AT or its default)".to_string(),
                })?;
                canaries.push((id, canary));
            } else {
                let field = runtime_flag(&mut ds, id).ok_or_else(|| RegistryError::NoRuntimeField {
                    id: id.to_string(),
                    rule: "every non-canary door id must name a field of memra_runtime::config::DoorSet".to_string(),
                })?;
                *field = true;
            }
        }
        match canaries[..] {
            [] => {}
            [(_, c)] => ds.canary = Some(c),
            _ => {
                let ids: Vec<&str> = canaries.iter().map(|(id, _)| *id).collect();
                return Err(RegistryError::Request(format!(
                    "canaries {} are enabled together (rule: a run carries one planted defect at a time, so a selftest failure is attributable to it)",
                    ids.join(" and ")
                )));
            }
        }
        Ok(ds)
    }

    /// The door ids a runtime [`DoorSet`] has enabled (inverse of [`Registry::to_door_set`]).
    pub fn ids_of(&self, ds: &DoorSet) -> BTreeSet<String> {
        let mut out: BTreeSet<String> =
            door_set_fields(ds).into_iter().filter(|(_, on)| *on).map(|(id, _)| id.to_string()).collect();
        if let Some(c) = &ds.canary {
            out.insert(canary_id(c).to_string());
        }
        out
    }

    /// The registry default of `MEMRA_CANARY_FLIP_AT`, if declared.
    pub fn default_flip_at(&self) -> Option<FlipAt> {
        match self.setting(CANARY_FLIP_AT)?.default_value.as_ref()? {
            SettingValue::FlipAt(at) => Some(*at),
            _ => None,
        }
    }
}

/// The runtime field a non-canary door id switches on. Door ids are the field names.
fn runtime_flag<'a>(ds: &'a mut DoorSet, id: &str) -> Option<&'a mut bool> {
    Some(match id {
        "bulk_p2p" => &mut ds.bulk_p2p,
        "oproj_direct" => &mut ds.oproj_direct,
        "oproj_tail" => &mut ds.oproj_tail,
        "moe_direct" => &mut ds.moe_direct,
        "routes_prestage" => &mut ds.routes_prestage,
        "fence_memops" => &mut ds.fence_memops,
        "rank0_merge" => &mut ds.rank0_merge,
        "graph" => &mut ds.graph,
        "f32_mirror" => &mut ds.f32_mirror,
        "step_ep" => &mut ds.step_ep,
        "qkv_fused" => &mut ds.qkv_fused,
        "dev_router" => &mut ds.dev_router,
        "w8" => &mut ds.w8,
        "nvfp4_ep2" => &mut ds.nvfp4_ep2,
        "nccl_allreduce" => &mut ds.nccl_allreduce,
        _ => return None,
    })
}

/// Every boolean door field of a runtime [`DoorSet`], by name (= door id). The destructuring
/// names every field, so a door added to the runtime fails to compile here until it is mapped.
pub fn door_set_fields(ds: &DoorSet) -> [(&'static str, bool); 15] {
    let DoorSet {
        bulk_p2p,
        oproj_direct,
        oproj_tail,
        moe_direct,
        routes_prestage,
        fence_memops,
        rank0_merge,
        graph,
        f32_mirror,
        step_ep,
        qkv_fused,
        dev_router,
        w8,
        nvfp4_ep2,
        nccl_allreduce,
        canary: _,
    } = *ds;
    [
        ("bulk_p2p", bulk_p2p),
        ("oproj_direct", oproj_direct),
        ("oproj_tail", oproj_tail),
        ("moe_direct", moe_direct),
        ("routes_prestage", routes_prestage),
        ("fence_memops", fence_memops),
        ("rank0_merge", rank0_merge),
        ("graph", graph),
        ("f32_mirror", f32_mirror),
        ("step_ep", step_ep),
        ("qkv_fused", qkv_fused),
        ("dev_router", dev_router),
        ("w8", w8),
        ("nvfp4_ep2", nvfp4_ep2),
        ("nccl_allreduce", nccl_allreduce),
    ]
}

/// The registry id of a runtime canary (exhaustive: a new runtime canary fails to compile here).
pub fn canary_id(c: &Canary) -> &'static str {
    match c {
        Canary::FlipBit { .. } => "canary_flip_bit",
        Canary::ReverseKBlocks => "canary_reverse_kblocks",
        Canary::StaleBuffer => "canary_stale_buffer",
        Canary::SkipFence => "canary_skip_fence",
        Canary::TieBreak => "canary_tie_break",
        Canary::SignedZero => "canary_signed_zero",
        Canary::Clamp => "canary_clamp",
        Canary::SilentFallback => "canary_silent_fallback",
        Canary::BrokenBroadcast => "canary_broken_broadcast",
    }
}

fn canary_of(id: &str, flip_at: Option<FlipAt>) -> Option<Canary> {
    match id {
        "canary_flip_bit" => flip_at.map(|a| Canary::FlipBit {
            layer: a.layer,
            seam: a.seam,
            step: a.step,
            element: a.element.unwrap_or(0),
        }),
        "canary_reverse_kblocks" => Some(Canary::ReverseKBlocks),
        "canary_stale_buffer" => Some(Canary::StaleBuffer),
        "canary_skip_fence" => Some(Canary::SkipFence),
        "canary_tie_break" => Some(Canary::TieBreak),
        "canary_signed_zero" => Some(Canary::SignedZero),
        "canary_clamp" => Some(Canary::Clamp),
        "canary_silent_fallback" => Some(Canary::SilentFallback),
        "canary_broken_broadcast" => Some(Canary::BrokenBroadcast),
        _ => None,
    }
}
