//! Uploading a model to ranks: each rank receives only the shards its placement owns, in the
//! storage the run's doors ask for (BF16, the F32 mirror, NVFP4 expert banks).

use super::placement::{ExpertMode, Placement};
use crate::backend::{Backend, BufId, GroupEntry, GroupId, Slice, WeightId};
use crate::config::DoorSet;
use crate::model::matrix::MatrixShard;
use crate::model::{Expert, Layer, Matrix, Model};
use crate::Result;

/// One expert as a rank holds it: gate/up rows and down K-blocks (TP), or whole (EP).
#[derive(Debug, Clone, Copy)]
pub struct ExpertHandles {
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
    /// Intermediate rows this rank computes.
    pub width: usize,
    /// K-blocks of down this rank produces.
    pub kblocks: usize,
    /// NVFP4 per-matrix scales (gate, up, down) applied once after the row reduce.
    pub nvfp4_scales: Option<[f32; 3]>,
}

/// Per layer, per rank weight handles.
#[derive(Debug, Clone)]
pub struct LayerHandles {
    pub wq: WeightId,
    pub wk: WeightId,
    pub wv: WeightId,
    pub wg: WeightId,
    pub wo: WeightId,
    /// Indexed by expert id: `Some` when this rank holds (a shard of) the expert.
    pub experts: Vec<Option<ExpertHandles>>,
    pub shared: Option<ExpertHandles>,
    /// Root only.
    pub router: Option<WeightId>,
    /// The grouped kernels' table of what this rank holds: entries `0..experts` the routed
    /// experts, entry `experts` the shared one; `None` when the rank holds no expert at all.
    pub group: Option<GroupId>,
}

/// Every rank's weights plus the small replicated parameters.
#[derive(Debug, Clone)]
pub struct Uploaded {
    /// `layers[l][rank]`.
    pub layers: Vec<Vec<LayerHandles>>,
    pub lm_head: WeightId,
    /// Per rank: one f32 buffer with q/k norms of every layer and the RoPE table.
    pub params: Vec<BufId>,
    pub param_layout: ParamLayout,
    /// BF16 shards uploaded as their exact F32 mirror (the F32_MIRROR door's evidence).
    pub widened: u64,
    /// Bytes placed on the ranks (every shard as stored, and the parameter buffers).
    pub bytes: u64,
    /// NVFP4 banks: on the root, every layer's table of each routed expert's NVFP4 down scale
    /// (`[layers][experts]`), which NVFP4_DEV_ROUTES's combine reads by route id.
    pub down_macros: Option<BufId>,
}

impl Uploaded {
    /// Layer `l`'s down-scale table on the root (`experts` values), when the experts are NVFP4.
    pub fn down_macros(&self, l: usize, experts: usize) -> Option<Slice> {
        self.down_macros.map(|b| Slice::new(b, l * experts, experts))
    }
}

/// Offsets inside the parameter buffer (identical on every rank; root-only entries are zero
/// elsewhere).
#[derive(Debug, Clone)]
pub struct ParamLayout {
    pub hidden: usize,
    pub experts: usize,
    pub max_positions: usize,
    pub n_layers: usize,
}

