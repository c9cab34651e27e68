//! Did-you-mean suggestions: the nearest known name to a mistyped one, by edit distance. The
//! registry (unknown door ids in `requires`), the environment edge (unknown `MEMRA_*` names) and
//! the matrix (door-set files) all suggest with the same rule.

/// Largest edit distance at which a did-you-mean suggestion is offered.
pub const MAX_SUGGESTION_DISTANCE: usize = 3;

/// The candidate nearest to `name` within [`MAX_SUGGESTION_DISTANCE`] (ties: the smallest name).
pub fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    best(name, candidates.into_iter().map(|c| (c, c)))
}

/// Nearest spelling within the limit; returns the target that spelling stands for.
pub fn best<'a>(name: &str, spellings: impl Iterator<Item = (&'a str, &'a str)>) -> Option<&'a str> {
    spellings
        .map(|(s, target)| (edit_distance(name, s), target))
        .filter(|(d, _)| *d <= MAX_SUGGESTION_DISTANCE)
        .min()
        .map(|(_, target)| target)
}

/// Damerau–Levenshtein distance (optimal string alignment: insertions, deletions,
/// substitutions and transpositions of adjacent characters each cost 1).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    for i in 0..=a.len() {
        d[i * w] = i;
    }
    for (j, cell) in d.iter_mut().enumerate().take(w) {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[(i - 1) * w + j] + 1).min(d[i * w + j - 1] + 1).min(d[(i - 1) * w + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[(i - 2) * w + j - 2] + 1);
            }
            d[i * w + j] = v;
        }
    }
    d[a.len() * w + b.len()]
}

/// A schema version as found in a file, for messages: a quoted number is called a string.
pub fn version_text(value: &str, is_string: bool) -> String {
    if is_string {
        format!("{value} (a string, not a number: write it without quotes)")
    } else {
        value.to_string()
    }
}
