//! The model's weights as the reference reads them: every element's exact value in f64 (BF16
//! widened exactly, E4M3 `decode(code) × scale` read in place), and the canonical K-block count
//! of a matrix restated from the spec — the only facts the reference takes from the model's
//! storage formats (`memra_kernels::formats` decoders, no kernel twin).

use crate::error::RuntimeError;
use crate::model::{Matrix, Model};
use crate::Result;
use memra_kernels::formats::{bf16_to_f32, e4m3_decode};
use std::ops::Range;
use std::sync::OnceLock;

/// The canonical K-block count G of docs/DESIGN.md §3.4, restated from the spec: BF16 → 8 (the width
/// must divide by 8); E4M3 → the largest of 8, 4, 2, 1 that divides the number of 128-column
/// scale blocks.
pub(super) fn kblocks(m: &Matrix) -> Result<usize> {
    match m {
        Matrix::Bf16 { in_features, .. } if in_features % 8 == 0 => Ok(8),
        Matrix::E4m3 { in_features, .. } if in_features % 128 == 0 && *in_features > 0 => {
            Ok([8, 4, 2, 1].into_iter().find(|g| (in_features / 128) % g == 0).unwrap_or(1))
        }
        other => Err(RuntimeError::ModelShape {
            rule: format!(
                "a {:?} matrix of in_features {} has no canonical K-block count (docs/DESIGN.md §3.4)",
                other.format(),
                other.in_features()
            ),
        }),
    }
}

/// A weight matrix as the reference reads it: every element's exact value. BF16 matrices are
/// widened once (exactly, `bf16_to_f32`) to f32; E4M3 matrices are read in place, element value
/// `e4m3_decode(code) × scale` of its 128×128 block, exact in f64.
pub(super) enum Weights<'a> {
    Widened { rows: usize, cols: usize, values: Vec<f32> },
    E4m3 { rows: usize, cols: usize, codes: &'a [u8], scales: &'a [f32] },
}

/// `e4m3_decode` of every code, as f64.
fn e4m3_values() -> &'static [f64; 256] {
    static VALUES: OnceLock<[f64; 256]> = OnceLock::new();
    VALUES.get_or_init(|| std::array::from_fn(|c| e4m3_decode(c as u8) as f64))
}

impl<'a> Weights<'a> {
    pub(super) fn of(m: &'a Matrix) -> Weights<'a> {
        match m {
            Matrix::Bf16 { out_features, in_features, bits } => Weights::Widened {
                rows: *out_features,
                cols: *in_features,
                values: bits.iter().map(|b| bf16_to_f32(*b)).collect(),
            },
            Matrix::E4m3 { out_features, in_features, codes, scales } => {
                Weights::E4m3 { rows: *out_features, cols: *in_features, codes, scales }
            }
        }
    }

    fn rows(&self) -> usize {
        match self {
            Weights::Widened { rows, .. } | Weights::E4m3 { rows, .. } => *rows,
        }
    }

    fn cols(&self) -> usize {
        match self {
            Weights::Widened { cols, .. } | Weights::E4m3 { cols, .. } => *cols,
        }
    }

    /// `Σ_{c ∈ cols} w[row][c] · x[c]`.
    fn row_dot(&self, row: usize, cols: Range<usize>, x: &[f64]) -> f64 {
        match self {
            Weights::Widened { cols: n, values, .. } => {
                let w = &values[row * n..(row + 1) * n];
                dot_by(&w[cols.clone()], &x[cols], |v| v as f64)
            }
            Weights::E4m3 { cols: n, codes, scales, .. } => {
                let lut = e4m3_values();
                let w = &codes[row * n..(row + 1) * n];
                let scale_row = &scales[(row / 128) * n.div_ceil(128)..];
                // Walk the columns one scale block (or the part of one inside `cols`) at a time.
                let mut sum = 0.0;
                let mut c = cols.start;
                while c < cols.end {
                    let end = ((c / 128 + 1) * 128).min(cols.end);
                    let scale = scale_row[c / 128] as f64;
                    sum += dot_by(&w[c..end], &x[c..end], |code| lut[code as usize] * scale);
                    c = end;
                }
                sum
            }
        }
    }

    /// One row as f64 values (the embedding lookup).
    pub(super) fn row(&self, row: usize) -> Vec<f64> {
        match self {
            Weights::Widened { cols: n, values, .. } => {
                values[row * n..(row + 1) * n].iter().map(|v| *v as f64).collect()
            }
            Weights::E4m3 { cols: n, codes, scales, .. } => {
                let lut = e4m3_values();
                let scale_row = &scales[(row / 128) * n.div_ceil(128)..];
                let w = &codes[row * n..(row + 1) * n];
                w.iter().enumerate().map(|(c, code)| lut[*code as usize] * scale_row[c / 128] as f64).collect()
            }
        }
    }

    /// `w · x` over every row.
    pub(super) fn matvec(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows()).map(|r| self.row_dot(r, 0..self.cols(), x)).collect()
    }

    /// Partials of `w · x` over `g` equal column blocks, laid out `[g][rows]`.
    pub(super) fn partials(&self, x: &[f64], g: usize) -> Vec<f64> {
        let (rows, width) = (self.rows(), self.cols() / g);
        let mut out = vec![0.0; g * rows];
        for k in 0..g {
            for r in 0..rows {
                out[k * rows + r] = self.row_dot(r, k * width..(k + 1) * width, x);
            }
        }
        out
    }
}

/// `Σ_i value(w_i) · x_i`. Eight running sums only for speed: in f64 the order of a ≤ 4096-term
/// sum moves the result by ~1e-15 relative, far below anything compared here.
fn dot_by<T: Copy>(w: &[T], x: &[f64], value: impl Fn(T) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(8));
    let tail: f64 = wc.remainder().iter().zip(xc.remainder()).map(|(w, x)| value(*w) * x).sum();
    for (wb, xb) in wc.zip(xc) {
        for l in 0..8 {
            acc[l] += value(wb[l]) * xb[l];
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// The model's weights as the reference reads them (BF16 matrices widened once per run).
pub(super) struct RefModel<'a> {
    pub(super) model: &'a Model,
    pub(super) embed: Weights<'a>,
    pub(super) lm_head: Weights<'a>,
    pub(super) layers: Vec<RefLayer<'a>>,
}

/// One layer's attention and router matrices (experts are read in place from the model).
pub(super) struct RefLayer<'a> {
    pub(super) wq: Weights<'a>,
    pub(super) wk: Weights<'a>,
    pub(super) wv: Weights<'a>,
    pub(super) wg: Weights<'a>,
    pub(super) wo: Weights<'a>,
    pub(super) router: Weights<'a>,
}

impl<'a> RefModel<'a> {
    pub(super) fn new(model: &'a Model) -> RefModel<'a> {
        let layers = model
            .layers
            .iter()
            .map(|l| RefLayer {
                wq: Weights::of(&l.wq),
                wk: Weights::of(&l.wk),
                wv: Weights::of(&l.wv),
                wg: Weights::of(&l.wg),
                wo: Weights::of(&l.wo),
                router: Weights::of(&l.router),
            })
            .collect();
        RefModel { model, embed: Weights::of(&model.embed), lm_head: Weights::of(&model.lm_head), layers }
    }
}
