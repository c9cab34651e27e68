//! Receipt builders shared by the tests: a deterministic "realistic" receipt (also the documented
//! example), variants for every verdict, and proptest strategies for random valid receipts.

use std::collections::BTreeMap;

use memra_kernels::grid::ulp_distance;
use memra_receipts::*;
use memra_receipts::{digest_hex, f32_bits_hex, fnv1a64, seam_column};
use proptest::prelude::*;

/// A named edit of a receipt's JSON tree (negative cases).
pub type ValueEdit = Box<dyn Fn(&mut serde_json::Value)>;
/// A named edit of a receipt.
pub type ReceiptEdit = Box<dyn Fn(&mut Receipt)>;

pub const SEAMS: [&str; 4] = ["attn_norm", "qkv", "o_join", "residual"];

pub fn config(tp: usize, transport: Transport, doors: &[(&str, bool)]) -> RunConfigEvidence {
    RunConfigEvidence {
        subject: "memra-runtime".to_string(),
        backend: Backend::Cuda,
        tp,
        transport,
        doors: doors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        model: ModelEvidence { preset: "tiny".to_string(), digest: "9f2c41d07a3be851".to_string() },
        battery_digest: "4be1a6c20d93f7e5".to_string(),
        oracle: "tp1 host-bounce defaults on host".to_string(),
        batch: None,
        columns: None,
    }
}

/// A digest that depends only on its coordinates (so equal configurations give equal tables).
fn cell(seed: &str, prompt: usize, step: usize, col: usize) -> String {
    digest_hex(fnv1a64(format!("{seed}/{prompt}/{step}/{col}").as_bytes()))
}

/// A passing receipt with a full evidence section: `layers` layers × [`SEAMS`], `prompts` prompts ×
/// `steps` steps, latencies for every layer × seam.
pub fn receipt_with(cfg: RunConfigEvidence, layers: usize, prompts: usize, steps: usize) -> Receipt {
    let columns: Vec<String> = (0..layers).flat_map(|l| SEAMS.iter().map(move |s| seam_column(l, s))).collect();
    let rows = (0..prompts)
        .flat_map(|p| (0..steps).map(move |s| (p, s)))
        .map(|(prompt, step)| DigestRow {
            prompt,
            step,
            digests: (0..columns.len()).map(|c| cell("oracle", prompt, step, c)).collect(),
        })
        .collect();
    let tokens: Vec<Vec<u32>> =
        (0..prompts).map(|p| (0..steps).map(|s| (17 + 31 * p as u32 + 7 * s as u32) % 1024).collect()).collect();
    let mut engaged = BTreeMap::new();
    for (door, on) in &cfg.doors {
        if *on {
            engaged.insert(format!("{door}@o_join"), (prompts * steps * layers) as u64);
        }
    }
    let latency = (0..layers)
        .flat_map(|l| SEAMS.iter().map(move |s| (l, *s)))
        .enumerate()
        .map(|(i, (l, s))| {
            let base = 10_000 + 1_000 * i as u64;
            let samples: Vec<u64> = (0..20).map(|k| base + (k * 37 % 11) * 50).collect();
            SeamLatency::new(l, s, LatencyStats::from_samples(&samples).unwrap())
        })
        .collect();
    let p2p_probe = if cfg.transport == Transport::NativeP2p {
        (0..cfg.tp)
            .flat_map(|s| (0..cfg.tp).filter(move |d| *d != s).map(move |d| (s, d)))
            .map(|(src, dst)| ProbeEntry {
                transport: Transport::NativeP2p,
                src,
                dst,
                bytes: 16 * 1024,
                bad_words: 0,
                status: ProbeStatus::Ok,
            })
            .collect()
    } else {
        Vec::new()
    };
    let evidence = Evidence {
        build: BuildEvidence {
            kernel_source_digest: "c0ffee0123456789".to_string(),
            nvrtc_options: vec!["--gpu-architecture=sm_90".to_string(), "--fmad=false".to_string()],
            subject_version: Some("0.1.0".to_string()),
        },
        verdict: Verdict::Pass,
        reason: None,
        gates: vec![
            GateResult {
                gate: Gate::Identity,
                verdict: Verdict::Pass,
                detail: format!("{} cells equal", prompts * steps * layers * SEAMS.len()),
            },
            GateResult {
                gate: Gate::Engagement,
                verdict: Verdict::Pass,
                detail: format!("{} of {} doors engaged", cfg.doors.len(), cfg.doors.len()),
            },
            GateResult { gate: Gate::NonTriviality, verdict: Verdict::Pass, detail: "no constant seam".to_string() },
            GateResult { gate: Gate::Determinism, verdict: Verdict::Pass, detail: "second run identical".to_string() },
            GateResult {
                gate: Gate::Copies,
                verdict: Verdict::Pass,
                detail: "96 cross-rank copies verified".to_string(),
            },
        ],
        engaged,
        census: [
            ("copy.native-p2p.4096", 96),
            ("launch.gemv_rows_batch.bf16", 8),
            ("peer_store.gemv_partials.bf16", 4),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        census_witness: None,
        coverage: [(
            "router.tie_in_topk".to_string(),
            CoverageCount {
                count: 3,
                first: Some(SeamPlace { prompt: 0, step: 0, layer: 0, seam: "router".to_string() }),
            },
        )]
        .into_iter()
        .collect(),
        claims: vec!["router.tie_in_topk".to_string()],
        planted: None,
        first_divergence: None,
        digests: SeamDigests { columns, rows },
        token_tape_digest: token_tape_digest(&tokens),
        tokens,
        error_budget: Vec::new(),
        near_ties: Vec::new(),
        performance: None,
        config: cfg,
    };
    let measurements = Measurements {
        latency,
        wall_ms: 1234.5,
        host: "2× AMD EPYC 9654, 192 cores, Linux 6.8".to_string(),
        device: Some("NVIDIA H200, driver 575.57, 141 GiB".to_string()),
        p2p_probe,
        started_at_unix_ms: 1_767_225_600_000,
        extra: [("gate_overhead_ms".to_string(), 3.25)].into_iter().collect(),
    };
    Receipt::new(ReceiptKind::Run, evidence, measurements)
}

/// A passing receipt, 2 layers × 4 seams, 2 prompts × 3 steps.
pub fn passing(tp: usize, transport: Transport, doors: &[(&str, bool)]) -> Receipt {
    receipt_with(config(tp, transport, doors), 2, 2, 3)
}

/// The documented example (`receipts/schema/example-run-v2.json`).
pub fn example() -> Receipt {
    let cfg = config(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true), ("MEMRA_OPROJ_TAIL", true)]);
    let mut r = receipt_with(cfg, 1, 1, 2);
    r.measurements.latency.truncate(2);
    r
}

