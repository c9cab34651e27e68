//! One-op cases shared by the GPU test modules: seeded inputs (signed zeros, subnormals, E4M3
//! codes up to ±448), weight shards of every format, a case (buffers, weights, expert groups, ops,
//! compared outputs) run on the host twins and on CUDA, and the bit-for-bit comparison that names
//! the first differing element.

use crate::harness::{cuda_backend, Ran};
use memra_kernels::formats::{bf16_from_f32, E4M3_BLOCK};
use memra_kernels::twins::digest::splitmix64;
use memra_runtime::backend::cuda::{CudaOptions, GemvLayout, LaunchOrder, PlacementPolicy};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, GroupEntry, Op, Slice};
use memra_runtime::model::matrix::{MatrixShard, ShardData};
use memra_runtime::RuntimeError;

pub const EPS: f32 = 1e-6;

pub const FAST: CudaOptions = CudaOptions {
    placement: PlacementPolicy::Auto,
    gemv_layout: GemvLayout::Fast,
    reserve_bytes: 0,
    rank0_on_default_stream: false,
    launch_order: LaunchOrder::Programmatic,
};
pub const ROW_MAJOR: CudaOptions = CudaOptions {
    placement: PlacementPolicy::Auto,
    gemv_layout: GemvLayout::RowMajor,
    reserve_bytes: 0,
    rank0_on_default_stream: false,
    launch_order: LaunchOrder::Programmatic,
};
pub const CO_RESIDENT: CudaOptions = CudaOptions {
    placement: PlacementPolicy::CoResident,
    gemv_layout: GemvLayout::Fast,
    reserve_bytes: 0,
    rank0_on_default_stream: false,
    launch_order: LaunchOrder::Programmatic,
};

// ---------------------------------------------------------------- inputs

pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix64(self.0)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Mostly `unit() * scale`, sometimes ±0.0, a subnormal, or a tiny normal.
    pub fn mixed(&mut self, scale: f32) -> f32 {
        match self.below(64) {
            0 => -0.0,
            1 => 0.0,
            2 => f32::from_bits(1 + self.below(0x7F_FFFF) as u32) * if self.below(2) == 0 { 1.0 } else { -1.0 },
            3 => f32::MIN_POSITIVE * self.unit(),
            _ => self.unit() * scale,
        }
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.mixed(scale)).collect()
    }
}

// ---------------------------------------------------------------- one-op cases

/// Buffers, weights, expert groups, ops, and the slices compared after the ops ran.
pub struct Case {
    pub label: String,
    pub bufs: Vec<Vec<f32>>,
    pub weights: Vec<MatrixShard>,
    pub groups: Vec<(usize, Vec<Option<GroupEntry>>)>,
    pub ops: Vec<Op>,
    pub outputs: Vec<Slice>,
    pub nan_equal: bool,
}

impl Case {
    pub fn new(label: impl Into<String>) -> Case {
        Case {
            label: label.into(),
            bufs: Vec::new(),
            weights: Vec::new(),
            groups: Vec::new(),
            ops: Vec::new(),
            outputs: Vec::new(),
            nan_equal: false,
        }
    }
    pub fn buf(&mut self, data: Vec<f32>) -> Slice {
        let s = Slice::new(self.bufs.len() as u32, 0, data.len());
        self.bufs.push(data);
        s
    }
    /// An output buffer, poisoned so that an element a kernel failed to write shows.
    pub fn out(&mut self, len: usize) -> Slice {
        let s = self.buf(vec![f32::from_bits(0x7FC0_0001); len]);
        self.outputs.push(s);
        s
    }
    pub fn weight(&mut self, w: MatrixShard) -> u32 {
        self.weights.push(w);
        (self.weights.len() - 1) as u32
    }
    pub fn ids(&mut self, ids: &[u32]) -> Slice {
        self.buf(ids.iter().map(|i| f32::from_bits(*i)).collect())
    }
}

pub fn run_case(b: &mut dyn Backend, c: &Case) -> Result<Vec<Vec<f32>>, RuntimeError> {
    for data in &c.bufs {
        let id = b.alloc(0, data.len())?;
        b.write(0, Slice::new(id, 0, data.len()), data)?;
    }
    for w in &c.weights {
        b.upload_weight(0, w)?;
    }
    for (experts, entries) in &c.groups {
        b.register_experts(0, *experts, entries)?;
    }
    for op in &c.ops {
        b.launch(0, op.clone())?;
    }
    c.outputs.iter().map(|s| b.read(0, *s)).collect()
}