impl ParamLayout {
    const HEAD: usize = 128;
    fn per_layer(&self) -> usize {
        2 * self.hidden + 2 * Self::HEAD + self.experts
    }
    fn layer_base(&self, l: usize) -> usize {
        l * self.per_layer()
    }
    pub fn attn_norm(&self, buf: BufId, l: usize) -> Slice {
        Slice::new(buf, self.layer_base(l), self.hidden)
    }
    pub fn ffn_norm(&self, buf: BufId, l: usize) -> Slice {
        Slice::new(buf, self.layer_base(l) + self.hidden, self.hidden)
    }
    pub fn q_norm(&self, buf: BufId, l: usize) -> Slice {
        Slice::new(buf, self.layer_base(l) + 2 * self.hidden, Self::HEAD)
    }
    pub fn k_norm(&self, buf: BufId, l: usize) -> Slice {
        Slice::new(buf, self.layer_base(l) + 2 * self.hidden + Self::HEAD, Self::HEAD)
    }
    pub fn router_bias(&self, buf: BufId, l: usize) -> Slice {
        Slice::new(buf, self.layer_base(l) + 2 * self.hidden + 2 * Self::HEAD, self.experts)
    }
    pub fn final_norm(&self, buf: BufId) -> Slice {
        Slice::new(buf, self.n_layers * self.per_layer(), self.hidden)
    }
    pub fn rope(&self, buf: BufId, pos: usize) -> Slice {
        Slice::new(buf, self.n_layers * self.per_layer() + self.hidden + pos * Self::HEAD, Self::HEAD)
    }
    /// GRAPH: the whole RoPE table `[max_positions][128]`, indexed on the device by position.
    pub fn rope_table(&self, buf: BufId) -> Slice {
        Slice::new(buf, self.n_layers * self.per_layer() + self.hidden, self.max_positions * Self::HEAD)
    }
    #[allow(clippy::len_without_is_empty)] // a layout is never empty: it always holds the final norm
    pub fn len(&self) -> usize {
        self.n_layers * self.per_layer() + self.hidden + self.max_positions * Self::HEAD
    }
}

/// A shard in the storage the doors ask for: the F32 mirror widens BF16 (`widen`), W8 replaces an
/// attention projection with its int8 mirror (`w8`).
fn storage(shard: MatrixShard, widen: bool, w8: bool) -> MatrixShard {
    if w8 {
        shard.to_w8()
    } else if widen {
        shard.widened()
    } else {
        shard
    }
}

fn nvfp4_scale(s: &MatrixShard) -> f32 {
    match s.data {
        crate::model::matrix::ShardData::Nvfp4 { global_scale, .. } => global_scale,
        _ => 1.0,
    }
}

/// One expert's shards as a rank will hold them (made before anything is uploaded).
struct ExpertShards {
    gate: MatrixShard,
    up: MatrixShard,
    down: MatrixShard,
    width: usize,
    kblocks: usize,
    nvfp4_scales: Option<[f32; 3]>,
}

/// One expert for `rank`: its TP shard, or whole (NVFP4 banks when `nvfp4`).
fn expert_shards(e: &Expert, p: &Placement, rank: usize, sharded: bool, nvfp4: bool) -> Result<ExpertShards> {
    let width = e.gate.out_features();
    let g = e.down.kblocks()?;
    if nvfp4 {
        let (gate, up, down) = (e.gate.to_nvfp4(), e.up.to_nvfp4(), e.down.to_nvfp4());
        let scales = [nvfp4_scale(&gate), nvfp4_scale(&up), nvfp4_scale(&down)];
        let kblocks = down.in_features / down.kblock_width;
        return Ok(ExpertShards { gate, up, down, width, kblocks, nvfp4_scales: Some(scales) });
    }
    if !sharded {
        return Ok(ExpertShards {
            gate: e.gate.whole(),
            up: e.up.whole(),
            down: e.down.whole(),
            width,
            kblocks: g,
            nvfp4_scales: None,
        });
    }
    let rows = p.rows_of(width, rank);
    let kb = p.kblocks_of(g, rank);
    let kw = width / g;
    Ok(ExpertShards {
        gate: e.gate.shard_rows(rows.clone()),
        up: e.up.shard_rows(rows.clone()),
        down: e.down.shard_cols(kb.start * kw..kb.end * kw),
        width: rows.len(),
        kblocks: kb.len(),
        nvfp4_scales: None,
    })
}

/// Whether a layer's shards are made on all cores: where it pays (a `step` layer is gigabytes);
/// a small model's upload stays on the caller's thread and leaves the other cores — and the
/// timings of the runs beside it — alone.
fn large(layer: &Layer) -> bool {
    layer.experts.iter().map(|e| e.gate.out_features() * e.gate.in_features()).sum::<usize>() >= 1 << 26
}

/// Everything one rank holds of one layer, in upload order.
struct RankLayer {
    /// q, k, v, gate, o.
    attn: [MatrixShard; 5],
    experts: Vec<Option<ExpertShards>>,
    shared: Option<ExpertShards>,
    router: Option<MatrixShard>,
}

