//! `memra-gates doors`: the registry as a table or as JSON.

use crate::registry::Registry;
use tabled::builder::Builder;
use tabled::settings::Style;

fn list<T: ToString>(v: &[T]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

pub fn to_table(r: &Registry) -> String {
    let mut b = Builder::default();
    b.push_record([
        "id",
        "env",
        "class",
        "default",
        "tp",
        "transports",
        "backends",
        "requires",
        "conflicts",
        "engagement",
    ]);
    for d in r.doors() {
        b.push_record([
            d.id.clone(),
            d.env.clone(),
            d.class.name().to_string(),
            d.default.to_string(),
            list(&d.tp.allowed),
            d.transports.allowed.iter().map(|t| t.name()).collect::<Vec<_>>().join(","),
            d.backends.iter().map(|b| b.name()).collect::<Vec<_>>().join(","),
            d.requires.iter().map(|l| l.id.clone()).collect::<Vec<_>>().join(","),
            d.conflicts.iter().map(|l| l.id.clone()).collect::<Vec<_>>().join(","),
            d.engagement.clone(),
        ]);
    }
    let mut t = b.build();
    t.with(Style::sharp());
    let settings: Vec<String> =
        r.settings().iter().map(|s| format!("  {} ({}): {}", s.env, s.format.name(), s.meaning)).collect();
    format!("{t}\nsettings:\n{}", settings.join("\n"))
}

pub fn to_json(r: &Registry) -> String {
    let doors: Vec<serde_json::Value> = r
        .doors()
        .iter()
        .map(|d| {
            serde_json::json!({
                "id": d.id,
                "env": d.env,
                "class": d.class.name(),
                "default": d.default,
                "changes": d.changes,
                "gate": d.gate.name(),
                "engagement": d.engagement,
                "seams": d.seams.iter().map(|s| s.name()).collect::<Vec<_>>(),
                "tp": d.tp.allowed,
                "transports": d.transports.allowed.iter().map(|t| t.name()).collect::<Vec<_>>(),
                "backends": d.backends.iter().map(|b| b.name()).collect::<Vec<_>>(),
                "not_applicable": d.not_applicable.iter().map(|(b, why)| (b.name().to_string(), why.clone())).collect::<std::collections::BTreeMap<_, _>>(),
                "requires": d.requires.iter().map(|l| serde_json::json!({"id": l.id, "why": l.why})).collect::<Vec<_>>(),
                "conflicts": d.conflicts.iter().map(|l| serde_json::json!({"id": l.id, "why": l.why})).collect::<Vec<_>>(),
                "error_budget": d.error_budget.as_ref().map(|b| serde_json::json!({"max_rel_error": b.max_rel_error, "near_tie_margin": b.near_tie_margin})),
            })
        })
        .collect();
    let settings: Vec<serde_json::Value> = r
        .settings()
        .iter()
        .map(|s| serde_json::json!({"env": s.env, "format": s.format.name(), "default": s.default, "meaning": s.meaning}))
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({"schema_version": 1, "doors": doors, "settings": settings}))
        .unwrap_or_default()
}
