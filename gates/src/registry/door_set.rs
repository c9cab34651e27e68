//! The mapping between registry door ids and the runtime's explicit door values
//! ([`DoorSet`]): the runtime generates [`Door`] and `DoorSet` (a field per door) from the
//! registry file itself (`runtime/build.rs`), so door ids are `Door::id()`s and nothing here lists
//! a door; canaries map onto [`Canary`] through `Canary::id()`.

use std::collections::BTreeSet;

use memra_runtime::door::{Canary, Door, DoorSet};

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
                    rule: format!(
                        "the runtime's canaries are {} (and canary_flip_bit needs MEMRA_CANARY_FLIP_AT or its default)",
                        Canary::all().map(|c| c.id()).join(", ")
                    ),
                })?;
                canaries.push((id, canary));
            } else {
                let door = runtime_door(id).ok_or_else(|| RegistryError::NoRuntimeField {
                    id: id.to_string(),
                    rule: "every non-canary door id must be a door of the runtime (memra_runtime::door::Door, generated from gates/doors.toml)".to_string(),
                })?;
                ds.set(door, true);
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

/// The runtime door a non-canary door id names.
fn runtime_door(id: &str) -> Option<Door> {
    Door::ALL.into_iter().find(|d| d.id() == id)
}

/// Every door of a runtime [`DoorSet`] by id, with whether it is on (registry order).
pub fn door_set_fields(ds: &DoorSet) -> Vec<(&'static str, bool)> {
    Door::ALL.into_iter().map(|d| (d.id(), ds.get(d))).collect()
}

/// The registry id of a runtime canary.
pub fn canary_id(c: &Canary) -> &'static str {
    c.id()
}

/// The runtime canary of registry id `id` (`Canary::all` names each once); the flip canary
/// needs its place.
fn canary_of(id: &str, flip_at: Option<FlipAt>) -> Option<Canary> {
    match Canary::all().into_iter().find(|c| c.id() == id)? {
        Canary::FlipBit { .. } => flip_at.map(|a| Canary::FlipBit {
            layer: a.layer,
            seam: a.seam,
            step: a.step,
            element: a.element.unwrap_or(0),
        }),
        c => Some(c),
    }
}
