//! MEMRA_STEP_TP_GRAPH on CUDA: a shape-stable segment of the step (one layer's attention half)
//! is captured once as a multi-stream, possibly multi-device CUDA graph and replayed every token.
//!
//! A segment named `key` goes through three kinds of pass, each issued by the program exactly as
//! an eager step would issue it:
//! 1. **record** (first pass): everything runs eagerly; the backend writes down the signature of
//!    every launch, copy, digest and mark, how many digest slots and timing marks each rank
//!    uses, and the sizes of the host-bounce copies.
//! 2. **capture** (second pass): every call is checked against the recorded signature and then
//!    issued into a stream capture that starts on an origin stream of rank 0's device and forks
//!    to every rank's stream (event waits), joins back at the end, and is instantiated and
//!    launched once. Everything the capture needs is allocated before it begins (digest slots,
//!    timing events, one pinned staging buffer per host-bounce copy, owned by the graph), so no
//!    allocation or host synchronisation happens while capturing.
//! 3. **replay** (every later pass): every call is checked against the signature and not issued;
//!    digest tickets and timing marks advance exactly as they did when captured; at the end the
//!    graph is launched on the origin stream, after every rank's earlier work and before its
//!    later work. Zero per-token node updates: the decode position is read from device memory.
//!
//! A signature mismatch (the program issued something else than what was captured) is an error,
//! never a silent eager fallback, so a replay is exactly the captured kernel and copy sequence.
//! Replays are counted as the door's engagement (`graph.replays`).

use super::driver;
use super::memory::{driver_err, PinnedBuffer};
use super::CudaBackend;
use crate::backend::{JoinFence, Op, Packed, Slice};
use crate::config::Transport;
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::{CudaEvent, CudaStream};
use std::collections::HashMap;
use std::sync::Arc;

/// What a call inside a segment must do on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// No segment is open: issue eagerly.
    Eager,
    /// First pass of a segment: issue eagerly, signature recorded.
    Record,
    /// Second pass: issue into the stream capture.
    Capture,
    /// Later passes: do not issue; the graph runs it.
    Replay,
}

/// One call a segment issues, as recorded and as checked on every later pass (compared by
/// value: a replay formats nothing unless it differs). `LaunchLanes` is the lanes of one op
/// fused into one launch (`Backend::launch_lanes`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    Launch { rank: usize, op: Op },
    LaunchLanes { rank: usize, ops: Vec<Op> },
    Copy { transport: Transport, src_rank: usize, src: Slice, dst_rank: usize, dst: Slice, fenced: bool },
    PeerStore { rank: usize, op: Op, out_rank: usize, fence: JoinFence },
    Packed { transport: Transport, src_rank: usize, dst_rank: usize, packed: Packed },
    AllReduce { parts: Vec<(usize, Slice)>, out_rank: usize, out: Slice },
    Digest { rank: usize, src: Slice, base: u64 },
    DigestBatch { rank: usize, groups: Vec<Vec<crate::backend::DigestPart>> },
    Mark,
}

/// One recorded segment.
struct Segment {
    signatures: Vec<Call>,
    /// Per rank: timing marks in use when the segment begins, and how many it takes.
    marks_at: Vec<usize>,
    marks_taken: Vec<usize>,
    /// Per rank: digests the segment takes, and the first slot of the region reserved for them
    /// (set when the record pass ends). Captured digest kernels write fixed addresses, and what
    /// precedes a segment in a step may take a different number of digests per rank from token to
    /// token (expert-parallel owners follow the routing), so the segment's slots are its own.
    digests_taken: Vec<usize>,
    digest_base: Vec<usize>,
    /// Byte sizes of the host-bounce copies, in issue order.
    bounce_bytes: Vec<usize>,
    graph: Option<super::safe::Graph>,
    /// Pinned staging of the captured host-bounce copies (one buffer per copy, used only by the
    /// graph, whose launches are serialised on the origin stream).
    staging: Vec<PinnedBuffer>,
}

struct Active {
    key: u64,
    pass: Pass,
    cursor: usize,
    next_staging: usize,
    /// Digests issued per rank in this pass.
    digests_seen: Vec<usize>,
}

/// The GRAPH state of one backend.
#[derive(Default)]
pub(crate) struct Graphs {
    segments: HashMap<u64, Segment>,
    active: Option<Active>,
    origin: Option<(Arc<CudaStream>, CudaEvent)>,
    pub replays: u64,
    pub captures: u64,
}

