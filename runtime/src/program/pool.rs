//! A pool of prepared backends (docs/DESIGN.md §8): weights uploaded once per backend, options and
//! [`Layout`], and shared by every run that needs them.
//!
//! A run takes a matching entry out of the pool (or opens a backend and [`prepare`]s it), runs on
//! it with [`run_prepared`] and gives it back; a run that fails drops its entry, since a fault
//! may leave the backend in any state. Idle entries are kept while the bytes of all entries of a
//! backend kind (idle and in use) fit the kind's budget — host memory for the host backend,
//! device memory for CUDA — and the least recently used go first. A prepare that fails while
//! idle entries hold memory of its kind is retried once without them (an upload that ran out of
//! device memory because the pool kept old weights must not become an ERROR receipt).
//!
//! A pool serves one model: the first run names it, and a run of any other model is refused (a
//! prepared backend holds that model's weights).

use super::{prepare, run_prepared, Layout, Prepared};
use crate::backend::{open_with, Backend, BackendKind, OpenOptions};
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::evidence::record::Record;
use crate::model::Model;
use crate::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What an entry was opened and prepared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolKey {
    pub backend: BackendKind,
    pub open: OpenOptions,
    pub layout: Layout,
}

/// Bytes of prepared weights the pool may keep, per backend kind (idle and in-use entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub host_bytes: u64,
    pub device_bytes: u64,
    /// Idle entries kept at most (each idle host backend keeps its rank threads).
    pub max_idle: usize,
}

impl Budget {
    /// This machine's: 40 % of the host memory available now, half of the smallest CUDA
    /// device (0 without one), 32 idle entries.
    pub fn for_this_machine() -> Budget {
        let device = crate::backend::cuda::probe_cuda()
            .ok()
            .and_then(|s| s.devices.iter().map(|d| d.total_mem_bytes as u64).min())
            .unwrap_or(0);
        Budget {
            host_bytes: (crate::backend::host::available_memory_bytes() as u64).saturating_mul(2) / 5,
            device_bytes: device / 2,
            max_idle: 32,
        }
    }

    fn of(&self, kind: BackendKind) -> u64 {
        match kind {
            BackendKind::Host => self.host_bytes,
            BackendKind::Cuda => self.device_bytes,
        }
    }
}

/// How long a pooled run spent placing weights and decoding.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunTimes {
    /// Opening the backend and preparing the weights (0 when an entry was reused).
    pub upload_ms: f64,
    /// The run itself (rewind, buffers, every decode step).
    pub run_ms: f64,
    /// Whether the weights were already in place.
    pub reused: bool,
}

struct Entry {
    key: PoolKey,
    backend: Box<dyn Backend + Send>,
    prepared: Prepared,
    last_used: u64,
}

#[derive(Default)]
struct State {
    idle: Vec<Entry>,
    /// Bytes of entries taken out and not yet given back: (host, cuda).
    in_use: [u64; 2],
    /// The model the pool serves: its address and configuration.
    model: Option<(usize, crate::model::ModelConfig)>,
}

fn slot(kind: BackendKind) -> usize {
    match kind {
        BackendKind::Host => 0,
        BackendKind::Cuda => 1,
    }
}

/// Prepared backends shared by the runs of one model.
pub struct Pool {
    budget: Budget,
    state: Mutex<State>,
    clock: AtomicU64,
    prepares: AtomicU64,
}

impl Pool {
    pub fn new(budget: Budget) -> Pool {
        Pool { budget, state: Mutex::new(State::default()), clock: AtomicU64::new(0), prepares: AtomicU64::new(0) }
    }

    /// Backends opened and prepared so far (each is one upload of the model).
    pub fn prepares(&self) -> u64 {
        self.prepares.load(Ordering::SeqCst)
    }

