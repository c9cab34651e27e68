//! A weight matrix in its storage format, and the shard views ranks hold.

use crate::error::RuntimeError;
use memra_kernels::formats::{bf16_to_f32, e4m3_block_dequant, Nvfp4Matrix, E4M3_BLOCK};
use memra_kernels::twins::gemv::{canonical_kblocks, MatrixView, WeightFormat, WeightRef};

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
    /// The canonical K-block count G of this matrix (docs/DESIGN.md §3.4).
    pub fn kblocks(&self) -> Result<usize, memra_kernels::KernelError> {
        memra_kernels::twins::gemv::canonical_kblocks(self.format(), self.in_features())
    }

    /// Rows `rows` with every column (a column-parallel shard). For E4M3 the scale rows that
    /// cover the range are kept and `row0` records the first global row.
    ///
    /// # Panics
    /// If `rows` is not inside `0..out_features` or the matrix has no canonical K-block count;
    /// [`Matrix::try_shard_rows`] returns those as errors.
    pub fn shard_rows(&self, rows: std::ops::Range<usize>) -> MatrixShard {
        self.try_shard_rows(rows).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every row over columns `cols` (a row-parallel shard of whole K-blocks), repacked
    /// row-major over the local columns.
    ///
    /// # Panics
    /// If `cols` does not start and end on canonical K-block boundaries (and, for E4M3, on
    /// 128-column scale-block boundaries) inside `0..in_features`; [`Matrix::try_shard_cols`]
    /// returns that as an error.
    pub fn shard_cols(&self, cols: std::ops::Range<usize>) -> MatrixShard {
        self.try_shard_cols(cols).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The whole matrix as one shard (rows `0..out_features`).
    pub fn whole(&self) -> MatrixShard {
        self.shard_rows(0..self.out_features())
    }

    /// Width of one canonical K-block of this (full) matrix: `in_features / G`.
    pub fn kblock_width(&self) -> Result<usize, RuntimeError> {
        let g = self.kblocks()?;
        Ok(self.in_features() / g)
    }

    /// [`Matrix::shard_rows`], with a bad range returned as an error.
    pub fn try_shard_rows(&self, rows: std::ops::Range<usize>) -> Result<MatrixShard, RuntimeError> {
        let (out_f, in_f) = (self.out_features(), self.in_features());
        if rows.start > rows.end || rows.end > out_f {
            return Err(RuntimeError::Contract(format!(
                "row shard {rows:?} is not inside the {out_f} rows of a [{out_f}, {in_f}] matrix"
            )));
        }
        let kblock_width = self.kblock_width()?;
        let n_rows = rows.end - rows.start;
        let data = match self {
            Matrix::Bf16 { bits, .. } => ShardData::Bf16(bits[rows.start * in_f..rows.end * in_f].to_vec()),
            Matrix::E4m3 { codes, scales, .. } => {
                let scale_cols = in_f.div_ceil(E4M3_BLOCK);
                // Scale rows covering global rows start..end; an empty shard keeps none.
                let scale_rows =
                    if n_rows == 0 { 0..0 } else { rows.start / E4M3_BLOCK..(rows.end - 1) / E4M3_BLOCK + 1 };
                ShardData::E4m3 {
                    codes: codes[rows.start * in_f..rows.end * in_f].to_vec(),
                    scales: scales[scale_rows.start * scale_cols..scale_rows.end * scale_cols].to_vec(),
                    row0: rows.start,
                }
            }
        };
        Ok(MatrixShard { out_features: n_rows, in_features: in_f, kblock_width, data })
    }

    /// [`Matrix::shard_cols`], with a range off the K-block grid returned as an error.
    pub fn try_shard_cols(&self, cols: std::ops::Range<usize>) -> Result<MatrixShard, RuntimeError> {
        let (out_f, in_f) = (self.out_features(), self.in_features());
        let kblock_width = self.kblock_width()?;
        let on_grid = |c: usize| c.is_multiple_of(kblock_width) || c == in_f;
        if cols.start > cols.end || cols.end > in_f || !on_grid(cols.start) || !on_grid(cols.end) {
            return Err(RuntimeError::ModelShape {
                rule: format!(
                    "column shard {cols:?} of a [{out_f}, {in_f}] matrix is not a range of whole canonical K-blocks \
                     (K-block width {kblock_width})"
                ),
            });
        }
        let n_cols = cols.end - cols.start;
        let data = match self {
            Matrix::Bf16 { bits, .. } => ShardData::Bf16(gather_cols(bits, in_f, &cols)),
            Matrix::E4m3 { codes, scales, .. } => {
                let on_scale_grid = |c: usize| c.is_multiple_of(E4M3_BLOCK) || c == in_f;
                if !on_scale_grid(cols.start) || !on_scale_grid(cols.end) {
                    return Err(RuntimeError::ModelShape {
                        rule: format!(
                            "column shard {cols:?} of a [{out_f}, {in_f}] E4M3 matrix does not start and end on \
                             {E4M3_BLOCK}-column scale-block boundaries"
                        ),
                    });
                }
                let scale_cols = in_f.div_ceil(E4M3_BLOCK);
                let local = cols.start / E4M3_BLOCK..cols.end.div_ceil(E4M3_BLOCK);
                let local_scales = (0..out_f.div_ceil(E4M3_BLOCK))
                    .flat_map(|br| scales[br * scale_cols + local.start..br * scale_cols + local.end].iter().copied())
                    .collect();
                ShardData::E4m3 { codes: gather_cols(codes, in_f, &cols), scales: local_scales, row0: 0 }
            }
        };
        Ok(MatrixShard { out_features: out_f, in_features: n_cols, kblock_width, data })
    }

    /// The row-major f32 values of the matrix (BF16 widened exactly; E4M3 `decode(code) × scale`).
    pub fn dequantize(&self) -> Vec<f32> {
        match self {
            Matrix::Bf16 { bits, .. } => bits.iter().map(|b| bf16_to_f32(*b)).collect(),
            Matrix::E4m3 { out_features, in_features, codes, scales } => {
                e4m3_block_dequant(codes, scales, *out_features, *in_features)
            }
        }
    }

    /// The matrix re-quantized to NVFP4 (the `MEMRA_STEP_NVFP4_EP2` expert banks): dequantize
    /// exactly, then [`Nvfp4Matrix::quantize`]; the K-block width is NVFP4's
    /// (`canonical_kblocks(Nvfp4, in)`), the per-matrix scale travels in the shard.
    ///
    /// # Panics
    /// If the matrix cannot be NVFP4 (in_features not a multiple of 16, non-finite values);
    /// [`Matrix::try_to_nvfp4`] returns that as an error.
    pub fn to_nvfp4(&self) -> MatrixShard {
        self.try_to_nvfp4().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Matrix::to_nvfp4`], with a matrix NVFP4 cannot hold returned as an error.
    pub fn try_to_nvfp4(&self) -> Result<MatrixShard, RuntimeError> {
        let (out_f, in_f) = (self.out_features(), self.in_features());
        let g = canonical_kblocks(WeightFormat::Nvfp4, in_f)?;
        let q = Nvfp4Matrix::quantize(&self.dequantize(), out_f, in_f)?;
        Ok(MatrixShard {
            out_features: out_f,
            in_features: in_f,
            kblock_width: in_f / g,
            data: ShardData::Nvfp4 { packed: q.packed, scales: q.scales, global_scale: q.global_scale },
        })
    }
}

/// Columns `cols` of every row of a row-major matrix `in_f` wide, repacked row-major.
fn gather_cols<T: Copy>(data: &[T], in_f: usize, cols: &std::ops::Range<usize>) -> Vec<T> {
    if in_f == 0 {
        return Vec::new();
    }
    // One slice copy per row (a per-element iterator chain here was a fifth of a `step` upload).
    let mut out = Vec::with_capacity(data.len() / in_f * cols.len());
    for row in data.chunks_exact(in_f) {
        out.extend_from_slice(&row[cols.clone()]);
    }
    out
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
    E4m3 {
        codes: Vec<u8>,
        scales: Vec<f32>,
        row0: usize,
    },
    Nvfp4 {
        packed: Vec<u8>,
        scales: Vec<u8>,
        global_scale: f32,
    },
    /// The W8 door's int8 mirror: `q` row-major, one f32 scale per 32 values of a row.
    W8 {
        q: Vec<i8>,
        scales: Vec<f32>,
    },
}

impl MatrixShard {
    pub fn view(&self) -> MatrixView<'_> {
        let w = match &self.data {
            ShardData::Bf16(b) => WeightRef::Bf16(b),
            ShardData::F32(v) => WeightRef::F32(v),
            ShardData::E4m3 { codes, scales, row0 } => WeightRef::E4m3 { codes, scales, row0: *row0 },
            ShardData::Nvfp4 { packed, scales, .. } => WeightRef::Nvfp4 { packed, scales },
            ShardData::W8 { .. } => panic!("a W8 shard has no block view: use MatrixShard::w8_view"),
        };
        MatrixView {
            w,
            out_features: self.out_features,
            in_features: self.in_features,
            kblock_width: self.kblock_width,
        }
    }

    /// The W8 view of a W8 shard, `None` for every other storage.
    pub fn w8_view(&self) -> Option<memra_kernels::twins::w8::W8View<'_>> {
        match &self.data {
            ShardData::W8 { q, scales } => Some(memra_kernels::twins::w8::W8View {
                q,
                scales,
                out_features: self.out_features,
                in_features: self.in_features,
                kblock_width: self.kblock_width,
            }),
            _ => None,
        }
    }

    /// The W8 int8 mirror of a BF16 or F32 shard (one scale per 32 values of a row); other
    /// storages are returned unchanged.
    pub fn to_w8(&self) -> MatrixShard {
        let values: Vec<f32> = match &self.data {
            ShardData::Bf16(b) => b.iter().map(|x| memra_kernels::formats::bf16_to_f32(*x)).collect(),
            ShardData::F32(v) => v.clone(),
            _ => return self.clone(),
        };
        let (q, scales) = memra_kernels::twins::w8::w8_quantize(&values, self.in_features);
        MatrixShard { data: ShardData::W8 { q, scales }, ..self.clone() }
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

    /// The census name of this shard's storage: `bf16`, `f32`, `e4m3`, `nvfp4`, `w8`.
    pub fn format_name(&self) -> &'static str {
        match self.data {
            ShardData::Bf16(_) => "bf16",
            ShardData::F32(_) => "f32",
            ShardData::E4m3 { .. } => "e4m3",
            ShardData::Nvfp4 { .. } => "nvfp4",
            ShardData::W8 { .. } => "w8",
        }
    }

    /// E4M3 codes of this shard: (codes, codes of magnitude 448, subnormal codes), for the
    /// coverage counters; zeros for other storage.
    pub fn e4m3_code_stats(&self) -> (u64, u64, u64) {
        match &self.data {
            ShardData::E4m3 { codes, .. } => {
                let max = codes.iter().filter(|&&c| c & 0x7F == 0x7E).count() as u64;
                let sub = codes.iter().filter(|&&c| c & 0x78 == 0 && c & 0x07 != 0).count() as u64;
                (codes.len() as u64, max, sub)
            }
            _ => (0, 0, 0),
        }
    }

    /// Bytes a kernel reads to apply this shard once.
    pub fn bytes(&self) -> usize {
        match &self.data {
            ShardData::Bf16(b) => b.len() * 2,
            ShardData::F32(v) => v.len() * 4,
            ShardData::E4m3 { codes, scales, .. } => codes.len() + scales.len() * 4,
            ShardData::Nvfp4 { packed, scales, .. } => packed.len() + scales.len(),
            ShardData::W8 { q, scales } => q.len() + scales.len() * 4,
        }
    }
}
