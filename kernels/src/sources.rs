//! The CUDA C sources of the kernels, embedded at compile time, and the closed list of kernel
//! names the runtime launches (checked after every NVRTC load).
//!
//! The sources are one translation unit for NVRTC: `canon.cuh` (canonical math, the dot32 lane
//! order, the weight decoders) first, then one `.cu` file per kernel family. Each `.cu` file
//! includes `canon.cuh` only behind its include guard, so the concatenation needs no include path.

/// (file name, contents) in the fixed concatenation order.
const SOURCES: [(&str, &str); 11] = [
    ("canon.cuh", include_str!("../cuda/canon.cuh")),
    ("gemv.cu", include_str!("../cuda/gemv.cu")),
    ("gemv_lanes.cu", include_str!("../cuda/gemv_lanes.cu")),
    ("experts.cu", include_str!("../cuda/experts.cu")),
    ("down8.cu", include_str!("../cuda/down8.cu")),
    ("norm.cu", include_str!("../cuda/norm.cu")),
    ("attention.cu", include_str!("../cuda/attention.cu")),
    ("moe.cu", include_str!("../cuda/moe.cu")),
    ("elementwise.cu", include_str!("../cuda/elementwise.cu")),
    ("digest.cu", include_str!("../cuda/digest.cu")),
    ("doors29.cu", include_str!("../cuda/doors29.cu")),
];

/// All kernel sources concatenated in a fixed order (one translation unit for NVRTC). A
/// `#line` directive before each file keeps NVRTC's error messages pointing at the right file.
pub fn cuda_source() -> String {
    concat_sources(SOURCES)
}

/// The NVRTC translation unit of `(file name, text)` pairs in order: a `#line 1 "name"`
/// directive, the text, and a newline where the text has none ([`cuda_source`]'s rule, for a
/// caller that reads the same files from another tree).
pub fn concat_sources<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (name, text) in files {
        out.push_str(&format!("#line 1 \"{name}\"\n"));
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The file names of the sources in concatenation order (for provenance and error messages).
pub fn source_files() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(name, _)| *name)
}

/// Stable digest of [`cuda_source`]: 16 hex digits of FNV-1a 64 over its bytes. It changes
/// whenever any kernel source changes, so receipts and the binary's provenance stamp can name the
/// exact kernels a run used.
pub fn source_digest() -> String {
    const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;
    let digest = cuda_source().bytes().fold(FNV_OFFSET, |h, b| (h ^ b as u64).wrapping_mul(FNV_PRIME));
    format!("{digest:016x}")
}

/// The host twins and the canonical definitions they are made of (crate-relative paths): the other
/// half of the canonical program. A change of a twin without its kernel (or the reverse) is a
/// change of the program, so the build digest covers both halves.
const TWIN_SOURCES: [(&str, &str); 14] = [
    ("src/canon.rs", include_str!("canon.rs")),
    ("src/formats/mod.rs", include_str!("formats/mod.rs")),
    ("src/formats/bf16.rs", include_str!("formats/bf16.rs")),
    ("src/formats/e4m3.rs", include_str!("formats/e4m3.rs")),
    ("src/formats/nvfp4.rs", include_str!("formats/nvfp4.rs")),
    ("src/twins/mod.rs", include_str!("twins/mod.rs")),
    ("src/twins/attention.rs", include_str!("twins/attention.rs")),
    ("src/twins/digest.rs", include_str!("twins/digest.rs")),
    ("src/twins/down8.rs", include_str!("twins/down8.rs")),
    ("src/twins/experts.rs", include_str!("twins/experts.rs")),
    ("src/twins/gemv.rs", include_str!("twins/gemv.rs")),
    ("src/twins/moe.rs", include_str!("twins/moe.rs")),
    ("src/twins/norm.rs", include_str!("twins/norm.rs")),
    ("src/twins/w8.rs", include_str!("twins/w8.rs")),
];

/// Crate-relative paths of the twin sources covered by [`build_digest`] (for `rerun-if-changed`).
pub fn twin_files() -> impl Iterator<Item = &'static str> {
    TWIN_SOURCES.iter().map(|(name, _)| *name)
}