/// Mutates a receipt's evidence, then restores the derived fields (run_id, token digest).
pub fn edit(mut r: Receipt, f: impl FnOnce(&mut Evidence)) -> Receipt {
    f(&mut r.evidence);
    r.evidence.token_tape_digest = token_tape_digest(&r.evidence.tokens);
    r.run_id = run_id(&r.evidence.config);
    r
}

pub fn divergence() -> Divergence {
    let (oracle, observed) = (1.0f32, f32::from_bits(0x3f80_0003));
    Divergence {
        prompt: 1,
        step: 2,
        layer: 1,
        seam: "o_join".to_string(),
        at: DivergenceAt::Seam,
        src_rank: None,
        rank: Some(1),
        reproduced: true,
        element: Some(4093),
        oracle_bits: Some(f32_bits_hex(oracle)),
        observed_bits: Some(f32_bits_hex(observed)),
        ulp: Some(ulp_distance(oracle.to_bits(), observed.to_bits())),
        lane: None,
    }
}

/// `r` turned into a FAIL at [`divergence`], with the digest table changed from that cell on.
pub fn failing(r: Receipt) -> Receipt {
    edit(r, |ev| {
        let d = divergence();
        let col = ev.digests.columns.iter().position(|c| *c == seam_column(d.layer, &d.seam)).unwrap();
        for row in &mut ev.digests.rows {
            if (row.prompt, row.step) >= (d.prompt, d.step) {
                for c in col..row.digests.len() {
                    row.digests[c] = cell("diverged", row.prompt, row.step, c);
                }
            }
        }
        ev.verdict = Verdict::Fail;
        ev.reason = Some("identity: first divergence at L1.o_join".to_string());
        ev.gates[0] =
            GateResult { gate: Gate::Identity, verdict: Verdict::Fail, detail: "5 of 48 cells differ".to_string() };
        ev.first_divergence = Some(d);
    })
}

