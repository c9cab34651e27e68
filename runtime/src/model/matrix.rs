//! A weight matrix in its storage format, and the shard views ranks hold.

use memra_kernels::twins::gemv::{MatrixView, WeightFormat, WeightRef};

/// A `[out][in]` matrix as stored.
#[derive(Debug, Clone, PartialEq)]
pub enum Matrix {
    Bf16 { out_features: usize, in_features: usize, bits: Vec<u16> },
    E4m3 { out_features: usize, in_features: usize, codes: Vec<u8>, scales: Vec<f32> },
}

impl Matrix {
    pub fn out_features(&self) -> usize {
        match self {
            Matrix::Bf16 { out_features, .. } | Matrix::E4m3 { out_features, .. } => *out_features,
        }
    }
    pub fn in_features(&self) -> usize {
        match self {
            Matrix::Bf16 { in_features, .. } | Matrix::E4m3 { in_features, .. } => *in_features,
        }
    }
    pub fn format(&self) -> WeightFormat {
        match self {
            Matrix::Bf16 { .. } => WeightFormat::Bf16,
            Matrix::E4m3 { .. } => WeightFormat::E4m3,
        }
    }
    /// The canonical K-block count G of this matrix (DESIGN.md §3.4).
    pub fn kblocks(&self) -> Result<usize, memra_kernels::KernelError> {
        memra_kernels::twins::gemv::canonical_kblocks(self.format(), self.in_features())
    }

    /// Rows `rows` with every column (a column-parallel shard). For E4M3 the scale rows that
    /// cover the range are kept and `row0` records the first global row.
    pub fn shard_rows(&self, rows: std::ops::Range<usize>) -> MatrixShard {
        todo!("helper E: {rows:?}")
    }

    /// Every row over columns `cols` (a row-parallel shard of whole K-blocks), repacked
    /// row-major over the local columns.
    pub fn shard_cols(&self, cols: std::ops::Range<usize>) -> MatrixShard {
        todo!("helper E: {cols:?}")
    }
}

/// What a rank holds of a matrix: a contiguous rectangle, stored row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixShard {
    pub out_features: usize,
    pub in_features: usize,
    /// Width of one canonical K-block of the FULL matrix.
    pub kblock_width: usize,
    pub data: ShardData,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ShardData {
    Bf16(Vec<u16>),
    F32(Vec<f32>),
    E4m3 { codes: Vec<u8>, scales: Vec<f32>, row0: usize },
    Nvfp4 { packed: Vec<u8>, scales: Vec<u8>, global_scale: f32 },
}

impl MatrixShard {
    pub fn view(&self) -> MatrixView<'_> {
        let w = match &self.data {
            ShardData::Bf16(b) => WeightRef::Bf16(b),
            ShardData::F32(v) => WeightRef::F32(v),
            ShardData::E4m3 { codes, scales, row0 } => WeightRef::E4m3 { codes, scales, row0: *row0 },
            ShardData::Nvfp4 { packed, scales, .. } => WeightRef::Nvfp4 { packed, scales },
        };
        MatrixView { w, out_features: self.out_features, in_features: self.in_features, kblock_width: self.kblock_width }
    }

    /// The F32 mirror of a BF16 shard (exact widening); other formats are returned unchanged.
    pub fn widened(&self) -> MatrixShard {
        match &self.data {
            ShardData::Bf16(b) => MatrixShard {
                data: ShardData::F32(b.iter().map(|x| memra_kernels::formats::bf16_to_f32(*x)).collect()),
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// Bytes a kernel reads to apply this shard once.
    pub fn bytes(&self) -> usize {
        match &self.data {
            ShardData::Bf16(b) => b.len() * 2,
            ShardData::F32(v) => v.len() * 4,
            ShardData::E4m3 { codes, scales, .. } => codes.len() + scales.len() * 4,
            ShardData::Nvfp4 { packed, scales, .. } => packed.len() + scales.len(),
        }
    }
}
