//! The pass shapes a subject runs (protocol version 2; docs/DESIGN.md §3.6): the manifest's
//! `batch` (sessions per pass, rows) and `columns` (consecutive tokens of one session per pass)
//! lists, checked, and the rule that makes a configuration outside them NOT-APPLICABLE. A version
//! 1 subject has neither field and runs single-token passes only.

use memra_runtime::PassShape;

/// The protocol version that introduced rows and columns.
pub const SHAPES_SINCE: u64 = 2;

/// What a subject declares it runs: `batch` × {1} and {1} × `columns`, each list holding 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectShapes {
    /// The manifest's `protocol`.
    pub protocol: u64,
    pub batch: Vec<usize>,
    pub columns: Vec<usize>,
}

/// A manifest field that breaks a rule: (field, value as written, rule).
pub type ShapeRefusal = (&'static str, String, String);

impl SubjectShapes {
    /// Check the manifest's lists (`None`: the field is absent, which means `[1]`).
    pub fn parse(protocol: u64, batch: Option<&[i64]>, columns: Option<&[i64]>) -> Result<SubjectShapes, ShapeRefusal> {
        let mut lists = [Vec::new(), Vec::new()];
        for (i, (field, given)) in [("batch", batch), ("columns", columns)].into_iter().enumerate() {
            let Some(values) = given else {
                lists[i] = vec![1];
                continue;
            };
            let shown = format!("{values:?}");
            if protocol < SHAPES_SINCE {
                return Err((
                    field,
                    shown,
                    format!(
                        "protocol {protocol} runs single-token passes only; a subject that runs rows or columns declares protocol = {SHAPES_SINCE}"
                    ),
                ));
            }
            let mut seen = Vec::new();
            for &v in values {
                let n = usize::try_from(v).unwrap_or(0);
                let (b, t) = if field == "batch" { (n, 1) } else { (1, n) };
                if let Err(e) = PassShape::new(b, t) {
                    let rule = match e {
                        memra_runtime::RuntimeError::Contract(r) => r,
                        other => other.to_string(),
                    };
                    return Err((field, shown, format!("{v} is no pass size ({rule})")));
                }
                if seen.contains(&n) {
                    return Err((field, shown, format!("{n} is listed twice (each size once)")));
                }
                seen.push(n);
            }
            if !seen.contains(&1) {
                return Err((
                    field,
                    shown,
                    "the list holds 1: every subject runs single-token passes (its class baseline and the shapes of the other axis are single-token)".into(),
                ));
            }
            seen.sort_unstable();
            lists[i] = seen;
        }
        let [batch, columns] = lists;
        Ok(SubjectShapes { protocol, batch, columns })
    }

    /// Whether the subject runs passes of `shape`.
    pub fn runs(&self, shape: PassShape) -> bool {
        self.batch.contains(&shape.batch) && self.columns.contains(&shape.columns)
    }

    /// Why a run of `shape` is outside what the subject `who` ("subject NAME VERSION") declares,
    /// or `None` when it runs it.
    pub fn not_applicable(&self, who: &str, shape: PassShape) -> Option<String> {
        if self.runs(shape) {
            return None;
        }
        let label = shape.label();
        if self.protocol < SHAPES_SINCE {
            return Some(format!(
                "{who} (protocol {}) runs single-token passes only: {label} is outside its manifest (rows and columns need protocol = {SHAPES_SINCE} with `batch` / `columns`)",
                self.protocol
            ));
        }
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
        Some(format!(
            "{who} (protocol {}) runs batch [{}] and columns [{}] only: {label} is outside its manifest",
            self.protocol,
            list(&self.batch),
            list(&self.columns)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(b: usize, t: usize) -> PassShape {
        PassShape::new(b, t).unwrap()
    }

    #[test]
    fn declared_shapes_run_and_the_rest_is_not_applicable_with_the_rule() {
        let v2 = SubjectShapes::parse(2, Some(&[4, 1, 2]), None).unwrap();
        assert_eq!((v2.batch.clone(), v2.columns.clone()), (vec![1, 2, 4], vec![1]));
        assert!(v2.runs(shape(4, 1)) && v2.runs(PassShape::SINGLE));
        let why = v2.not_applicable("subject s 1.0", shape(8, 1)).unwrap();
        assert!(why.contains("(protocol 2) runs batch [1, 2, 4] and columns [1] only: b8"), "{why}");
        assert!(v2.not_applicable("subject s 1.0", shape(1, 2)).unwrap().contains("t2 is outside"));
        let v1 = SubjectShapes::parse(1, None, None).unwrap();
        assert_eq!(v1.not_applicable("subject s 1.0", PassShape::SINGLE), None);
        let why = v1.not_applicable("subject s 1.0", shape(4, 1)).unwrap();
        assert!(
            why.contains("subject s 1.0 (protocol 1) runs single-token passes only: b4 is outside its manifest"),
            "{why}"
        );
    }

    #[test]
    fn bad_lists_are_refused_naming_field_value_and_rule() {
        for (protocol, batch, columns, field, rule) in [
            (2, Some(&[1, 3][..]), None, "batch", "3 is no pass size"),
            (2, None, Some(&[1, 16][..]), "columns", "16 is no pass size"),
            (2, Some(&[1, 2, 2][..]), None, "batch", "listed twice"),
            (2, Some(&[2, 4][..]), None, "batch", "holds 1"),
            (2, Some(&[1, -2][..]), None, "batch", "-2 is no pass size"),
            (1, Some(&[1, 2][..]), None, "batch", "protocol 1 runs single-token passes only"),
        ] {
            let (f, _, r) = SubjectShapes::parse(protocol, batch, columns).unwrap_err();
            assert_eq!(f, field);
            assert!(r.contains(rule), "{rule}: {r}");
        }
    }
}