pub fn with_verdict(r: Receipt, verdict: Verdict, reason: &str) -> Receipt {
    edit(r, |ev| {
        ev.verdict = verdict;
        ev.reason = Some(reason.to_string());
    })
}

/// A SKIP: the run was not attempted, so no gates, digests or tokens.
pub fn skipped(r: Receipt, reason: &str) -> Receipt {
    let mut r = edit(r, |ev| {
        ev.verdict = Verdict::Skip;
        ev.reason = Some(reason.to_string());
        ev.gates.clear();
        ev.engaged.clear();
        ev.digests.rows.clear();
        ev.tokens.clear();
    });
    r.measurements.latency.clear();
    r.measurements.wall_ms = 0.0;
    r
}

pub fn errored(r: Receipt, reason: &str) -> Receipt {
    let mut r = edit(r, |ev| {
        ev.verdict = Verdict::Error;
        ev.reason = Some(reason.to_string());
        ev.gates.clear();
        ev.digests.rows.truncate(1);
        ev.tokens = vec![vec![17]];
    });
    r.measurements.latency.clear();
    r
}

pub fn performance(r: Receipt) -> Receipt {
    let mut r = edit(r, |ev| {
        ev.performance = Some(PerformanceClaim {
            performance_claim: true,
            ratios: [("L0.latency_over_memory_floor".to_string(), 1.37), ("L0.latency_over_pytorch".to_string(), 0.82)]
                .into_iter()
                .collect(),
        });
        ev.error_budget = vec![SeamError { layer: 0, seam: "qkv".to_string(), max_ulp: 3, max_rel: 2.5e-7 }];
        ev.near_ties = vec![NearTie { prompt: 0, step: 1, margin: 0.0123, oracle_token: 88, observed_token: 91 }];
    });
    r.kind = ReceiptKind::Performance;
    r
}

/// Sets the latency of one layer × seam of `r` to (min, median, max), p90 = max.
pub fn set_latency(r: &mut Receipt, layer: usize, seam: &str, min: u64, median: u64, max: u64) {
    let l = r.measurements.latency.iter_mut().find(|l| l.layer == layer && l.seam == seam).unwrap();
    (l.min_ns, l.median_ns, l.p90_ns, l.max_ns) = (min, median, max, max);
}

// ---------------------------------------------------------------------------------------------
// Proptest strategies: random receipts that satisfy every rule of the format.
// ---------------------------------------------------------------------------------------------

/// Short text, ASCII or arbitrary Unicode (control characters, quotes, non-BMP included).
pub fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof!["[ -~]{0,12}", any::<String>().prop_map(|s| s.chars().take(12).collect())]
}

fn arb_hex() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<u8>(), 1..33).prop_map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
}

fn arb_hex16() -> impl Strategy<Value = String> {
    any::<u64>().prop_map(digest_hex)
}

pub fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |x| x.is_finite()),
        Just(0.0),
        Just(-0.0),
        Just(1e-300),
        Just(1.5e16)
    ]
}

pub fn arb_f32() -> impl Strategy<Value = f32> {
    prop_oneof![any::<f32>().prop_filter("finite", |x| x.is_finite()), Just(-0.0f32), Just(f32::MIN_POSITIVE)]
}

fn arb_verdict() -> impl Strategy<Value = Verdict> {
    prop::sample::select(Verdict::ALL.to_vec())
}

fn arb_index() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..64, any::<usize>()]
}

prop_compose! {
    pub fn arb_config()(
        subject in arb_text(),
        backend in prop::sample::select(vec![Backend::Host, Backend::Cuda]),
        tp in prop::sample::select(vec![1usize, 2, 4, 8]),
        transport in prop::sample::select(vec![Transport::HostBounce, Transport::NativeP2p, Transport::Nccl]),
        doors in prop::collection::btree_map("MEMRA_[A-Z0-9_]{1,12}", any::<bool>(), 0..4),
        preset in arb_text(),
        digest in arb_hex(),
        battery_digest in arb_hex(),
        oracle in arb_text(),
        (batch, columns) in prop::sample::select(vec![(None, None), (Some(2), None), (Some(8), None), (None, Some(4))]),
    ) -> RunConfigEvidence {
        RunConfigEvidence { subject, backend, tp, transport, doors, model: ModelEvidence { preset, digest }, battery_digest, oracle, batch, columns }
    }
}

