//! An in-memory [`Mover`] between "processes" that are threads of one test: FIFO queues per
//! (kind, sender, receiver), so the distributed wrapper's program — which half of each copy a
//! process issues, what it broadcasts, how digests come back — is tested on CPU over the host
//! backend, bit for bit against a single-process run. It moves exactly the bytes it is given.

use super::{Mover, ProcessLayout};
use crate::backend::{Backend, Slice};
use crate::error::RuntimeError;
use crate::Result;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What a queued message is (each kind has its own FIFO per sender → receiver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// A copy between global ranks (sender, receiver are global ranks).
    Copy,
    /// A broadcast's payload (sender, receiver are processes).
    Broadcast,
    /// A process's words of a sum (sender, receiver are processes).
    Sum,
}

type Queues = HashMap<(Kind, usize, usize), VecDeque<Vec<u64>>>;

/// The queues every "process" of one test shares.
#[derive(Default)]
pub struct MemoryHub {
    queues: Mutex<Queues>,
    ready: Condvar,
}

impl MemoryHub {
    pub fn new() -> Arc<MemoryHub> {
        Arc::new(MemoryHub::default())
    }

    fn push(&self, key: (Kind, usize, usize), v: Vec<u64>) {
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default().push_back(v);
        self.ready.notify_all();
    }

    fn pop(&self, key: (Kind, usize, usize), timeout: Duration) -> Result<Vec<u64>> {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(v) = q.get_mut(&key).and_then(|d| d.pop_front()) {
                return Ok(v);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(RuntimeError::Device {
                    location: format!("in-memory mover: waiting for {:?} {} → {}", key.0, key.1, key.2),
                    detail: format!("nothing arrived within {:.1} s", timeout.as_secs_f64()),
                });
            }
            q = self.ready.wait_timeout(q, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// Tampering for negative controls: called on the words of every copy this mover sends.
pub type Tamper = Box<dyn FnMut(usize, &mut [u64]) + Send>;

/// One process's end of the hub.
pub struct MemoryMover {
    hub: Arc<MemoryHub>,
    layout: ProcessLayout,
    timeout: Duration,
    sends: usize,
    tamper: Option<Tamper>,
}

impl MemoryMover {
    pub fn new(hub: Arc<MemoryHub>, layout: ProcessLayout, timeout: Duration) -> MemoryMover {
        MemoryMover { hub, layout, timeout, sends: 0, tamper: None }
    }

    /// A mover that lets `tamper` change the words of each copy it sends (`tamper(n, words)`
    /// with `n` the index of the send): a negative control must then see different records.
    pub fn tampering(mut self, tamper: Tamper) -> MemoryMover {
        self.tamper = Some(tamper);
        self
    }

    fn widen(v: &[f32]) -> Vec<u64> {
        v.iter().map(|x| u64::from(x.to_bits())).collect()
    }

    fn narrow(v: &[u64]) -> Vec<f32> {
        v.iter().map(|w| f32::from_bits(*w as u32)).collect()
    }
}

impl<B: Backend + ?Sized> Mover<B> for MemoryMover {
    fn describe(&self) -> String {
        format!("in-memory queues ({} processes)", self.layout.spec.processes)
    }

    fn send(&mut self, b: &mut B, from: usize, src: Slice, to: usize) -> Result<()> {
        // `read` waits for the rank's earlier work: the producer has run.
        let mut words = Self::widen(&b.read(from, src)?);
        if let Some(t) = self.tamper.as_mut() {
            t(self.sends, &mut words);
        }
        self.sends += 1;
        self.hub.push((Kind::Copy, self.layout.global(from), to), words);
        Ok(())
    }

    fn recv(&mut self, b: &mut B, to: usize, dst: Slice, from: usize) -> Result<()> {
        let words = self.hub.pop((Kind::Copy, from, self.layout.global(to)), self.timeout)?;
        if words.len() != dst.len {
            return Err(RuntimeError::Contract(format!(
                "in-memory recv: {} words arrived for a slice of {}",
                words.len(),
                dst.len
            )));
        }
        // `write` is queued behind the rank's earlier work, before its later work.
        b.write(to, dst, &Self::narrow(&words))
    }

    fn broadcast(&mut self, b: &mut B, root: usize, src: Option<(usize, Slice)>, len: usize) -> Result<Vec<f32>> {
        let me = self.layout.spec.process;
        let owner = self.layout.owner(root);
        match src {
            Some((l, s)) => {
                let v = b.read(l, s)?;
                for p in (0..self.layout.spec.processes).filter(|p| *p != me) {
                    self.hub.push((Kind::Broadcast, me, p), Self::widen(&v));
                }
                Ok(v)
            }
            None => {
                let words = self.hub.pop((Kind::Broadcast, owner, me), self.timeout)?;
                if words.len() != len {
                    return Err(RuntimeError::Contract(format!(
                        "in-memory broadcast from rank {root}: {} words arrived, {len} expected",
                        words.len()
                    )));
                }
                Ok(Self::narrow(&words))
            }
        }
    }

    fn sum_u64(&mut self, _b: &mut B, words: &[u64]) -> Result<Vec<u64>> {
        let me = self.layout.spec.process;
        let n = self.layout.spec.processes;
        for p in (0..n).filter(|p| *p != me) {
            self.hub.push((Kind::Sum, me, p), words.to_vec());
        }
        let mut sum = words.to_vec();
        for p in (0..n).filter(|p| *p != me) {
            let theirs = self.hub.pop((Kind::Sum, p, me), self.timeout)?;
            if theirs.len() != sum.len() {
                return Err(RuntimeError::Contract(format!(
                    "in-memory sum: process {p} gave {} words, process {me} {}",
                    theirs.len(),
                    sum.len()
                )));
            }
            for (s, t) in sum.iter_mut().zip(theirs) {
                *s = s.wrapping_add(t);
            }
        }
        Ok(sum)
    }
}
