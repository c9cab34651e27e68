//! Uploading a model to ranks: each rank receives only the shards its placement owns, in the
//! storage the run's doors ask for (BF16, the F32 mirror, NVFP4 expert banks).

use super::placement::{ExpertMode, Placement};
use crate::backend::{Backend, BufId, GroupEntry, GroupId, Slice, WeightId};
use crate::config::DoorSet;
use crate::model::matrix::MatrixShard;
use crate::model::{Expert, Matrix, Model};
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

/// Upload a shard in the storage the doors ask for, counting F32-mirror widenings.
fn store(b: &mut dyn Backend, rank: usize, shard: MatrixShard, doors: &DoorSet, widened: &mut u64) -> Result<WeightId> {
    let shard = if doors.f32_mirror { shard.widened() } else { shard };
    if matches!(shard.data, crate::model::matrix::ShardData::F32(_)) {
        *widened += 1;
    }
    b.upload_weight(rank, &shard)
}

/// An attention projection: the W8 door replaces it with its int8 mirror.
fn store_attn(
    b: &mut dyn Backend,
    rank: usize,
    shard: MatrixShard,
    doors: &DoorSet,
    widened: &mut u64,
) -> Result<WeightId> {
    if doors.w8 {
        b.upload_weight(rank, &shard.to_w8())
    } else {
        store(b, rank, shard, doors, widened)
    }
}

fn nvfp4_scale(s: &MatrixShard) -> f32 {
    match s.data {
        crate::model::matrix::ShardData::Nvfp4 { global_scale, .. } => global_scale,
        _ => 1.0,
    }
}

/// Upload one expert to `rank`: its TP shard, or whole.
fn upload_expert(
    b: &mut dyn Backend,
    rank: usize,
    e: &Expert,
    p: &Placement,
    sharded: bool,
    nvfp4: bool,
) -> Result<ExpertHandles> {
    let width = e.gate.out_features();
    let g = e.down.kblocks()?;
    if nvfp4 {
        let (gate, up, down) = (e.gate.to_nvfp4(), e.up.to_nvfp4(), e.down.to_nvfp4());
        let scales = [nvfp4_scale(&gate), nvfp4_scale(&up), nvfp4_scale(&down)];
        return Ok(ExpertHandles {
            gate: b.upload_weight(rank, &gate)?,
            up: b.upload_weight(rank, &up)?,
            down: b.upload_weight(rank, &down)?,
            width,
            kblocks: down.in_features / down.kblock_width,
            nvfp4_scales: Some(scales),
        });
    }
    if !sharded {
        return Ok(ExpertHandles {
            gate: b.upload_weight(rank, &e.gate.whole())?,
            up: b.upload_weight(rank, &e.up.whole())?,
            down: b.upload_weight(rank, &e.down.whole())?,
            width,
            kblocks: g,
            nvfp4_scales: None,
        });
    }
    let rows = p.rows_of(width, rank);
    let kb = p.kblocks_of(g, rank);
    let kw = width / g;
    Ok(ExpertHandles {
        gate: b.upload_weight(rank, &e.gate.shard_rows(rows.clone()))?,
        up: b.upload_weight(rank, &e.up.shard_rows(rows.clone()))?,
        down: b.upload_weight(rank, &e.down.shard_cols(kb.start * kw..kb.end * kw))?,
        width: rows.len(),
        kblocks: kb.len(),
        nvfp4_scales: None,
    })
}

fn shard_rows(m: &Matrix, p: &Placement, rank: usize) -> MatrixShard {
    m.shard_rows(p.rows_of(m.out_features(), rank))
}

/// Upload every weight of `model` to the ranks of `b` according to `p` and `doors`.
/// `nvfp4`: routed experts are uploaded as NVFP4 banks (whole, on their owners). `positions`:
/// the RoPE rows the run needs (its longest prompt), at most the model's `max_positions`.
pub fn upload(
    b: &mut dyn Backend,
    model: &Model,
    p: &Placement,
    doors: &DoorSet,
    nvfp4: bool,
    positions: usize,
) -> Result<Uploaded> {
    let c = &model.config;
    let mut widened = 0u64;
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

    let mut layers = Vec::new();
    for layer in &model.layers {
        let mut per_rank = Vec::new();
        for rank in 0..p.tp {
            let o_g = p.o_kblocks;
            let o_kw = layer.wo.in_features() / o_g;
            let kb = p.kblocks_of(o_g, rank);
            let wq = store_attn(b, rank, shard_rows(&layer.wq, p, rank), doors, &mut widened)?;
            let wk = store_attn(b, rank, shard_rows(&layer.wk, p, rank), doors, &mut widened)?;
            let wv = store_attn(b, rank, shard_rows(&layer.wv, p, rank), doors, &mut widened)?;
            let wg = store_attn(b, rank, shard_rows(&layer.wg, p, rank), doors, &mut widened)?;
            let wo = store_attn(b, rank, layer.wo.shard_cols(kb.start * o_kw..kb.end * o_kw), doors, &mut widened)?;
            let mut experts = Vec::with_capacity(layer.experts.len());
            for (e, ex) in layer.experts.iter().enumerate() {
                let held = match p.experts {
                    ExpertMode::TensorParallel => Some(upload_expert(b, rank, ex, p, true, false)?),
                    ExpertMode::ExpertParallel if p.expert_owner(e, layer.experts.len()) == rank => {
                        Some(upload_expert(b, rank, ex, p, false, nvfp4)?)
                    }
                    ExpertMode::Interleaved2 if p.expert_owner(e, layer.experts.len()) == rank => {
                        Some(upload_expert(b, rank, ex, p, false, true)?)
                    }
                    _ => None,
                };
                experts.push(held);
            }
            let shared = if p.shared_sharded {
                Some(upload_expert(b, rank, &layer.shared, p, true, false)?)
            } else if rank == 0 {
                Some(upload_expert(b, rank, &layer.shared, p, false, false)?)
            } else {
                None
            };
            let router = if rank == 0 { Some(store(b, 0, layer.router.whole(), doors, &mut widened)?) } else { None };
            let entries: Vec<Option<GroupEntry>> = experts
                .iter()
                .chain(std::iter::once(&shared))
                .map(|h| h.map(|h| GroupEntry { gate: h.gate, up: h.up, down: h.down, nvfp4_scales: h.nvfp4_scales }))
                .collect();
            let group = if entries.iter().any(Option::is_some) {
                Some(b.register_experts(rank, layer.experts.len(), &entries)?)
            } else {
                None
            };
            per_rank.push(LayerHandles { wq, wk, wv, wg, wo, experts, shared, router, group });
        }
        layers.push(per_rank);
    }
    let lm_head = store(b, 0, model.lm_head.whole(), doors, &mut widened)?;
    Ok(Uploaded { layers, lm_head, params, param_layout: layout, widened })
}