fn arb_gates() -> impl Strategy<Value = Vec<GateResult>> {
    let all = vec![
        Gate::Identity,
        Gate::ArgmaxTape,
        Gate::ClassIdentity,
        Gate::ErrorBudget,
        Gate::Engagement,
        Gate::NonTriviality,
        Gate::Determinism,
        Gate::DeviceHost,
        Gate::Reference,
        Gate::Copies,
        Gate::Coverage,
        Gate::Probe,
    ];
    prop::sample::subsequence(all, 0..=12)
        .prop_flat_map(|gates| {
            let n = gates.len();
            (Just(gates), prop::collection::vec((arb_verdict(), arb_text()), n))
        })
        .prop_map(|(gates, vd)| {
            gates.into_iter().zip(vd).map(|(gate, (verdict, detail))| GateResult { gate, verdict, detail }).collect()
        })
}

prop_compose! {
    fn arb_divergence()(
        prompt in arb_index(), step in arb_index(), layer in arb_index(), seam in arb_text(),
        rank in prop::option::of(arb_index()), element in any::<u64>(),
        a in any::<u32>(), b in any::<u32>(), ulp in any::<u64>(), shape in 0u8..3, src in arb_index(),
    ) -> Divergence {
        // 0: a reproduced seam divergence, 1: not reproduced (no element), 2: a copy.
        let reproduced = shape == 0;
        Divergence {
            prompt, step, layer, seam,
            at: if shape == 2 { DivergenceAt::Copy } else { DivergenceAt::Seam },
            src_rank: (shape == 2).then_some(src),
            rank: if shape == 2 { Some(rank.unwrap_or(0)) } else { rank },
            reproduced,
            element: reproduced.then_some(element),
            oracle_bits: reproduced.then(|| format!("0x{a:08x}")),
            observed_bits: reproduced.then(|| format!("0x{b:08x}")),
            ulp: reproduced.then_some(ulp),
            lane: None,
        }
    }
}

prop_compose! {
    fn arb_coverage()(count in any::<u64>(), first in prop::option::of((arb_index(), arb_index(), arb_index(), arb_text()))) -> CoverageCount {
        CoverageCount { count, first: first.map(|(prompt, step, layer, seam)| SeamPlace { prompt, step, layer, seam }) }
    }
}

prop_compose! {
    fn arb_planted()(canary in "[a-z_]{1,12}", layer in arb_index(), seam in arb_text(), step in arb_index(), element in any::<u64>()) -> Planted {
        Planted { canary, layer, seam, step, element }
    }
}

fn arb_digests() -> impl Strategy<Value = SeamDigests> {
    (
        prop::collection::btree_set("[A-Za-z0-9_.]{1,10}", 0..5),
        prop::collection::btree_set((arb_index(), 0usize..8), 0..6),
    )
        .prop_flat_map(|(cols, keys)| {
            let cols: Vec<String> = cols.into_iter().collect();
            let n = cols.len();
            let rows = keys
                .into_iter()
                .map(|(prompt, step)| {
                    prop::collection::vec(arb_hex16(), n).prop_map(move |digests| DigestRow { prompt, step, digests })
                })
                .collect::<Vec<_>>();
            (Just(cols), rows)
        })
        .prop_map(|(columns, rows)| SeamDigests { columns, rows })
}

prop_compose! {
    fn arb_seam_error()(layer in arb_index(), seam in arb_text(), max_ulp in any::<u64>(), max_rel in arb_f64()) -> SeamError {
        SeamError { layer, seam, max_ulp, max_rel }
    }
}

prop_compose! {
    fn arb_near_tie()(prompt in arb_index(), step in arb_index(), margin in arb_f32(), oracle_token in any::<u32>(), observed_token in any::<u32>()) -> NearTie {
        NearTie { prompt, step, margin, oracle_token, observed_token }
    }
}

