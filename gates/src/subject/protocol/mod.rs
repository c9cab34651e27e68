//! The subject protocol, versions 1 and 2: how `memra-gates` gates an engine it cannot link in
//! (docs/DESIGN.md §10). This module is the protocol's one definition — the manifest
//! ([`manifest`]), the battery file ([`battery`]), the tape ([`tape`]), the environment (below)
//! and the rules every reader applies. `docs/subject-protocol.md` says the same for an engine team
//! that does not read Rust; the two change together.
//!
//! # One start per run
//!
//! A subject is a program. `memra-gates run --subject MANIFEST` starts it once for every run the
//! gates need (a configuration's first run, its determinism re-run with the error-budget
//! captures, a class baseline, a localisation re-run), each time with a fresh battery file and a
//! fresh tape path, and waits at most the manifest's `time_limit_s` (then kills the process
//! group: ERROR). The program decodes the battery with the configuration the environment names,
//! writes the tape, and exits 0. The oracle is never the subject: it is the built-in canonical
//! program, run inside `memra-gates`.
//!
//! # The manifest (TOML, `protocol = 1`)
//!
//! ```toml
//! protocol = 1                          # the protocol version the subject implements
//! name = "torch-reference"              # receipts: evidence.config.subject (run identity)
//! version = "0.1.0"                     # receipts: evidence.build.subject_version; the tape repeats it
//! command = ["python3", "{manifest_dir}/torch_subject.py"]   # argv; also {memra_gates}
//! time_limit_s = 600                    # per start; past it the process group is killed (ERROR)
//! backends = ["host", "cuda"]           # MEMRA_SUBJECT_BACKEND values it accepts
//! tp = [1]                              # MEMRA_SUBJECT_TP values (1, 2, 4, 8)
//! transports = ["host-bounce"]          # MEMRA_SUBJECT_TRANSPORT values
//! seams = ["attn_norm", "qkv", "rope", "attn", "o_proj", "o_join", "ffn_norm", "router",
//!          "experts", "moe_join", "residual", "final_norm", "logits"]   # version 1: all of them
//! doors = ["MEMRA_TORCH_BF16_MATMUL"]   # the door variables it reads
//! class = "NUMERIC-CLASS"               # its claim against the canonical program: BIT-IDENTICAL | NUMERIC-CLASS
//! error_budget = { max_rel_error = 1e-4, near_tie_margin = 1e-3, why = "f32, another summation order" }
//!
//! [[door]]                              # a door that is not in gates/doors.toml, in that file's format
//! id = "torch_bf16_matmul"
//! env = "MEMRA_TORCH_BF16_MATMUL"
//! class = "NUMERIC-CLASS"
//! # … every field of a gates/doors.toml [[door]] entry (gates/src/registry/file.rs)
//! ```
//!
//! Configurations outside `backends`, `tp` or `transports` are NOT-APPLICABLE, with the reason.
//! `doors` names door variables of the built-in registry (an engine that implements the same
//! doors) or of the manifest's own `[[door]]` entries; the plan's registry is exactly those doors,
//! so `--matrix` enumerates them and nothing else. Each configuration of a `BIT-IDENTICAL` subject
//! is gated like the built-in runtime's (identity with the oracle; on CUDA also device-host). A
//! `NUMERIC-CLASS` subject's every configuration is NUMERIC (argmax tape under teacher forcing
//! with the oracle's tokens, error budget at every seam, and class identity with its own TP1 run
//! of the same doors — its class baseline — unless `gate = "argmax_tape+error_budget"` with a
//! `gate_why`); its doors' budgets widen the subject's own.
//!
//! # The environment
//!
//! Every `MEMRA_*` variable of the caller is removed; then the subject gets:
//!
//! | variable | value |
//! |---|---|
//! | `MEMRA_SUBJECT_PROTOCOL` | `1` |
//! | `MEMRA_SUBJECT_BACKEND` | `host` or `cuda` |
//! | `MEMRA_SUBJECT_TP`, `MEMRA_SUBJECT_TRANSPORT` | the run's TP size and transport |
//! | `MEMRA_SUBJECT_MODEL` | a `memra-model` safetensors file (`runtime/src/model/format/mod.rs`) |
//! | `MEMRA_SUBJECT_BATTERY` | the battery file of this run |
//! | `MEMRA_SUBJECT_TAPE` | where to write the tape (absent until the subject writes it) |
//! | every door of `doors` | `1` (on in this run) or `0` |
//! | `MEMRA_CANARY_FLIP_AT` | only with the built-in flip-bit canary on: `layer:seam:step:element` |
//!
//! The variables are declared in `gates/doors.toml` (`[[setting]]`), like every `MEMRA_*` name.
//!
//! # The battery file (JSON, `memra-battery` version 1)
//!
//! ```json
//! {"format": "memra-battery", "version": 1,
//!  "prompts": [[12, 7, 3, 99], [5, 6, 7, 8, 9]], "gen_tokens": 8,
//!  "forced_tokens": [[4, 4, 17, 0, 2, 9, 9, 1], [3, 3, 3, 5, 0, 1, 2, 8]],
//!  "capture": [{"prompt": 0, "step": 3, "layer": 1, "seam": "o_join"}]}
//! ```
//!
//! Prompt `p` with `n` tokens takes `n + gen_tokens − 1` decode steps at positions `0, 1, …` of
//! a fresh KV cache: step `s < n` feeds prompt token `s`; step `s ≥ n` feeds generated token
//! `s − n` — the run's own argmax, or `forced_tokens[p][s − n]` when `forced_tokens` is not null
//! (teacher forcing: NUMERIC runs). Steps `n − 1 …` each generate one token (the argmax of the
//! logits, ties to the lower id): `gen_tokens` per prompt. `capture` lists the seams whose whole
//! tensor the tape must carry (localisation, error budgets).
//!
//! # The tape (safetensors, `memra-tape` version 1)
//!
//! Metadata: `memra.format` = `"memra-tape"`, `memra.format_version` = `"1"`, `memra.tape` =
//! JSON (no other key):
//!
//! ```json
//! {"subject": "torch-reference", "subject_version": "0.1.0", "layers": 2,
//!  "seams": ["L0.attn_norm", "L0.qkv", "…", "L1.residual", "L2.final_norm", "L2.logits"],
//!  "engaged_doors": ["MEMRA_TORCH_BF16_MATMUL"],
//!  "census": {"torch_bf16_matmul.bf16_matmuls": 420, "torch.matmuls": 420},
//!  "backend": "torch 2.11.0 on cuda:0 (NVIDIA H200)", "build_options": [],
//!  "capture_owners": {}, "error": null}
//! ```
//!
//! Tensors, for every prompt `p` (S = 11·layers + 2 seams, `steps_p` its decode steps, G = gen_tokens):
//!
//! | name | dtype | shape | content |
//! |---|---|---|---|
//! | `p{p}.digests` | U64 | `[steps_p, S]` | the seam digest of every step and seam, columns in `seams` order |
//! | `p{p}.tokens` | U32 | `[G]` | the generated tokens |
//! | `p{p}.top2` | F32 | `[G, 2]` | the two largest logits of the step that generated each token |
//! | `p{p}.timings_ns` | U64 | `[steps_p, S]` | optional (all prompts or none): nanoseconds per step and seam |
//! | `p{p}.layer_timings_ns` | U64 | `[steps_p, L + 1]` | optional (all prompts or none): nanoseconds per step and whole layer (index L: the head) |
//! | `p{p}.rank_digests` | U64 | `[steps_p, S, R]` | optional (all prompts or none): each of R ranks' share of every seam digest; the shares sum (wrapping) to the digest — names the rank of a divergence |
//! | `capture.p{p}.s{step}.L{layer}.{seam}` | F32 | `[len]` | each requested capture, raw 32-bit patterns |
//!
//! `seams` must be `L{l}.{seam}` for every layer `l` in the order of docs/DESIGN.md §3.2, then
//! `L{layers}.final_norm`, `L{layers}.logits` ([`seam_columns`]); the logical tensor of each and
//! its length are in [`seam_len`]. The digest (docs/DESIGN.md §5) is the wrapping 64-bit sum over
//! the tensor's elements of `splitmix64((index << 32) | bits)`, `index` the element's global
//! index, `bits` its f32 bit pattern (a router id: the id as a u32). A digest of 0 reads as a seam
//! that was never written. `engaged_doors` lists exactly the doors that were on and whose
//! registry counter is > 0 in `census`; `census` counts whatever the subject counts (at least each
//! on door's counter). Optional keys (the built-in runtime writes them; see [`backend_evidence`]):
//! `backend_census` (what the backend itself issued — then the engagement gate reads it instead of
//! `census`), `coverage` (special paths reached) and `copies` (cross-rank copies checked against
//! their source). A door's census change (its registry `census`; for a subject's own door,
//! its engagement counter `appears`) is checked against the same configuration run with the door
//! off. A run the subject cannot complete writes only the metadata with `error`
//! set to the reason (exit 0): the receipt is ERROR with that reason.
//!
//! # Version 2: rows and columns ([`shapes`], [`lanes`])
//!
//! A `protocol = 2` manifest may declare `batch = [1, 2, 4, 8]` and `columns = [1, …]` (absent:
//! `[1]`; each list of 1, 2, 4, 8, once, holding 1; refused in a version 1 manifest). The subject
//! is told its manifest's version (`MEMRA_SUBJECT_PROTOCOL`); a version 2 subject gets a battery
//! file of version 2, whose `pass` (`{"batch": B, "columns": T}`) names the run's pass shape,
//! scheduled as the built-in runtime schedules it (`runtime/src/program/passes.rs`). Its tape
//! stays per (prompt, step), plus `p{p}.lanes` (U32 `[steps_p, 2]`: the pass and lane of every
//! step) in a run of several lanes, read into `Record::lanes` — so rows and columns are gated
//! by the same code as the built-in runtime's. A shape outside the manifest (every multi-lane
//! shape of a version 1 subject) is NOT-APPLICABLE with the reason.
//!
//! # Verdicts of a run that breaks the protocol (never PASS; the matrix goes on)
//!
//! | what happened | verdict |
//! |---|---|
//! | the program cannot start, exits non-zero, or is killed by a signal | ERROR (status, last lines of its output) |
//! | it runs past `time_limit_s` | ERROR (killed, with the limit) |
//! | no tape, a truncated or malformed one, another format version, another subject or version | ERROR |
//! | a missing, extra or misnamed tensor or seam, a wrong dtype or shape, a zero digest, a token outside the vocabulary | ERROR |
//! | a door claimed engaged that was off, a door's counter > 0 that was off or is not claimed | ERROR |
//! | a door claimed engaged whose counter the census does not show (> 0) | VOID |
//! | the tape's `error` | ERROR with that reason |