/// Count of mismatching elements and the first one, or None when every element matches.
pub fn compare(host: &[Vec<f32>], dev: &[Vec<f32>], nan_equal: bool) -> Option<String> {
    let mut bad = 0usize;
    let mut first = None;
    let mut total = 0usize;
    for (o, (h, d)) in host.iter().zip(dev).enumerate() {
        total += h.len();
        for (i, (a, b)) in h.iter().zip(d).enumerate() {
            let same = a.to_bits() == b.to_bits() || (nan_equal && a.is_nan() && b.is_nan());
            if !same {
                bad += 1;
                first.get_or_insert(format!(
                    "output {o} element {i}: host {:#010x} ({a:e}) device {:#010x} ({b:e})",
                    a.to_bits(),
                    b.to_bits()
                ));
            }
        }
    }
    first.map(|f| format!("{bad} of {total} elements differ; first: {f}"))
}

/// Run every case on the host twins and on CUDA with each option set; fail listing every
/// mismatch (count and first bad index).
pub fn check_cases(kernel: &str, cases: Vec<Case>, option_sets: &[CudaOptions]) -> Ran {
    let mut failures = Vec::new();
    for c in &cases {
        let mut host = HostBackend::new(1).expect("host backend");
        let want = run_case(&mut host, c).unwrap_or_else(|e| panic!("{kernel} {}: host run failed: {e}", c.label));
        for opts in option_sets {
            let mut dev = cuda_backend(1, *opts)?;
            let layout = format!("{:?}", opts.gemv_layout);
            match run_case(&mut dev, c) {
                Err(e) => failures.push(format!("{kernel} {} [{layout}]: CUDA run failed: {e}", c.label)),
                Ok(got) => match compare(&want, &got, c.nan_equal) {
                    None => println!("ok {kernel} {} [{layout}]", c.label),
                    Some(msg) => failures.push(format!("{kernel} {} [{layout}]: {msg}", c.label)),
                },
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatching case(s):\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------- weights

pub fn bf16_shard(rng: &mut Rng, rows: usize, cols: usize, kw: usize) -> MatrixShard {
    let bits = (0..rows * cols).map(|_| bf16_from_f32(rng.mixed(0.5))).collect();
    MatrixShard { out_features: rows, in_features: cols, kblock_width: kw, data: ShardData::Bf16(bits) }
}

pub fn f32_shard(rng: &mut Rng, rows: usize, cols: usize, kw: usize) -> MatrixShard {
    MatrixShard {
        out_features: rows,
        in_features: cols,
        kblock_width: kw,
        data: ShardData::F32(rng.vec(rows * cols, 0.5)),
    }
}

/// E4M3 codes over the whole code space (±448 included); NaN codes only when asked.
pub fn e4m3_shard(rng: &mut Rng, rows: usize, cols: usize, kw: usize, row0: usize, nan_codes: bool) -> MatrixShard {
    let codes = (0..rows * cols)
        .map(|i| {
            let c = rng.below(256) as u8;
            if i % 97 == 5 {
                0x7E | (c & 0x80) // ±448
            } else if c & 0x7F == 0x7F && !nan_codes {
                c ^ 0x01
            } else {
                c
            }
        })
        .collect();
    let scale_rows = if rows == 0 { 0 } else { (row0 + rows - 1) / E4M3_BLOCK - row0 / E4M3_BLOCK + 1 };
    let scales = (0..scale_rows * (cols / E4M3_BLOCK))
        .map(|_| f32::from_bits(0x3A80_0000 + rng.below(0x0500_0000) as u32))
        .collect();
    MatrixShard {
        out_features: rows,
        in_features: cols,
        kblock_width: kw,
        data: ShardData::E4m3 { codes, scales, row0 },
    }
}

pub fn nvfp4_shard(rng: &mut Rng, rows: usize, cols: usize, kw: usize) -> MatrixShard {
    let packed = (0..rows * cols / 2).map(|_| rng.below(256) as u8).collect();
    let scales = (0..rows * cols / 16).map(|_| rng.below(0x7F) as u8).collect();
    MatrixShard {
        out_features: rows,
        in_features: cols,
        kblock_width: kw,
        data: ShardData::Nvfp4 { packed, scales, global_scale: 1.0 },
    }
}
