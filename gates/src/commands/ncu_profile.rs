//! An Nsight Compute profile of one metric per launch — `ncu --metrics gpu__time_duration.sum
//! --csv` over a bench, as `scripts/gpu/libs.sh` `ncu_b1` writes it — read into the mean time per
//! launch of each kernel (`bench --targets --ncu`).
//!
//! The file is ncu's stdout with the profiled program's own lines around it (`==PROF==` notes,
//! `memra-gates` progress on stderr). Every line before the header row (`"ID","Process ID",…`) is
//! skipped, and so is every later line that is not a quoted row of the header's width. Columns are
//! found by name: `Kernel Name`, `Metric Name`, `Metric Unit`, `Metric Value`; only rows of
//! `gpu__time_duration.sum` count. Values carry a thousands separator (`"20,192"`); units are ns,
//! us or ms (ncu's `nsecond`, `usecond`, `msecond` too), any other is refused by name. The card is
//! the one `memra-gates` names in its `backend cuda (…, N device(s): 0 NAME (sm_XX))` line, where
//! the file has it: ncu's own columns give only an ordinal.

use std::collections::BTreeMap;

/// The metric a launch's duration is read from.
pub const DURATION_METRIC: &str = "gpu__time_duration.sum";

/// One kernel's launches in the profile.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    pub name: String,
    pub launches: usize,
    pub mean_ns: f64,
}

/// The kernels of a profile, slowest mean first, and the card the profiled program named.
#[derive(Debug, Clone, PartialEq)]
pub struct NcuProfile {
    pub kernels: Vec<KernelTime>,
    pub device: Option<String>,
}