pub mod backend_evidence;
pub mod battery;
pub mod lanes;
pub mod manifest;
pub mod shapes;
pub mod tape;
pub mod witness;

use memra_kernels::twins::gemv::{canonical_kblocks, WeightFormat};
use memra_runtime::model::ModelConfig;
use memra_runtime::record::{Record, Seam};

/// The newest protocol version this build speaks (manifest `protocol`, `MEMRA_SUBJECT_PROTOCOL`):
/// version 2 adds rows and columns ([`shapes`], the battery file's `pass`, the tape's `p{p}.lanes`).
pub const PROTOCOL_VERSION: u64 = 2;
/// Every version this build speaks: a subject is told the version of its manifest.
pub const PROTOCOL_VERSIONS: [u64; 2] = [1, 2];

/// The digest columns of a tape for a model of `layers` layers: `L{l}.{seam}` in record order
/// (the layer seams of every layer, then the head seams on pseudo-layer `layers`).
pub fn seam_columns(layers: usize) -> Vec<String> {
    let per = layers * Seam::LAYER.len() + Seam::HEAD.len();
    (0..per)
        .map(|i| {
            let (layer, seam) = Record::seam_at(layers, i);
            memra_receipts::seam_column(layer, seam.name())
        })
        .collect()
}

/// The canonical K-block counts of the row-parallel matrices of a model (docs/DESIGN.md §3.4):
/// (o_proj, routed expert down, shared expert down).
pub fn kblocks(c: &ModelConfig) -> Result<(usize, usize, usize), String> {
    let g = |format, width: usize, what: &str| {
        canonical_kblocks(format, width).map_err(|e| format!("{what} (in_features {width}): {e}"))
    };
    Ok((
        g(WeightFormat::Bf16, c.q_heads * c.head_dim, "layers.*.attn.o")?,
        g(WeightFormat::E4m3, c.expert_width, "layers.*.experts.*.down")?,
        g(WeightFormat::E4m3, c.shared_width, "layers.*.shared.down")?,
    ))
}

