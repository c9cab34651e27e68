//! Opening a backend: by kind (host or CUDA) with its options, or as this process's part of a run
//! spread over processes (NCCL between them, under the watchdog whose overrun the binary's hook
//! answers); and whether CUDA is there at all.

use super::{cuda, dist, host, Backend};
use crate::Result;

/// Which backend a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    Host,
    Cuda,
}

impl BackendKind {
    pub const ALL: [BackendKind; 2] = [BackendKind::Host, BackendKind::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }

    /// `host` or `cuda`.
    pub fn parse(s: &str) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// Open a backend of `kind` with `ranks` ranks.
pub fn open(kind: BackendKind, ranks: usize) -> Result<Box<dyn Backend + Send>> {
    open_with(kind, ranks, &OpenOptions::default())
}

/// How a backend is opened (not door values of the program: these shape the machine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Bytes held on every CUDA device first (fault injection: a crowded device).
    pub device_reserve_bytes: usize,
    /// RANK0_MERGE: rank 0 runs on its device's default stream.
    pub rank0_merge: bool,
    /// How the host backend's ranks run (threads, or inline on the issuing thread); CUDA ignores it.
    pub host_ranks: host::HostRanks,
    /// How CUDA kernels follow each other on a stream (no bit can differ; the host ignores it).
    pub launch_order: cuda::LaunchOrder,
}

/// Open a backend with options; the host backend has no device memory or streams and ignores
/// those (RANK0_MERGE is NOT-APPLICABLE there by the registry), CUDA ignores `host_ranks`.
pub fn open_with(kind: BackendKind, ranks: usize, o: &OpenOptions) -> Result<Box<dyn Backend + Send>> {
    match kind {
        BackendKind::Host => Ok(Box::new(host::HostBackend::with_ranks(ranks, o.host_ranks)?)),
        BackendKind::Cuda => Ok(Box::new(cuda::CudaBackend::with_options(
            ranks,
            cuda::CudaOptions {
                reserve_bytes: o.device_reserve_bytes,
                rank0_on_default_stream: o.rank0_merge,
                launch_order: o.launch_order,
                ..Default::default()
            },
        )?)),
    }
}

/// This process's part of a TP `tp` run spread over processes with the `nccl` transport: a
/// [`dist::DistBackend`] over a CUDA backend of the local ranks and an NCCL communicator over all
/// ranks, made from the next id of `rendezvous` (published by process 0, awaited by the others).
/// Every call runs under a watchdog that hands a [`RuntimeError::Watchdog`](crate::RuntimeError),
/// naming the call, to the binary's [`dist::watchdog::OverrunHook`] once a call takes longer than
/// the rendezvous timeout (a peer that died would otherwise hang NCCL); without an installed hook
/// the run is refused before any work.
pub fn open_distributed(tp: usize, rendezvous: &mut dist::Rendezvous, o: &OpenOptions) -> Result<Box<dyn Backend>> {
    let end_process = dist::watchdog::overrun_hook().ok_or_else(|| {
        crate::RuntimeError::Contract(
            "a run over several processes needs the binary's overrun hook (backend::dist::install_overrun_hook): \
             a distributed call that never returns can only be ended by ending the process, which is the binary's \
             decision"
                .into(),
        )
    })?;
    let spec = rendezvous.spec();
    let layout = dist::ProcessLayout::new(tp, spec).map_err(|rule| crate::RuntimeError::Placement { tp, rule })?;
    // The id is taken first, so a process whose backend fails still stays in step with the
    // others' communicator numbering.
    let (k, id) = rendezvous.next_id(cuda::nccl_unique_id)?;
    let inner = cuda::CudaBackend::with_options(
        layout.ranks_per_process(),
        cuda::CudaOptions {
            reserve_bytes: o.device_reserve_bytes,
            // Only the process holding global rank 0 has the "model stream" of RANK0_MERGE.
            rank0_on_default_stream: o.rank0_merge && spec.process == 0,
            launch_order: o.launch_order,
            ..Default::default()
        },
    )?;
    let watchdog = dist::Watchdog::start(
        format!("process {}", spec.label()),
        rendezvous.timeout(),
        Box::new(move |overrun| end_process(overrun)),
    );
    let mover = {
        let r = layout.local_ranks();
        let _guard = watchdog.enter(format!(
            "creating NCCL communicator {k} over TP{tp} (ncclCommInitRank) for ranks {}..{}",
            r.start,
            r.end - 1
        ));
        cuda::NcclMover::connect(&inner, layout, &id, k)?
    };
    Ok(Box::new(dist::DistBackend::new(layout, inner, mover, Some(watchdog))?))
}

/// CUDA devices visible to this process (0 without a driver).
pub fn cuda_device_count() -> usize {
    cuda::probe_cuda().map(|s| s.devices.len()).unwrap_or(0)
}

/// Whether a CUDA driver and device are usable: `Ok(description)` or `Err(reason)`. Never panics
/// on a machine without CUDA.
pub fn cuda_available() -> std::result::Result<String, String> {
    cuda::cuda_backend_available().map(|s| s.describe()).map_err(|e| e.to_string())
}
