//! The host backend's two ways of running ranks (`HostRanks`): threads, and inline on the issuing
//! thread. Inline is one schedule of the same per-rank streams, so every part of a record that is
//! evidence must be the same bits as under threads — at every TP size, over both transports, with
//! the peer-store doors and a NUMERIC door — and a planted copy defect must show the same way.
//! The negative control: the comparison used here sees a record with one corrupted copy.

use memra_runtime::backend::host::{HostBackend, HostRanks};
use memra_runtime::backend::Backend;
use memra_runtime::evidence::record::Record;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, DoorSet, RunConfig, Transport};
use std::sync::OnceLock;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 3 }
}

fn record(cfg: &RunConfig, mode: HostRanks, corrupt_copies: bool) -> Record {
    let mut b = HostBackend::with_ranks(cfg.tp.get(), mode).unwrap();
    assert_eq!(b.rank_mode(), mode);
    if corrupt_copies {
        b.corrupt_copies_up_to(usize::MAX);
    }
    program::run(tiny(), cfg, &mut b).unwrap_or_else(|e| panic!("TP{} {mode:?} run failed: {e}", cfg.tp))
}

/// The parts of a record that are evidence (everything but timings and the backend's wording),
/// as one comparable text (logits by their bits).
fn evidence(r: &Record) -> String {
    let top2: Vec<(u32, u32)> = r.top2.iter().flatten().map(|(a, b)| (a.to_bits(), b.to_bits())).collect();
    format!(
        "{:?}",
        (
            (&r.digests, &r.rank_digests, &r.tokens, top2),
            (&r.engaged, &r.census, &r.coverage, &r.captures),
            (r.copies_verified, &r.copy_faults),
        )
    )
}

fn configs() -> Vec<RunConfig> {
    let mut out = Vec::new();
    for tp in [1, 2, 4, 8] {
        for transport in [Transport::HostBounce, Transport::NativeP2p] {
            out.push(RunConfig::new(tp, transport, battery()).unwrap());
        }
    }
    let with = |tp, transport, edit: fn(&mut DoorSet)| {
        let mut cfg = RunConfig::new(tp, transport, battery()).unwrap();
        edit(&mut cfg.doors);
        cfg
    };
    out.push(with(4, Transport::NativeP2p, |d| {
        d.oproj_direct = true;
        d.oproj_tail = true;
        d.moe_direct = true;
    }));
    out.push(with(2, Transport::HostBounce, |d| d.step_ep = true));
    out.push(with(8, Transport::HostBounce, |d| d.qkv_fused = true));
    out
}

#[test]
fn inline_ranks_decode_the_threads_record() {
    for cfg in configs() {
        let what = format!("TP{} {} {:?}", cfg.tp, cfg.transport.name(), cfg.doors);
        let threads = record(&cfg, HostRanks::Threads, false);
        let inline = record(&cfg, HostRanks::Inline, false);
        assert!(threads.digests.iter().flatten().count() > 0, "{what}: no decode step was recorded");
        assert!(evidence(&threads) == evidence(&inline), "{what}: inline ranks changed the evidence");
        if cfg.tp.get() > 1 {
            assert!(inline.copies_verified > 0, "{what}: no cross-rank copy was verified");
        }
    }
}

/// A corrupted copy is found the same way under both modes, and the comparison above sees it.
#[test]
fn a_corrupted_copy_shows_under_both_modes() {
    let cfg = RunConfig::new(2, Transport::NativeP2p, battery()).unwrap();
    let clean = record(&cfg, HostRanks::Inline, false);
    let threads = record(&cfg, HostRanks::Threads, true);
    let inline = record(&cfg, HostRanks::Inline, true);
    assert!(!inline.copy_faults.is_empty(), "the planted copy defect was not found inline");
    assert!(evidence(&threads) == evidence(&inline), "a planted defect shows differently inline");
    assert!(evidence(&clean) != evidence(&inline), "negative control: the comparison must see a corrupted copy");
}

/// A command that panics makes its rank dead: every later use of the rank fails with the rank
/// named (inline: already the call that ran it), while the other ranks keep working.
#[test]
fn a_panicking_command_leaves_a_dead_rank() {
    use memra_runtime::backend::Slice;
    for mode in [HostRanks::Threads, HostRanks::Inline] {
        let mut b = HostBackend::with_ranks(2, mode).unwrap();
        let buf = b.alloc(1, 4).unwrap();
        let now = b.inject_panic(1);
        assert_eq!(now.is_err(), mode == HostRanks::Inline, "{mode:?}: {now:?}");
        let later = b.read(1, Slice::new(buf, 0, 4)).unwrap_err().to_string();
        assert!(later.contains("host rank 1") && later.contains("died"), "{mode:?}: {later}");
        let other = b.alloc(0, 4).unwrap();
        assert_eq!(b.read(0, Slice::new(other, 0, 4)).unwrap(), vec![0.0; 4], "{mode:?}: rank 0 must keep working");
    }
}
