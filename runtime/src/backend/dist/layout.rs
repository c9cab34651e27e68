//! Which process holds which rank when one run spans several processes (docs/DESIGN.md §3.5: `nccl`
//! is the path for ranks on several hosts).
//!
//! A run of TP ranks over N processes gives every process a contiguous block of TP / N ranks:
//! global rank g lives on process g / (TP / N) as its local rank g % (TP / N). The rules are
//! checked here once, and the gates turn a broken rule into a NOT-APPLICABLE verdict that quotes
//! the rule text.

/// The most processes one run may span (TP is at most 8, and every process holds a rank).
pub const MAX_PROCESSES: usize = 8;

/// `--process P/N`: this process is number P of N (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessSpec {
    pub process: usize,
    pub processes: usize,
}

impl ProcessSpec {
    /// The rule every `P/N` obeys, quoted by parse errors.
    pub const RULE: &'static str =
        "use P/N with N processes (1 to 8) and P this process's 0-based index below N, e.g. 0/2 and 1/2";

    /// Parse `P/N`; the error names the value and [`ProcessSpec::RULE`].
    pub fn parse(s: &str) -> Result<ProcessSpec, String> {
        let bad = |why: &str| format!("process {s:?}: {why} ({})", ProcessSpec::RULE);
        let (p, n) = s.split_once('/').ok_or_else(|| bad("there is no `/`"))?;
        let number = |what: &str, v: &str| {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("{what} {v:?} is not a non-negative integer")));
            }
            v.parse::<usize>().map_err(|_| bad(&format!("{what} {v:?} is too large")))
        };
        let (process, processes) = (number("P", p)?, number("N", n)?);
        if processes == 0 || processes > MAX_PROCESSES {
            return Err(bad(&format!("N = {processes} is outside 1..={MAX_PROCESSES}")));
        }
        if process >= processes {
            return Err(bad(&format!("P = {process} is not below N = {processes}")));
        }
        Ok(ProcessSpec { process, processes })
    }

    pub fn label(&self) -> String {
        format!("{}/{}", self.process, self.processes)
    }
}

/// The ranks of one TP run split over processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessLayout {
    pub tp: usize,
    pub spec: ProcessSpec,
}

/// Why a TP size cannot be split over `processes` processes, or `None` when it can.
pub fn split_rule(tp: usize, processes: usize) -> Option<String> {
    if processes == 0 || !tp.is_multiple_of(processes) {
        Some(format!(
            "TP{tp} cannot be split over {processes} processes: every process holds a contiguous block of TP / N ranks, so TP must be a multiple of the process count"
        ))
    } else {
        None
    }
}

impl ProcessLayout {
    /// The layout of TP `tp` for this process; the error quotes [`split_rule`].
    pub fn new(tp: usize, spec: ProcessSpec) -> Result<ProcessLayout, String> {
        match split_rule(tp, spec.processes) {
            Some(rule) => Err(rule),
            None => Ok(ProcessLayout { tp, spec }),
        }
    }

    pub fn ranks_per_process(&self) -> usize {
        self.tp / self.spec.processes
    }

    /// The process that holds global rank `g`.
    pub fn owner(&self, g: usize) -> usize {
        g / self.ranks_per_process()
    }

    /// Global rank `g` as a local rank of this process, or `None` when another process holds it.
    pub fn local(&self, g: usize) -> Option<usize> {
        (g < self.tp && self.owner(g) == self.spec.process).then(|| g % self.ranks_per_process())
    }

    /// The global rank of this process's local rank `l`.
    pub fn global(&self, l: usize) -> usize {
        self.spec.process * self.ranks_per_process() + l
    }

    /// The global ranks this process holds.
    pub fn local_ranks(&self) -> std::ops::Range<usize> {
        let k = self.ranks_per_process();
        self.spec.process * k..(self.spec.process + 1) * k
    }