/// The shards `rank` holds of `layer`: pure functions of the model, made on the rayon pool.
fn rank_layer(layer: &Layer, p: &Placement, doors: &DoorSet, nvfp4: bool, rank: usize) -> Result<RankLayer> {
    use rayon::prelude::*;
    let (widen, w8) = (doors.f32_mirror, doors.w8);
    let rows = |m: &Matrix| storage(m.shard_rows(p.rows_of(m.out_features(), rank)), widen, w8);
    let o_kw = layer.wo.in_features() / p.o_kblocks;
    let kb = p.kblocks_of(p.o_kblocks, rank);
    let attn = [
        rows(&layer.wq),
        rows(&layer.wk),
        rows(&layer.wv),
        rows(&layer.wg),
        storage(layer.wo.shard_cols(kb.start * o_kw..kb.end * o_kw), widen, w8),
    ];
    let n = layer.experts.len();
    let held = |(e, ex): (usize, &Expert)| match p.experts {
        ExpertMode::TensorParallel => expert_shards(ex, p, rank, true, false).map(Some),
        ExpertMode::ExpertParallel if p.expert_owner(e, n) == rank => {
            expert_shards(ex, p, rank, false, nvfp4).map(Some)
        }
        ExpertMode::Interleaved2 if p.expert_owner(e, n) == rank => expert_shards(ex, p, rank, false, true).map(Some),
        _ => Ok(None),
    };
    let experts = if large(layer) {
        layer.experts.par_iter().enumerate().map(held).collect::<Result<Vec<_>>>()?
    } else {
        layer.experts.iter().enumerate().map(held).collect::<Result<Vec<_>>>()?
    };
    let shared = if p.shared_sharded {
        Some(expert_shards(&layer.shared, p, rank, true, false)?)
    } else if rank == 0 {
        Some(expert_shards(&layer.shared, p, rank, false, false)?)
    } else {
        None
    };
    let router = (rank == 0).then(|| storage(layer.router.whole(), widen, false));
    Ok(RankLayer { attn, experts, shared, router })
}

/// Uploads to one rank, counting bytes and F32-mirror widenings.
struct Uploader<'b> {
    b: &'b mut dyn Backend,
    bytes: u64,
    widened: u64,
}

impl Uploader<'_> {
    fn put(&mut self, rank: usize, shard: MatrixShard) -> Result<WeightId> {
        self.bytes += shard.bytes() as u64;
        if matches!(shard.data, crate::model::matrix::ShardData::F32(_)) {
            self.widened += 1;
        }
        self.b.upload_weight_owned(rank, shard)
    }

    fn expert(&mut self, rank: usize, s: ExpertShards) -> Result<ExpertHandles> {
        let (width, kblocks, nvfp4_scales) = (s.width, s.kblocks, s.nvfp4_scales);
        // NVFP4 banks are not the F32 mirror's business: counted as uploaded, never as widened.
        Ok(ExpertHandles {
            gate: self.put(rank, s.gate)?,
            up: self.put(rank, s.up)?,
            down: self.put(rank, s.down)?,
            width,
            kblocks,
            nvfp4_scales,
        })
    }
}