/// The twin sources covered by the build digest: (crate-relative path, text).
pub fn twin_sources() -> &'static [(&'static str, &'static str)] {
    &TWIN_SOURCES
}

/// The digest the binary is stamped with (`MG_BUILD_KERNEL_DIGEST`, receipts'
/// `kernel_source_digest`): [`build_digest_of`] of the kernel text NVRTC compiles
/// ([`cuda_source`]), every twin source, and the `program` sources the caller names (the
/// runtime's order of operations, `memra_runtime::provenance`), so a receipt names every part of
/// the canonical program that produced it. [`source_digest`] stays the digest of the compiled
/// text alone (what a compilation is checked against).
pub fn build_digest(program: &[(&str, &str)]) -> String {
    build_digest_of(&cuda_source(), &TWIN_SOURCES, program)
}

/// 16 hex digits of FNV-1a 64 over `cuda`, then each twin's name and text, then each program
/// source's name and text, in order: any changed byte of any part changes it.
pub fn build_digest_of(cuda: &str, twins: &[(&str, &str)], program: &[(&str, &str)]) -> String {
    const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;
    let fold = |h: u64, bytes: &[u8]| bytes.iter().fold(h, |h, b| (h ^ *b as u64).wrapping_mul(FNV_PRIME));
    let mut h = fold(FNV_OFFSET, cuda.as_bytes());
    for (name, text) in twins.iter().chain(program) {
        h = fold(h, name.as_bytes());
        h = fold(h, text.as_bytes());
    }
    format!("{h:016x}")
}

/// Every `extern "C"` kernel the CUDA backend launches.
pub const KERNEL_NAMES: &[&str] = &[
    // gemv.cu
    "gemv_rows_bf16",
    "gemv_rows_f32",
    "gemv_rows_e4m3",
    "gemv_rows_nvfp4",
    "gemv_rows_w8",
    "gemv_partials_bf16",
    "gemv_partials_f32",
    "gemv_partials_e4m3",
    "gemv_partials_nvfp4",
    "gemv_partials_w8",
    "gemv_rows_batch_bf16",
    "gemv_rows_batch_f32",
    "gemv_rows_tree_bf16",
    "gemv_rows_tree_f32",
    "fold_f32",
    "fold_lanes_f32",
    // gemv_lanes.cu
    "gemv_rows_lanes_bf16",
    "gemv_rows_lanes_f32",
    "gemv_partials_lanes_bf16",
    "gemv_partials_lanes_f32",
    // experts.cu
    "expert_gate_up_f32",
    "expert_gate_up_bpl_f32",
    "expert_gate_up_rows_f32",
    "expert_down_f32",
    "expert_down_bpl_f32",
    "fold_slots_f32",
    "fold_combine_residual_f32",
    "select_slots_f32",
    "combine_owned_f32",
    // down8.cu
    "expert_down_combine_f32",
    // norm.cu
    "rmsnorm_f32",
    "add_rmsnorm_f32",
    "fold_add_rmsnorm_f32",
    // attention.cu
    "qk_norm_rope_f32",
    "decode_attention_f32",
    "qk_norm_rope_at_f32",
    "decode_attention_at_f32",
    "decode_attention_rows_f32",
    "decode_attention_cols2_f32",
    "rope_append_f32",
    // moe.cu
    "router_topk_f32",
    "router_topk_dev_f32",
    "swiglu_f32",
    "combine_f32",
    "combine_shared_f32",
    "combine_scaled_f32",
    "residual_add_f32",
    "argmax_f32",
    // elementwise.cu
    "add_f32",
    "scale_f32",
    "flip_low_bit_f32",
    "set_u32",
    "inc_u32",
    "append_at_f32",
    // digest.cu
    "digest_f32",
    "digest_batch_f32",
    // doors29.cu
    "mirror_sel_u32",
    "ring_flag_u32",
];

