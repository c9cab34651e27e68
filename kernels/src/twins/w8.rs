//! The W8 door's arithmetic (NUMERIC-CLASS): an int8 weight mirror with one f32 scale per 32
//! consecutive values of a row, and int8 activations quantized per 32 at every GEMV.
//!
//! Quantization (weights and activations alike): per group of 32, `scale = amax / 127` (1.0 for
//! an all-zero group), `q = clamp(round_half_even(v / scale), −127, 127)`.
//! Dot product: per group g, `isum = Σ q_w · q_x` in exact i32; a K-block partial folds its groups
//! in column order from +0.0 as `acc = acc + (isum as f32) * (ws_g * xs_g)` (the scale product
//! rounded first). A row is the canonical fold of its K-block partials, as for every matrix.

// `acc = acc + x` is written out: the operand order is the contract the CUDA twin reproduces.
#![allow(clippy::assign_op_pattern)]

/// Values per int8 scale.
pub const W8_GROUP: usize = 32;

/// Quantize a row-major `[rows][cols]` f32 matrix (or a vector with rows = 1); `cols % 32 == 0`.
pub fn w8_quantize(v: &[f32], cols: usize) -> (Vec<i8>, Vec<f32>) {
    assert!(
        cols.is_multiple_of(W8_GROUP) && v.len().is_multiple_of(cols.max(1)),
        "w8: {} values do not form rows of {cols} in groups of 32",
        v.len()
    );
    let mut q = Vec::with_capacity(v.len());
    let mut scales = Vec::with_capacity(v.len() / W8_GROUP);
    for g in v.chunks_exact(W8_GROUP) {
        let amax = g.iter().fold(0.0f32, |m, x| if x.abs() > m { x.abs() } else { m });
        let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
        scales.push(scale);
        q.extend(g.iter().map(|x| (x / scale).round_ties_even().clamp(-127.0, 127.0) as i8));
    }
    (q, scales)
}

/// A W8 matrix view: `q` `[rows][cols]`, `scales` `[rows][cols / 32]`.
#[derive(Debug, Clone, Copy)]
pub struct W8View<'a> {
    pub q: &'a [i8],
    pub scales: &'a [f32],
    pub out_features: usize,
    pub in_features: usize,
    pub kblock_width: usize,
}

impl<'a> W8View<'a> {
    /// Rows `rows` as a view of their own (like `MatrixView::rows`: a row is computed from its
    /// own storage, so sub-views give the same bits).
    ///
    /// # Panics
    /// If `rows` is not inside `0..out_features`.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> W8View<'a> {
        assert!(
            rows.start <= rows.end && rows.end <= self.out_features,
            "W8View::rows: {rows:?} is not inside the view's {} rows",
            self.out_features
        );
        let (cols, groups) = (self.in_features, self.in_features / W8_GROUP);
        W8View {
            q: &self.q[rows.start * cols..rows.end * cols],
            scales: &self.scales[rows.start * groups..rows.end * groups],
            out_features: rows.len(),
            ..*self
        }
    }
}

fn group_dot(w: &[i8], x: &[i8]) -> i32 {
    w.iter().zip(x).map(|(a, b)| *a as i32 * *b as i32).sum()
}

fn partial(m: &W8View, xq: &[i8], xs: &[f32], r: usize, k: usize) -> f32 {
    let groups = m.kblock_width / W8_GROUP;
    let row_groups = m.in_features / W8_GROUP;
    let mut acc = 0.0f32;
    for (g, xscale) in xs.iter().enumerate().take((k + 1) * groups).skip(k * groups) {
        let c = g * W8_GROUP;
        let w = &m.q[r * m.in_features + c..][..W8_GROUP];
        let isum = group_dot(w, &xq[c..c + W8_GROUP]);
        acc = acc + (isum as f32) * (m.scales[r * row_groups + g] * xscale);
    }
    acc
}

fn check(m: &W8View, x: &[f32]) -> usize {
    assert_eq!(x.len(), m.in_features, "w8 gemv: x has {} values, the view {} columns", x.len(), m.in_features);
    assert!(
        m.kblock_width.is_multiple_of(W8_GROUP),
        "w8 gemv: K-block width {} is not whole groups of 32",
        m.kblock_width
    );
    assert_eq!(m.q.len(), m.out_features * m.in_features, "w8 gemv: storage does not match the view");
    m.in_features / m.kblock_width
}

/// K-block partials `out[k * rows + r]` (as `gemv::gemv_partials`).
pub fn w8_partials(m: &W8View, x: &[f32], out: &mut [f32]) {
    let nk = check(m, x);
    let (xq, xs) = w8_quantize(x, m.in_features);
    for r in 0..m.out_features {
        for k in 0..nk {
            out[k * m.out_features + r] = partial(m, &xq, &xs, r, k);
        }
    }
}

/// Whole rows: the canonical fold of each row's K-block partials from +0.0.
pub fn w8_rows(m: &W8View, x: &[f32], out: &mut [f32]) {
    let nk = check(m, x);
    let (xq, xs) = w8_quantize(x, m.in_features);
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for k in 0..nk {
            acc = acc + partial(m, &xq, &xs, r, k);
        }
        *o = acc;
    }
}