/// Split one CSV line of double-quoted fields (`""` inside a field is a quote); None where the
/// line is not of that form (the program's own output).
fn quoted_fields(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = line.trim_end().chars().peekable();
    loop {
        if chars.next()? != '"' {
            return None;
        }
        let mut field = String::new();
        loop {
            match chars.next()? {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => break,
                c => field.push(c),
            }
        }
        out.push(field);
        match chars.next() {
            None => return Some(out),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// ns per unit of ncu's time units.
fn unit_ns(unit: &str) -> Option<f64> {
    match unit {
        "ns" | "nsecond" => Some(1.0),
        "us" | "usecond" => Some(1e3),
        "ms" | "msecond" => Some(1e6),
        _ => None,
    }
}

/// The card `memra-gates` names when its CUDA backend starts, if the profile holds that line.
fn program_device(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.split_once("device(s): ")?.1;
        let rest = rest.split_once(' ')?.1; // past the ordinal
        Some(rest.split_once(" (sm_")?.0.trim().to_string())
    })
}

/// Read a profile's text (the whole file, the program's lines included).
pub fn parse(text: &str) -> Result<NcuProfile, String> {
    let mut lines = text.lines().enumerate();
    let header = lines
        .by_ref()
        .find_map(|(_, l)| quoted_fields(l).filter(|f| f.first().map(String::as_str) == Some("ID")))
        .ok_or("no ncu CSV header row (\"ID\",\"Process ID\",…): not an `ncu --csv` profile")?;
    let col =
        |name: &str| header.iter().position(|h| h == name).ok_or(format!("the header row has no \"{name}\" column"));
    let (kernel, metric, unit, value) =
        (col("Kernel Name")?, col("Metric Name")?, col("Metric Unit")?, col("Metric Value")?);
    let mut sums: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for (i, line) in lines {
        let Some(f) = quoted_fields(line).filter(|f| f.len() == header.len()) else { continue };
        if f[metric] != DURATION_METRIC {
            continue;
        }
        let scale = unit_ns(&f[unit]).ok_or(format!(
            "line {}: unit \"{}\" of {DURATION_METRIC}: ns, us or ms expected",
            i + 1,
            f[unit]
        ))?;
        let v: f64 = f[value]
            .replace(',', "")
            .parse()
            .map_err(|_| format!("line {}: value \"{}\" of {}: not a number", i + 1, f[value], f[kernel]))?;
        // The kernel's name without its parameter list (ncu prints C++ names with it).
        let name = f[kernel].split('(').next().unwrap_or("").trim().to_string();
        let e = sums.entry(name).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += v * scale;
    }
    if sums.is_empty() {
        return Err(format!("no {DURATION_METRIC} rows: profile with `ncu --metrics {DURATION_METRIC} --csv`"));
    }
    let mut kernels: Vec<KernelTime> =
        sums.into_iter().map(|(name, (n, s))| KernelTime { name, launches: n, mean_ns: s / n as f64 }).collect();
    kernels.sort_by(|a, b| b.mean_ns.total_cmp(&a.mean_ns).then_with(|| a.name.cmp(&b.name)));
    Ok(NcuProfile { kernels, device: program_device(text) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The profile of today's main on an H100 (docs/gpu/2026-12-07-remeasure-h100/).
    fn h100_text() -> String {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/gpu/2026-12-07-remeasure-h100/ncu-b1-flushed.csv");
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    #[test]
    fn a_real_profile_gives_each_kernels_mean_and_the_card() {
        let text = h100_text();
        let p = parse(&text).unwrap();
        assert_eq!(p.device.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        // Recompute one kernel's mean from the rows by another route than the parser's.
        let rows: Vec<f64> = text
            .lines()
            .filter(|l| l.contains("\"rmsnorm_f32\"") && l.contains(DURATION_METRIC))
            .map(|l| l.rsplit("\",\"").next().unwrap().trim_matches('"').replace(',', "").parse::<f64>().unwrap())
            .collect();
        assert!(rows.len() > 1);
        let k = p.kernels.iter().find(|k| k.name == "rmsnorm_f32").unwrap();
        assert_eq!(k.launches, rows.len());
        assert!((k.mean_ns - rows.iter().sum::<f64>() / rows.len() as f64).abs() < 1e-9);
        // Slowest first; every row of the metric counted once.
        assert!(p.kernels.windows(2).all(|w| w[0].mean_ns >= w[1].mean_ns));
        let all = text.lines().filter(|l| l.starts_with("\"") && l.contains(DURATION_METRIC)).count();
        assert_eq!(p.kernels.iter().map(|k| k.launches).sum::<usize>(), all);
    }

    #[test]
    fn units_separators_quotes_and_parameter_lists() {
        let text = "noise\n\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n\
            \"0\",\"k(float*, int)\",\"gpu__time_duration.sum\",\"usecond\",\"0.75\"\n\
            memra-gates: a line of the program between rows\n\
            \"1\",\"k(float*, int)\",\"gpu__time_duration.sum\",\"ns\",\"1,250\"\n\
            \"2\",\"say \"\"hi\"\"\",\"gpu__time_duration.sum\",\"msecond\",\"0.002\"\n\
            \"3\",\"k\",\"sm__cycles_elapsed.avg\",\"cycle\",\"99\"\n";
        let p = parse(text).unwrap();
        assert_eq!(p.device, None);
        assert_eq!(p.kernels.len(), 2);
        assert_eq!(p.kernels[0], KernelTime { name: "say \"hi\"".into(), launches: 1, mean_ns: 2000.0 });
        assert_eq!(p.kernels[1], KernelTime { name: "k".into(), launches: 2, mean_ns: 1000.0 });
    }

    #[test]
    fn what_is_not_a_duration_profile_is_refused_by_name() {
        assert!(parse("memra-gates bench: done\n").unwrap_err().contains("no ncu CSV header"));
        let head = "\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n";
        let e = parse(&format!("{head}\"0\",\"k\",\"gpu__time_duration.sum\",\"cycle\",\"5\"\n")).unwrap_err();
        assert!(e.contains("unit \"cycle\"") && e.contains("line 2"), "{e}");
        let e = parse(&format!("{head}\"0\",\"k\",\"gpu__time_duration.sum\",\"ns\",\"n/a\"\n")).unwrap_err();
        assert!(e.contains("\"n/a\"") && e.contains(" k"), "{e}");
        assert!(parse(head).unwrap_err().contains("no gpu__time_duration.sum rows"));
        let e = parse("\"ID\",\"Kernel Name\",\"Metric Value\"\n").unwrap_err();
        assert!(e.contains("\"Metric Name\""), "{e}");
    }
}