#[cfg(test)]
mod wait_check;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The kernel name of a declaration that follows `extern "C" __global__ void`, past an
    /// optional `__launch_bounds__(..)`.
    pub(super) fn kernel_name(after_void: &str) -> &str {
        let mut head = after_void.trim_start();
        if let Some(after) = head.strip_prefix("__launch_bounds__(") {
            let close = after.find(')').expect("unclosed __launch_bounds__");
            head = after[close + 1..].trim_start();
        }
        let end = head.find('(').expect("a kernel name is followed by its parameter list");
        head[..end].trim()
    }

    /// Names declared as `extern "C" __global__ void [__launch_bounds__(..)] NAME(` in the source.
    fn declared_kernels(src: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut rest = src;
        while let Some(at) = rest.find("extern \"C\" __global__ void") {
            rest = &rest[at + "extern \"C\" __global__ void".len()..];
            names.insert(kernel_name(rest).to_string());
        }
        names
    }

    #[test]
    fn every_listed_kernel_is_declared_and_every_declared_kernel_is_listed() {
        let declared = declared_kernels(&cuda_source());
        let listed: BTreeSet<String> = KERNEL_NAMES.iter().map(|s| s.to_string()).collect();
        assert_eq!(listed.len(), KERNEL_NAMES.len(), "KERNEL_NAMES has a duplicate");
        let missing: Vec<_> = listed.difference(&declared).collect();
        let unlisted: Vec<_> = declared.difference(&listed).collect();
        assert!(missing.is_empty(), "listed but not declared as extern \"C\" __global__ void NAME: {missing:?}");
        assert!(unlisted.is_empty(), "declared but missing from KERNEL_NAMES: {unlisted:?}");
    }

    #[test]
    fn kernel_names_follow_op_dtype() {
        for name in KERNEL_NAMES {
            let dtype = name.rsplit('_').next().unwrap_or("");
            assert!(["f32", "u32", "bf16", "e4m3", "nvfp4", "w8"].contains(&dtype), "{name} does not end in _<dtype>");
        }
    }

    #[test]
    fn build_digest_covers_the_twins_and_the_program() {
        assert_ne!(build_digest(&[]), source_digest());
        assert_eq!(build_digest(&[]), build_digest(&[]));
        assert!(twin_files().any(|f| f == "src/twins/experts.rs"));
        assert_ne!(build_digest(&[("p.rs", "a")]), build_digest(&[("p.rs", "b")]));
        let mut twins = twin_sources().to_vec();
        let changed = twins[1].1.replacen('a', "b", 1);
        twins[1].1 = &changed;
        assert_ne!(build_digest_of(&cuda_source(), &twins, &[]), build_digest(&[]));
        assert_eq!(concat_sources(SOURCES), cuda_source());
    }

    #[test]
    fn canon_header_comes_first_and_digest_is_stable() {
        assert_eq!(source_files().next(), Some("canon.cuh"));
        let d = source_digest();
        assert_eq!(d.len(), 16);
        assert_eq!(d, source_digest());
        assert!(d.chars().all(|c| c.is_ascii_hexdigit()));
    }

    /// Every f32 constant in the device math is written as a bit pattern, never as a decimal
    /// literal that could parse to a neighbouring float (integer literals are allowed).
    #[test]
    fn no_decimal_float_literals_in_kernels() {
        for (name, text) in SOURCES {
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let bytes = code.as_bytes();
                for (i, w) in bytes.windows(2).enumerate() {
                    let digit_dot = w[0].is_ascii_digit() && w[1] == b'.';
                    let prev_ident = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
                    assert!(!digit_dot || prev_ident, "{name}:{}: decimal float literal in `{}`", n + 1, line.trim());
                }
            }
        }
    }

    /// The canonical program never calls CUDA math functions, intrinsics that approximate, or an
    /// explicit fused multiply-add.
    #[test]
    fn no_platform_math_in_kernels() {
        let banned = [
            "fmaf(",
            "__fmaf",
            "expf(",
            "__expf",
            "exp2f(",
            "rsqrtf(",
            "__frsqrt",
            "logf(",
            "tanhf(",
            "__fdividef",
            "sqrtf(",
            "powf(",
            "__powf",
        ];
        for (name, text) in SOURCES {
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for b in banned {
                    assert!(!code.contains(b), "{name}:{}: calls {b}", n + 1);
                }
            }
        }
    }
}
