//! A door whose mechanism is replaced by a host read + write (issue 26, planted at run time). (1) A
//! backend whose peer stores compute the partials on the peer, read them to the host and write
//! them into the root: the numbers are the peer stores' bit for bit, so every digest gate would
//! pass; the census — counted inside the backend, which the program cannot write — shows no peer
//! store and the round trip's `read.*`/`write.*`, and the engagement gate fails OPROJ_DIRECT
//! (VOID). (2) LEN_MIRROR_LAZY claims fewer local copies; a run whose mirror copies went through
//! the host instead satisfies `copy.local.* fewer`, and only the round-trip rule (more reads and
//! more writes, undeclared) fails it. The controls: the real mechanisms pass the same gate.

use memra_gating::gate;
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{capability, Backend, JoinFence, Op, Slice, Transfer};
use memra_runtime::evidence::census::Counts;
use memra_runtime::model::{gen::generate, ModelConfig};
use memra_runtime::record::Record;
use memra_runtime::{program, Battery, RunConfig, Transport};

/// Hooks on the host backend: its peer stores become a host round trip (`round_trip`), and
/// same-rank copies a host read + write (`local_copies_round_trip`).
struct RoundTrip {
    round_trip: bool,
    local_copies_round_trip: bool,
}

impl RoundTrip {
    fn backend(round_trip: bool, local_copies_round_trip: bool) -> Intercepted<HostBackend, RoundTrip> {
        Intercepted::new(HostBackend::new(2).unwrap(), RoundTrip { round_trip, local_copies_round_trip })
    }
}

impl Hooks<HostBackend> for RoundTrip {
    fn copy(&mut self, inner: &mut HostBackend, c: Transfer) -> memra_runtime::Result<()> {
        if self.local_copies_round_trip && c.from.0 == c.to.0 {
            let bytes = inner.read(c.from.0, c.from.1)?;
            return inner.write(c.to.0, c.to.1, &bytes);
        }
        inner.copy(c)
    }
    fn launch_peer_store(
        &mut self,
        inner: &mut HostBackend,
        rank: usize,
        mut op: Op,
        out_rank: usize,
        fence: JoinFence,
    ) -> memra_runtime::Result<()> {
        if !self.round_trip {
            return capability::peer_stores(inner)?.launch_peer_store(rank, op, out_rank, fence);
        }
        // The planted defect: the same kernel into a buffer of the peer, then host read + write.
        let target = *op.slices().last().expect("a store target");
        let scratch = Slice { buf: inner.alloc(rank, target.len)?, offset: 0, len: target.len };
        let last = op.slices().len() - 1;
        let mut i = 0;
        op.map_slices(|s| {
            if i == last {
                *s = scratch;
            }
            i += 1;
        });
        inner.launch(rank, op)?;
        let bytes = inner.read(rank, scratch)?;
        inner.write(out_rank, target, &bytes)
    }
}

fn family(c: &Counts, prefix: &str) -> u64 {
    c.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
}

#[test]
fn peer_stores_replaced_by_a_host_round_trip_are_not_witnessed() {
    let decl = crate::registry_decl("oproj_direct");
    let m = generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap();
    let run = |direct: bool, round_trip: bool| -> Record {
        let mut cfg = RunConfig::new(2, Transport::NativeP2p, Battery::default_for(m.config.vocab, 2)).unwrap();
        cfg.doors.oproj_direct = direct;
        let mut b = RoundTrip::backend(round_trip, false);
        program::run(&m, &cfg, &mut b).unwrap()
    };
    let off = run(false, false);
    let (real, planted) = (run(true, false), run(true, true));
    // The round trip computes the peer stores' numbers: no digest gate could tell.
    assert_eq!(planted.digests, real.digests, "the round trip moves the same bytes");
    assert_eq!(planted.tokens, real.tokens);
    // The control: real peer stores are witnessed.
    let o = gate::engagement(real.census.counts(), &[(&decl, Ok(off.census.counts().clone()))]);
    assert!(o.passed(), "{}", o.detail());
    // The planted round trip: no peer store in the census, and its reads and writes are there.
    let o = gate::engagement(planted.census.counts(), &[(&decl, Ok(off.census.counts().clone()))]);
    assert!(!o.passed(), "a host round trip witnessed as peer stores: {}", o.detail());
    assert!(o.detail().contains("oproj_direct") && o.detail().contains("peer_store.gemv_partials.*"), "{}", o.detail());
    assert!(o.detail().contains("a host round trip: read.*"), "{}", o.detail());
    let (p, r) = (planted.census.counts(), real.census.counts());
    assert_eq!(family(p, "peer_store."), 0, "{p:?}");
    assert!(family(p, "read.") > family(r, "read.") && family(p, "write.") > family(r, "write."), "{p:?}\n{r:?}");
}

#[test]
fn fewer_copies_by_a_host_round_trip_are_not_witnessed() {
    let decl = crate::registry_decl("len_mirror_lazy");
    let m = generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap();
    let run = |lazy: bool, round_trip: bool| -> Record {
        let mut cfg = RunConfig::new(2, Transport::NativeP2p, Battery::default_for(m.config.vocab, 2)).unwrap();
        cfg.doors.len_mirror_lazy = lazy;
        let mut b = RoundTrip::backend(false, round_trip);
        program::run(&m, &cfg, &mut b).unwrap()
    };
    let off = run(false, false);
    // The planted run: every mirror copy still made, through the host.
    let (real, planted) = (run(true, false), run(false, true));
    assert_eq!(planted.digests, real.digests, "the same numbers either way");
    let judge = |r: &Record| gate::engagement(r.census.counts(), &[(&decl, Ok(off.census.counts().clone()))]);
    let o = judge(&real);
    assert!(o.passed(), "{}", o.detail());
    let o = judge(&planted);
    assert!(!o.passed(), "copies moved through the host witnessed as skipped: {}", o.detail());
    // The declared change alone holds: only the round-trip rule sees it.
    assert!(o.detail().contains("len_mirror_lazy (census against the door off: a host round trip"), "{}", o.detail());
    assert!(!o.detail().contains("copy.local.* fewer"), "the declared change held: {}", o.detail());
    let held = decl.changes.iter().all(|c| c.check(off.census.counts(), planted.census.counts()).is_ok());
    assert!(held, "the planted run satisfies every declared change");
}