    /// Idle entries now.
    pub fn idle(&self) -> usize {
        self.lock().idle.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run the battery of `cfg` on a `kind` backend opened with `open`, on weights prepared once
    /// per (backend, options, layout).
    pub fn run(
        &self,
        model: &Model,
        cfg: &RunConfig,
        kind: BackendKind,
        open: &OpenOptions,
    ) -> Result<(Record, RunTimes)> {
        self.run_observed(model, cfg, kind, open, &|_| {})
    }

    /// [`Pool::run`], calling `uploading(true)` before a backend is opened and prepared and
    /// `uploading(false)` when it is ready (so progress can say which of the two it waits for).
    pub fn run_observed(
        &self,
        model: &Model,
        cfg: &RunConfig,
        kind: BackendKind,
        open: &OpenOptions,
        uploading: &dyn Fn(bool),
    ) -> Result<(Record, RunTimes)> {
        let key = PoolKey { backend: kind, open: *open, layout: Layout::of(cfg) };
        let mut times = RunTimes::default();
        let mut entry = match self.take(model, &key)? {
            Some(e) => {
                times.reused = true;
                e
            }
            None => {
                let t = Instant::now();
                uploading(true);
                let e = self.open_prepared(model, &key);
                uploading(false);
                times.upload_ms = t.elapsed().as_secs_f64() * 1e3;
                e?
            }
        };
        let t = Instant::now();
        let result = run_prepared(model, cfg, entry.backend.as_mut(), &entry.prepared);
        times.run_ms = t.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok(record) => {
                self.give_back(entry);
                Ok((record, times))
            }
            Err(e) => {
                self.lock().in_use[slot(kind)] -= entry.prepared.bytes();
                Err(e)
            }
        }
    }

    /// A matching idle entry, taken out (counted in use); checks the model first.
    fn take(&self, model: &Model, key: &PoolKey) -> Result<Option<Entry>> {
        let mut st = self.lock();
        let id = (model as *const Model as usize, model.config.clone());
        match &st.model {
            None => st.model = Some(id),
            Some(m) if *m == id => {}
            Some((_, c)) => {
                return Err(RuntimeError::Contract(format!(
                    "this pool holds the weights of a {} model with {} layers; a run of another model needs a pool of its own",
                    c.preset, c.layers
                )))
            }
        }
        let Some(i) = st.idle.iter().position(|e| e.key == *key) else { return Ok(None) };
        let e = st.idle.swap_remove(i);
        st.in_use[slot(key.backend)] += e.prepared.bytes();
        Ok(Some(e))
    }

    /// Open and prepare a new entry (counted in use), making room first; retried once without
    /// the idle entries of its kind when it fails while they hold memory.
    fn open_prepared(&self, model: &Model, key: &PoolKey) -> Result<Entry> {
        let k = slot(key.backend);
        // Room for one more entry as large as the largest of its kind seen so far.
        let expect = {
            let st = self.lock();
            st.idle.iter().filter(|e| e.key.backend == key.backend).map(|e| e.prepared.bytes()).max().unwrap_or(0)
        };
        self.evict(key.backend, expect);
        let attempt = || -> Result<Entry> {
            let mut backend = open_with(key.backend, key.layout.tp.get(), &key.open)?;
            let prepared = prepare(model, key.layout, backend.as_mut())?;
            self.prepares.fetch_add(1, Ordering::SeqCst);
            Ok(Entry { key: *key, backend, prepared, last_used: 0 })
        };
        let entry = match attempt() {
            Ok(e) => e,
            Err(first) => {
                let dropped = {
                    let mut st = self.lock();
                    let before = st.idle.len();
                    st.idle.retain(|e| e.key.backend != key.backend);
                    before - st.idle.len()
                };
                if dropped == 0 {
                    return Err(first);
                }
                attempt()?
            }
        };
        self.lock().in_use[k] += entry.prepared.bytes();
        Ok(entry)
    }

    /// Drop least recently used idle entries of `kind` until `extra` more bytes fit its budget.
    fn evict(&self, kind: BackendKind, extra: u64) {
        let mut st = self.lock();
        let budget = self.budget.of(kind);
        loop {
            let idle: u64 = st.idle.iter().filter(|e| e.key.backend == kind).map(|e| e.prepared.bytes()).sum();
            if idle + st.in_use[slot(kind)] + extra <= budget {
                return;
            }
            let oldest = st
                .idle
                .iter()
                .enumerate()
                .filter(|(_, e)| e.key.backend == kind)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => drop(st.idle.swap_remove(i)),
                None => return,
            }
        }
    }

    /// Return an entry after a successful run; it stays only within the budget.
    fn give_back(&self, mut entry: Entry) {
        let kind = entry.key.backend;
        entry.last_used = self.clock.fetch_add(1, Ordering::SeqCst) + 1;
        {
            let mut st = self.lock();
            st.in_use[slot(kind)] -= entry.prepared.bytes();
            st.idle.push(entry);
            while st.idle.len() > self.budget.max_idle {
                let oldest = st.idle.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i);
                if let Some(i) = oldest {
                    drop(st.idle.swap_remove(i));
                }
            }
        }
        self.evict(kind, 0);
    }
}