/// Upload every weight of `model` to the ranks of `b` according to `p` and `doors`.
/// `nvfp4`: routed experts are uploaded as NVFP4 banks (whole, on their owners). `positions`:
/// the RoPE rows the run needs (its longest prompt), at most the model's `max_positions`.
///
/// A layer's shards for every rank are made first, on all cores (slicing, widening and
/// re-quantizing are pure functions of the model), then uploaded in the fixed order rank by rank.
pub fn upload(
    b: &mut dyn Backend,
    model: &Model,
    p: &Placement,
    doors: &DoorSet,
    nvfp4: bool,
    positions: usize,
) -> Result<Uploaded> {
    use rayon::prelude::*;
    let c = &model.config;
    let layout = ParamLayout {
        hidden: c.hidden,
        experts: c.experts,
        max_positions: positions.min(c.max_positions),
        n_layers: model.layers.len(),
    };
    let mut params_host = vec![0.0f32; layout.len()];
    let scratch = 0; // a buffer id placeholder for slice arithmetic on the host copy
    for (l, layer) in model.layers.iter().enumerate() {
        let put = |v: &mut Vec<f32>, s: Slice, data: &[f32]| v[s.offset..s.offset + s.len].copy_from_slice(data);
        put(&mut params_host, layout.attn_norm(scratch, l), &layer.attn_norm);
        put(&mut params_host, layout.ffn_norm(scratch, l), &layer.ffn_norm);
        put(&mut params_host, layout.q_norm(scratch, l), &layer.q_norm);
        put(&mut params_host, layout.k_norm(scratch, l), &layer.k_norm);
        put(&mut params_host, layout.router_bias(scratch, l), &layer.router_bias);
    }
    let fnorm = layout.final_norm(scratch);
    params_host[fnorm.offset..fnorm.offset + fnorm.len].copy_from_slice(&model.final_norm);
    for pos in 0..layout.max_positions {
        let s = layout.rope(scratch, pos);
        params_host[s.offset..s.offset + s.len].copy_from_slice(&model.rope_row(pos));
    }
    let mut params = Vec::new();
    for rank in 0..p.tp {
        let buf = b.alloc(rank, layout.len())?;
        b.write(rank, Slice::new(buf, 0, layout.len()), &params_host)?;
        params.push(buf);
    }

    let mut up = Uploader { b, bytes: 0, widened: 0 };
    let mut layers = Vec::new();
    // Every expert lives whole on one owner under NVFP4: its down scale is read from there. NaN
    // marks an expert no rank holds (none should be), so a route to it could not pass unseen.
    let mut macros = vec![f32::NAN; if nvfp4 { model.layers.len() * c.experts } else { 0 }];
    for (l, layer) in model.layers.iter().enumerate() {
        let make = |rank| rank_layer(layer, p, doors, nvfp4, rank);
        let shards: Vec<RankLayer> = if large(layer) {
            (0..p.tp).into_par_iter().map(make).collect::<Result<_>>()?
        } else {
            (0..p.tp).map(make).collect::<Result<_>>()?
        };
        for s in &shards {
            // Only NVFP4 banks carry scales (and only then is the table non-empty).
            for (e, ex) in s.experts.iter().enumerate() {
                if let Some([_, _, sd]) = ex.as_ref().and_then(|x| x.nvfp4_scales) {
                    macros[l * c.experts + e] = sd;
                }
            }
        }
        let mut per_rank = Vec::new();
        for (rank, s) in shards.into_iter().enumerate() {
            let [q, k, v, g, o] = s.attn;
            let (wq, wk, wv, wg, wo) =
                (up.put(rank, q)?, up.put(rank, k)?, up.put(rank, v)?, up.put(rank, g)?, up.put(rank, o)?);
            let experts =
                s.experts.into_iter().map(|e| e.map(|e| up.expert(rank, e)).transpose()).collect::<Result<Vec<_>>>()?;
            let shared = s.shared.map(|e| up.expert(rank, e)).transpose()?;
            let router = s.router.map(|r| up.put(0, r)).transpose()?;
            let entries: Vec<Option<GroupEntry>> = experts
                .iter()
                .chain(std::iter::once(&shared))
                .map(|h| h.map(|h| GroupEntry { gate: h.gate, up: h.up, down: h.down, nvfp4_scales: h.nvfp4_scales }))
                .collect();
            let group = if entries.iter().any(Option::is_some) {
                Some(up.b.register_experts(rank, layer.experts.len(), &entries)?)
            } else {
                None
            };
            per_rank.push(LayerHandles { wq, wk, wv, wg, wo, experts, shared, router, group });
        }
        layers.push(per_rank);
    }
    let lm_head = up.put(0, storage(model.lm_head.whole(), doors.f32_mirror, false))?;
    let down_macros = if nvfp4 {
        let buf = up.b.alloc(0, macros.len())?;
        up.b.write(0, Slice::new(buf, 0, macros.len()), &macros)?;
        Some(buf)
    } else {
        None
    };
    let bytes = up.bytes + (layout.len() * 4 * p.tp + macros.len() * 4) as u64;
    Ok(Uploaded { layers, lm_head, params, param_layout: layout, widened: up.widened, bytes, down_macros })
}