    /// One line for receipts: `process 1/2 holds ranks 2..3 of TP4`.
    pub fn describe(&self) -> String {
        let r = self.local_ranks();
        format!("process {} holds rank(s) {}..{} of TP{}", self.spec.label(), r.start, r.end - 1, self.tp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(p: usize, n: usize) -> ProcessSpec {
        ProcessSpec { process: p, processes: n }
    }

    #[test]
    fn process_specs_parse_and_bad_ones_name_the_value_and_the_rule() {
        assert_eq!(ProcessSpec::parse("0/2"), Ok(spec(0, 2)));
        assert_eq!(ProcessSpec::parse("7/8"), Ok(spec(7, 8)));
        assert_eq!(ProcessSpec::parse("0/1"), Ok(spec(0, 1)));
        for (bad, why) in [
            ("2/2", "P = 2 is not below N = 2"),
            ("0/0", "N = 0 is outside 1..=8"),
            ("0/9", "N = 9 is outside 1..=8"),
            ("1", "there is no `/`"),
            ("-1/2", "P \"-1\" is not a non-negative integer"),
            ("a/2", "P \"a\" is not a non-negative integer"),
            ("0/ 2", "N \" 2\" is not a non-negative integer"),
            ("0/", "N \"\" is not a non-negative integer"),
        ] {
            let e = ProcessSpec::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains(why), "{e}");
            assert!(e.contains(ProcessSpec::RULE), "{e}");
        }
    }

    #[test]
    fn global_ranks_map_to_contiguous_blocks() {
        // TP4 over 2 processes: ranks 0,1 on process 0; 2,3 on process 1.
        let l0 = ProcessLayout::new(4, spec(0, 2)).unwrap();
        let l1 = ProcessLayout::new(4, spec(1, 2)).unwrap();
        assert_eq!(l0.ranks_per_process(), 2);
        assert_eq!((0..4).map(|g| l0.owner(g)).collect::<Vec<_>>(), [0, 0, 1, 1]);
        assert_eq!((0..4).map(|g| l0.local(g)).collect::<Vec<_>>(), [Some(0), Some(1), None, None]);
        assert_eq!((0..4).map(|g| l1.local(g)).collect::<Vec<_>>(), [None, None, Some(0), Some(1)]);
        assert_eq!(l1.global(0), 2);
        assert_eq!(l1.global(1), 3);
        assert_eq!(l1.local_ranks(), 2..4);
        assert_eq!(l1.local(4), None, "a rank past TP is nobody's");
        // Every global rank has exactly one owner, and local/global round-trip, for every split.
        for tp in [1, 2, 4, 8] {
            for n in [1, 2, 4, 8].into_iter().filter(|n| tp % n == 0) {
                for g in 0..tp {
                    let owners: Vec<usize> =
                        (0..n).filter(|p| ProcessLayout::new(tp, spec(*p, n)).unwrap().local(g).is_some()).collect();
                    assert_eq!(owners.len(), 1, "TP{tp} over {n}: rank {g} owned by {owners:?}");
                    let l = ProcessLayout::new(tp, spec(owners[0], n)).unwrap();
                    assert_eq!(l.global(l.local(g).unwrap()), g);
                }
            }
        }
        assert_eq!(ProcessLayout::new(8, spec(3, 4)).unwrap().describe(), "process 3/4 holds rank(s) 6..7 of TP8");
    }

    #[test]
    fn tp_not_a_multiple_of_the_process_count_is_refused_with_the_rule() {
        for (tp, n) in [(1, 2), (2, 4), (4, 8), (2, 3), (8, 3)] {
            let e = ProcessLayout::new(tp, spec(0, n)).unwrap_err();
            assert!(e.contains(&format!("TP{tp} cannot be split over {n} processes")), "{e}");
            assert!(e.contains("TP must be a multiple of the process count"), "{e}");
        }
        assert_eq!(split_rule(8, 4), None);
        assert_eq!(split_rule(2, 2), None);
    }
}
