//! RMSNorm kernels: plain, and fused residual add + RMSNorm (the OPROJ_TAIL fusion keeps the
//! operand order `h = x + a` then the canonical RMSNorm of h).
//!
//! The row sum of squares is the 256-lane block order of `canon::sum_squares256` (fast on a
//! device: a whole thread block works on one row), not the 32-lane dot32 order.
//!
//! Both exist as separate twins because the fused kernel must prove, bit for bit, that fusing
//! the o_join add into the norm changed nothing: its `h` and `y` must equal an add kernel
//! followed by `rmsnorm_rows`.

use crate::canon::rmsnorm_row_c;

/// Row-wise canonical RMSNorm (`crate::canon::rmsnorm_row_c`) of a `[rows][width]` batch.
///
/// `width = w.len()` and `rows = x.len() / width`; `x.len()` must be a whole number of rows and
/// `y.len() == x.len()` (both checked, a violation panics: it is a caller bug, not data).
pub fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let width = w.len();
    check_rows("rmsnorm_rows", x.len(), width);
    assert_eq!(y.len(), x.len(), "rmsnorm_rows: y has {} elements, x has {}", y.len(), x.len());
    if width == 0 {
        return;
    }
    for (xr, yr) in x.chunks_exact(width).zip(y.chunks_exact_mut(width)) {
        rmsnorm_row_c(xr, w, eps, yr);
    }
}

/// `h[i] = x[i] + a[i]` (operand order fixed), then `y = rmsnorm(h)`.
///
/// Like [`rmsnorm_rows`], `x` may hold several rows of `w.len()`; each row of `h` is normalised
/// on its own. `a`, `h` and `y` have the length of `x`.
pub fn add_rmsnorm(x: &[f32], a: &[f32], w: &[f32], eps: f32, h: &mut [f32], y: &mut [f32]) {
    let width = w.len();
    check_rows("add_rmsnorm", x.len(), width);
    assert_eq!(a.len(), x.len(), "add_rmsnorm: a has {} elements, x has {}", a.len(), x.len());
    assert_eq!(h.len(), x.len(), "add_rmsnorm: h has {} elements, x has {}", h.len(), x.len());
    assert_eq!(y.len(), x.len(), "add_rmsnorm: y has {} elements, x has {}", y.len(), x.len());
    for ((hi, xi), ai) in h.iter_mut().zip(x).zip(a) {
        *hi = *xi + *ai;
    }
    rmsnorm_rows(h, w, eps, y);
}

fn check_rows(what: &str, n: usize, width: usize) {
    if width == 0 {
        assert_eq!(n, 0, "{what}: empty weight but {n} input elements");
    } else {
        assert_eq!(n % width, 0, "{what}: {n} input elements are not whole rows of width {width}");
    }
}