impl Graphs {
    /// The pass of the open segment (Eager when none is open).
    pub(crate) fn pass(&self) -> Pass {
        self.active.as_ref().map_or(Pass::Eager, |a| a.pass)
    }

    /// Whether a segment is open (host reads and writes are refused inside one).
    pub(crate) fn open(&self) -> bool {
        self.active.is_some()
    }

    /// Wait for the origin stream (graph launches), ignoring errors like `CudaBackend::drain`.
    pub(crate) fn drain(&self) {
        if let Some((origin, _)) = &self.origin {
            let _ = origin.synchronize();
        }
    }

    /// Note the size of a host-bounce copy of a record pass (its capture gets a buffer that size).
    pub(crate) fn note_bounce(&mut self, bytes: usize) {
        if let Some(seg) = self.recording() {
            seg.bounce_bytes.push(bytes);
        }
    }

    /// The staging buffer of the next host-bounce copy of a capture pass.
    pub(crate) fn capture_staging(&mut self, bytes: usize) -> Option<&PinnedBuffer> {
        let a = self.active.as_mut().filter(|a| a.pass == Pass::Capture)?;
        let seg = self.segments.get(&a.key)?;
        let i = a.next_staging;
        a.next_staging += 1;
        seg.staging.get(i).filter(|b| b.bytes() >= bytes)
    }

    /// The slot of the next digest on `rank` in a capture or replay pass (its segment's region);
    /// `None` outside those passes (the step's running slots).
    pub(crate) fn segment_digest_slot(&mut self, rank: usize) -> Option<usize> {
        let a = self.active.as_mut().filter(|a| matches!(a.pass, Pass::Capture | Pass::Replay))?;
        let seg = self.segments.get(&a.key)?;
        let slot = seg.digest_base[rank] + a.digests_seen[rank];
        a.digests_seen[rank] += 1;
        Some(slot)
    }

    /// Note digest and mark use of a record pass.
    pub(crate) fn note_digest(&mut self, rank: usize) {
        if let Some(seg) = self.recording() {
            seg.digests_taken[rank] += 1;
        }
    }

    pub(crate) fn note_marks(&mut self) {
        if let Some(seg) = self.recording() {
            seg.marks_taken.iter_mut().for_each(|m| *m += 1);
        }
    }

    fn recording(&mut self) -> Option<&mut Segment> {
        let a = self.active.as_ref().filter(|a| a.pass == Pass::Record)?;
        self.segments.get_mut(&a.key)
    }
}

impl CudaBackend {
    /// Gate one call inside a segment: record or check its signature. `Ok(true)`: issue it on the
    /// device (eagerly or into the capture); `Ok(false)`: the captured graph will run it.
    pub(crate) fn graph_gate(&mut self, signature: impl FnOnce() -> Call) -> Result<bool> {
        let Some(a) = self.graphs.active.as_mut() else { return Ok(true) };
        let seg = self.graphs.segments.get_mut(&a.key).expect("an open segment is registered");
        if a.pass == Pass::Record {
            seg.signatures.push(signature());
            return Ok(true);
        }
        let got = signature();
        let want = seg.signatures.get(a.cursor);
        if want != Some(&got) {
            let (key, pass, at) = (a.key, a.pass, a.cursor);
            let detail = format!(
                "graph segment {key}, call #{at} of a {pass:?} pass: the program issued `{got:?}` but the segment recorded {}",
                want.map_or("nothing more".to_string(), |w| format!("`{w:?}`"))
            );
            self.segment_abort_impl();
            return Err(RuntimeError::Contract(detail));
        }
        a.cursor += 1;
        Ok(a.pass == Pass::Capture)
    }