fn arb_verdict_reason() -> impl Strategy<Value = (Verdict, Option<String>)> {
    arb_verdict().prop_flat_map(|v| {
        let reason = if v.requires_reason() {
            arb_text().prop_filter("non-empty", |s| !s.is_empty()).prop_map(Some).boxed()
        } else {
            prop::option::of(arb_text()).boxed()
        };
        (Just(v), reason)
    })
}

fn arb_performance() -> impl Strategy<Value = Option<PerformanceClaim>> {
    prop::option::of(
        (any::<bool>(), prop::collection::btree_map(arb_text(), arb_f64(), 0..3))
            .prop_map(|(performance_claim, ratios)| PerformanceClaim { performance_claim, ratios }),
    )
}

prop_compose! {
    fn arb_evidence()(
        config in arb_config(),
        kernel_source_digest in arb_hex(),
        nvrtc_options in prop::collection::vec(arb_text(), 0..3),
        subject_version in prop::option::of(arb_text().prop_filter("non-empty", |s| !s.is_empty())),
        (verdict, reason) in arb_verdict_reason(),
        gates in arb_gates(),
        engaged in prop::collection::btree_map(arb_text(), any::<u64>(), 0..4),
        census in prop::collection::btree_map(arb_text(), any::<u64>(), 0..4),
        coverage in prop::collection::btree_map(arb_text(), arb_coverage(), 0..3),
        claims in prop::collection::btree_set(arb_text(), 0..3),
        planted in prop::option::of(arb_planted()),
        first_divergence in prop::option::of(arb_divergence()),
        digests in arb_digests(),
        tokens in prop::collection::vec(prop::collection::vec(any::<u32>(), 0..6), 0..3),
        error_budget in prop::collection::vec(arb_seam_error(), 0..3),
        near_ties in prop::collection::vec(arb_near_tie(), 0..3),
        performance in arb_performance(),
    ) -> Evidence {
        Evidence {
            config, build: BuildEvidence { kernel_source_digest, nvrtc_options, subject_version }, verdict, reason, gates, engaged,
            census, census_witness: None, coverage, claims: claims.into_iter().collect(), planted, first_divergence, digests, token_tape_digest: token_tape_digest(&tokens), tokens, error_budget, near_ties,
            performance,
        }
    }
}

fn arb_latency() -> impl Strategy<Value = Vec<SeamLatency>> {
    prop::collection::btree_map((arb_index(), arb_text()), prop::collection::vec(any::<u64>(), 1..12), 0..4).prop_map(
        |m| {
            m.into_iter()
                .map(|((layer, seam), s)| SeamLatency::new(layer, seam, LatencyStats::from_samples(&s).unwrap()))
                .collect()
        },
    )
}

prop_compose! {
    fn arb_probe()(src in arb_index(), dst in arb_index(), bytes in any::<u64>(), bad_words in any::<u64>(),
        status in prop::sample::select(vec![ProbeStatus::Ok, ProbeStatus::Corrupt, ProbeStatus::NoPeerAccess, ProbeStatus::Failed]),
        transport in prop::sample::select(vec![Transport::HostBounce, Transport::NativeP2p, Transport::Nccl])) -> ProbeEntry {
        ProbeEntry { transport, src, dst, bytes, bad_words, status }
    }
}

prop_compose! {
    fn arb_measurements()(
        latency in arb_latency(),
        wall_ms in arb_f64(),
        host in arb_text(),
        device in prop::option::of(arb_text()),
        p2p_probe in prop::collection::vec(arb_probe(), 0..3),
        started_at_unix_ms in any::<u64>(),
        extra in prop::collection::btree_map(arb_text(), arb_f64(), 0..3),
    ) -> Measurements {
        Measurements { latency, wall_ms, host, device, p2p_probe, started_at_unix_ms, extra }
    }
}

/// A random receipt that satisfies every rule of the format.
pub fn arb_receipt() -> impl Strategy<Value = Receipt> {
    (arb_evidence(), arb_measurements()).prop_map(|(evidence, measurements)| {
        let kind = if evidence.performance.is_some() { ReceiptKind::Performance } else { ReceiptKind::Run };
        Receipt::new(kind, evidence, measurements)
    })
}