/// Elements of a seam's logical tensor (docs/DESIGN.md §3.2), the length of its capture:
///
/// | seam | elements |
/// |---|---|
/// | `attn_norm`, `o_join`, `residual`, `final_norm` | hidden |
/// | `qkv` | q_heads·128 + 2·kv_heads·128 + q_heads (`[q \| k \| v \| gate]`) |
/// | `rope` | q_heads·128 + kv_heads·128 (`[q \| k]`) |
/// | `attn` | q_heads·128 |
/// | `o_proj` | G_o · hidden (the K-block partials `[G_o][hidden]`) |
/// | `ffn_norm`, `moe_join` | 2 · hidden (`[h \| normed]`, `[routed \| shared]`) |
/// | `router` | 2 · top_k (`[ids as u32 \| weights]`) |
/// | `experts` | top_k · gmax · hidden + G_shared · hidden (slot `s` at `s · gmax · hidden`) |
/// | `logits` | vocab |
///
/// In `experts`, a slot with fewer K-blocks than gmax = max(G_down, G_shared) leaves a gap that
/// belongs to no partial: it is not digested, and a capture holds +0.0 there.
pub fn seam_len(c: &ModelConfig, seam: Seam) -> Result<usize, String> {
    let (q, kv) = (c.q_heads * c.head_dim, c.kv_heads * c.head_dim);
    let (g_o, g_down, g_shared) = kblocks(c)?;
    Ok(match seam {
        Seam::AttnNorm | Seam::OJoin | Seam::Residual | Seam::FinalNorm => c.hidden,
        Seam::Qkv => q + 2 * kv + c.q_heads,
        Seam::Rope => q + kv,
        Seam::Attn => q,
        Seam::OProj => g_o * c.hidden,
        Seam::FfnNorm | Seam::MoeJoin => 2 * c.hidden,
        Seam::Router => 2 * c.top_k,
        Seam::Experts => c.top_k * g_down.max(g_shared) * c.hidden + g_shared * c.hidden,
        Seam::Logits => c.vocab,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_runtime::backend::{open, BackendKind};
    use memra_runtime::record::CaptureKey;
    use memra_runtime::{Battery, RunConfig, Transport};

    /// The documented lengths are the built-in runtime's: a full capture of every seam of one
    /// step has exactly `seam_len` elements, at TP1 and TP2 (the logical tensor does not depend
    /// on the TP size).
    #[test]
    fn seam_lengths_are_the_runtimes_captures() {
        let mut config = ModelConfig::preset("tiny", Some(1)).unwrap();
        config.expert_width = 512; // G_down 4 < G_shared 8: the experts seam has gaps
        let model = memra_runtime::model::gen::generate(&config, 3).unwrap();
        let battery = Battery { prompts: vec![vec![1, 2]], gen_tokens: 1 };
        for tp in [1, 2] {
            let mut cfg = RunConfig::new(tp, Transport::HostBounce, battery.clone()).unwrap();
            cfg.capture = seam_columns(1)
                .iter()
                .enumerate()
                .map(|(i, _)| {
                    let (layer, seam) = Record::seam_at(1, i);
                    CaptureKey { prompt: 0, step: 1, layer, seam }
                })
                .collect();
            let mut b = open(BackendKind::Host, tp).unwrap();
            let r = memra_runtime::program::run(&model, &cfg, b.as_mut()).unwrap();
            for (key, cap) in &r.captures {
                assert_eq!(cap.bits.len(), seam_len(&config, key.seam).unwrap(), "TP{tp} {}", key.seam.name());
            }
            assert_eq!(r.captures.len(), 13);
        }
        assert_eq!(seam_columns(1)[11], "L1.final_norm");
    }
}