    /// Open segment `key` (see the module doc for the passes).
    pub(crate) fn segment_begin_impl(&mut self, key: u64) -> Result<()> {
        if let Some(a) = &self.graphs.active {
            return Err(RuntimeError::Contract(format!(
                "graph segment {key} opened inside segment {}: segments do not nest",
                a.key
            )));
        }
        if self.opts.rank0_on_default_stream {
            return Err(RuntimeError::DoorRefused {
                door: "MEMRA_STEP_TP_GRAPH",
                rule: "MEMRA_STEP_TP_GRAPH with MEMRA_RANK0_MERGE: rank 0 issues on the legacy default stream, which \
                       CUDA cannot capture into a graph"
                    .into(),
            });
        }
        let marks_now: Vec<usize> = self.ranks.iter().map(|r| r.marks_used).collect();
        let n = self.ranks.len();
        let pass = match self.graphs.segments.get(&key) {
            None => {
                let seg = Segment {
                    signatures: Vec::new(),
                    marks_at: marks_now,
                    marks_taken: vec![0; n],
                    digests_taken: vec![0; n],
                    digest_base: Vec::new(),
                    bounce_bytes: Vec::new(),
                    graph: None,
                    staging: Vec::new(),
                };
                self.graphs.segments.insert(key, seg);
                Pass::Record
            }
            Some(seg) => {
                if seg.marks_at != marks_now {
                    return Err(RuntimeError::Contract(format!(
                        "graph segment {key} begins at timing marks {marks_now:?} per rank, but was recorded at {:?}: \
                         the step before it changed",
                        seg.marks_at
                    )));
                }
                if seg.graph.is_some() {
                    Pass::Replay
                } else {
                    Pass::Capture
                }
            }
        };
        if pass == Pass::Capture {
            self.prepare_capture(key)?;
        }
        if pass != Pass::Record {
            self.origin_after_ranks("graph segment begin")?;
        }
        self.graphs.active = Some(Active { key, pass, cursor: 0, next_staging: 0, digests_seen: vec![0; n] });
        if pass == Pass::Capture {
            if let Err(e) = self.fork_capture() {
                self.segment_abort_impl();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Close the open segment: store the record, or instantiate and launch the capture, or
    /// launch the graph.
    pub(crate) fn segment_end_impl(&mut self) -> Result<()> {
        let Some(a) = self.graphs.active.as_ref() else {
            return Err(RuntimeError::Contract("graph segment end without a begin".into()));
        };
        let (key, pass, cursor) = (a.key, a.pass, a.cursor);
        let recorded = self.graphs.segments[&key].signatures.len();
        if pass != Pass::Record && cursor != recorded {
            self.segment_abort_impl();
            return Err(RuntimeError::Contract(format!(
                "graph segment {key} ended after {cursor} calls of a {pass:?} pass, but it recorded {recorded}"
            )));
        }
        match pass {
            Pass::Eager => {}
            Pass::Record => {
                // Reserve the segment's digest region after every region reserved so far; the
                // step's running slots start after all regions from the next collect on.
                let taken = self.graphs.segments[&key].digests_taken.clone();
                let mut base = Vec::with_capacity(taken.len());
                for (r, t) in taken.into_iter().enumerate() {
                    base.push(self.ranks[r].digests_reserved);
                    self.ranks[r].digests_reserved += t;
                }
                self.graphs.segments.get_mut(&key).expect("registered").digest_base = base;
            }
            Pass::Capture => {
                let graph = match self.join_capture() {
                    Ok(g) => g,
                    Err(e) => {
                        self.segment_abort_impl();
                        return Err(e);
                    }
                };
                self.graphs.segments.get_mut(&key).expect("registered").graph = Some(graph);
                self.graphs.captures += 1;
            }
            Pass::Replay => self.graphs.replays += 1,
        }
        self.graphs.active = None;
        if pass != Pass::Record {
            let seg = &self.graphs.segments[&key];
            let g = seg.graph.as_ref().expect("a captured segment holds its graph");
            g.launch().map_err(|e| self.fault(0, "graph launch", e))?;
            self.note_foreign_kernels();
            self.ranks_after_origin("graph segment end")?;
        }
        Ok(())
    }

    /// Drop an open segment after an error: end a capture in progress (its graph is discarded)
    /// and forget the segment, so the next pass records it afresh.
    pub(crate) fn segment_abort_impl(&mut self) {
        let Some(a) = self.graphs.active.take() else { return };
        if a.pass == Pass::Capture {
            if let Some((origin, _)) = &self.graphs.origin {
                // A failed capture invalidates the whole sequence; ending it returns every joined
                // stream to normal mode. The error (if any) is the one already being reported.
                let _ = origin.end_capture(driver::CUgraphInstantiate_flags(0));
            }
        }
        self.graphs.segments.remove(&a.key);
    }

    /// Before a capture: digest slots, timing events and staging that the capture will use.
    fn prepare_capture(&mut self, key: u64) -> Result<()> {
        let seg = &self.graphs.segments[&key];
        let (digests_need, marks_need): (Vec<usize>, Vec<usize>) = (
            seg.digest_base.iter().zip(&seg.digests_taken).map(|(a, t)| a + t).collect(),
            seg.marks_at.iter().zip(&seg.marks_taken).map(|(a, t)| a + t).collect(),
        );
        let bounce = seg.bounce_bytes.clone();
        for r in 0..self.ranks.len() {
            self.ensure_digest_slots(r, digests_need[r])?;
            while self.ranks[r].mark_events.len() < marks_need[r] {
                let ev = self
                    .ctx_of(r)
                    .new_event(Some(driver::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| self.fault(r, "graph timing event", e))?;
                self.ranks[r].mark_events.push(ev);
            }
        }
        let ctx = self.ctx_of(0).clone();
        let staging = bounce.iter().map(|b| PinnedBuffer::new(&ctx, *b)).collect::<Result<Vec<_>>>()?;
        self.graphs.segments.get_mut(&key).expect("registered").staging = staging;
        if self.graphs.origin.is_none() {
            let stream = ctx.new_stream().map_err(|e| driver_err("creating the graph origin stream", e))?;
            let ev = ctx.new_event(None).map_err(|e| driver_err("creating the graph origin event", e))?;
            self.graphs.origin = Some((stream, ev));
        }
        Ok(())
    }

    fn origin(&self) -> Result<&(Arc<CudaStream>, CudaEvent)> {
        self.graphs
            .origin
            .as_ref()
            .ok_or_else(|| RuntimeError::Contract("graph origin stream used before a capture created it".into()))
    }

    /// The origin stream waits for everything queued so far on every rank.
    fn origin_after_ranks(&self, what: &str) -> Result<()> {
        let (origin, _) = self.origin()?;
        for (i, r) in self.ranks.iter().enumerate() {
            r.sync_event.record(&r.stream).map_err(|e| self.fault(i, what, e))?;
            origin.wait(&r.sync_event).map_err(|e| self.fault(i, what, e))?;
        }
        Ok(())
    }

    /// Every rank's later work waits for what the origin stream holds now (the graph).
    fn ranks_after_origin(&self, what: &str) -> Result<()> {
        let (origin, ev) = self.origin()?;
        ev.record(origin).map_err(|e| self.fault(0, what, e))?;
        for (i, r) in self.ranks.iter().enumerate() {
            r.stream.wait(ev).map_err(|e| self.fault(i, what, e))?;
        }
        Ok(())
    }

    /// Begin the capture on the origin stream and pull every rank's stream into it.
    fn fork_capture(&self) -> Result<()> {
        let (origin, _) = self.origin()?;
        // Relaxed: other threads of the process (host rank workers, other tests) may make calls
        // that the stricter modes would refuse; this capture itself allocates nothing.
        origin
            .begin_capture(driver::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| self.fault(0, "graph capture begin", e))?;
        self.ranks_after_origin("graph capture fork")
    }

    /// Join every rank's stream back into the origin stream, end the capture, instantiate.
    fn join_capture(&self) -> Result<super::safe::Graph> {
        self.origin_after_ranks("graph capture join")?;
        let (origin, _) = self.origin()?;
        origin
            .end_capture(driver::CUgraphInstantiate_flags(0))
            .map_err(|e| self.fault(0, "graph capture end", e))?
            .map(super::safe::Graph::new)
            .ok_or_else(|| RuntimeError::Contract("graph capture produced no graph".into()))
    }

    /// Record a timing mark on `rank` inside a capture: an external record becomes an event
    /// record node, so every replay stamps the event again.
    pub(crate) fn record_mark_in_capture(&self, rank: usize, slot: usize) -> Result<()> {
        let r = &self.ranks[rank];
        let ev = &r.mark_events[slot];
        r.stream.context().bind_to_thread().map_err(|e| self.fault(rank, "timing mark", e))?;
        let external = driver::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
        // The event and the stream are objects of this rank's context.
        super::safe::record_event_with_flags(ev, &r.stream, external)
            .map_err(|e| self.fault(rank, "timing mark in graph capture", e))
    }
}
