//! RMSNorm kernels: plain, and fused residual add + RMSNorm (the OPROJ_TAIL fusion keeps the
//! operand order `h = x + a` then the canonical RMSNorm of h).

/// Row-wise canonical RMSNorm (`crate::canon::rmsnorm_c`) of a `[rows][width]` batch.
pub fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    todo!("helper B: {} {} {eps} {}", x.len(), w.len(), y.len())
}

/// `h[i] = x[i] + a[i]` (operand order fixed), then `y = rmsnorm(h)`.
pub fn add_rmsnorm(x: &[f32], a: &[f32], w: &[f32], eps: f32, h: &mut [f32], y: &mut [f32]) {
    todo!("helper B: {} {} {} {eps} {} {}", x.len(), a.len(), w.len(), h.len(), y.len())
}
