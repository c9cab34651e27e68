//! Shapes the program moves and digests, computed from a model configuration alone: the byte
//! sizes of the program's cross-rank copies (the byte-integrity probe copies exactly these, beside
//! its ladder of sizes, docs/DESIGN.md §3.5) and the element ranges a seam's logical tensor holds
//! (where a canary may plant its flipped bit).

use std::ops::Range;

use memra_kernels::twins::gemv::{canonical_kblocks, WeightFormat};

use crate::evidence::record::Seam;
use crate::model::ModelConfig;
use crate::Result;

/// K-block counts of the o_proj, the routed and the shared down projections (E4M3 banks).
fn kblocks(c: &ModelConfig) -> Result<(usize, usize, usize)> {
    let g = |f, w| canonical_kblocks(f, w).map_err(crate::RuntimeError::from);
    Ok((
        g(WeightFormat::Bf16, c.q_width())?,
        g(WeightFormat::E4m3, c.expert_width)?,
        g(WeightFormat::E4m3, c.shared_width)?,
    ))
}

/// Byte sizes of every cross-rank copy a TP `tp` run of `c` can issue (sorted, each once): the
/// replicated rows (attn_norm, ffn_norm), the route ids and weights, each rank's o_proj partials,
/// each rank's expert partials of a routed or shared slot, the folded slots of an owner and an
/// owner's sum.
pub fn copy_payload_bytes(c: &ModelConfig, tp: usize) -> Result<Vec<usize>> {
    let (g_o, g_r, g_s) = kblocks(c)?;
    let h = c.hidden;
    let mut elems = vec![h, c.top_k, c.top_k * h];
    for g in [g_o, g_r, g_s] {
        if g % tp == 0 {
            elems.push(g / tp * h);
        }
    }
    let mut bytes: Vec<usize> = elems.into_iter().filter(|e| *e > 0).map(|e| e * 4).collect();
    bytes.sort_unstable();
    bytes.dedup();
    Ok(bytes)
}

/// The element ranges of seam `seam`'s logical tensor that some rank holds (docs/DESIGN.md §3.2);
/// only the experts seam has gaps (each slot's K-block partials at a stride of the larger G).
pub fn seam_elements(c: &ModelConfig, seam: Seam) -> Result<Vec<Range<usize>>> {
    let (g_o, g_r, g_s) = kblocks(c)?;
    let (h, k) = (c.hidden, c.top_k);
    // One range covering the whole tensor (`std::iter::once`: a one-element list of ranges).
    let one = |n: usize| Ok(std::iter::once(0..n).collect());
    match seam {
        Seam::AttnNorm | Seam::OJoin | Seam::Residual | Seam::FinalNorm => one(h),
        Seam::Qkv => one(c.q_width() + 2 * c.kv_width() + c.q_heads),
        Seam::Rope => one(c.q_width() + c.kv_width()),
        Seam::Attn => one(c.q_width()),
        Seam::OProj => one(g_o * h),
        Seam::FfnNorm | Seam::MoeJoin => one(2 * h),
        Seam::Router => one(2 * k),
        Seam::Logits => one(c.vocab),
        Seam::Experts => {
            let stride = g_r.max(g_s) * h;
            let mut v: Vec<Range<usize>> = (0..k).map(|s| s * stride..s * stride + g_r * h).collect();
            v.push(k * stride..k * stride + g_s * h);
            Ok(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_shapes() {
        let c = ModelConfig::preset("tiny", None).unwrap();
        assert_eq!(copy_payload_bytes(&c, 2).unwrap(), vec![8, 4096, 8192, 16384]);
        assert_eq!(copy_payload_bytes(&c, 8).unwrap(), vec![8, 4096, 8192]);
        let e = seam_elements(&c, Seam::Experts).unwrap();
        assert_eq!(e, vec![0..8192, 8192..16384, 16384..24576]);
        assert_eq!(seam_elements(&c, Seam::Router).unwrap(), std::iter::once(0..4).collect::<Vec<_>>());
    }
}
