//! Runs computed once per key and shared by every job of a suite — census and class baselines —
//! with host workers on several threads (`run --jobs`): the first worker to ask for a key runs it
//! while the others asking for the same key wait for that result, instead of running the same
//! configuration again beside it (one key, one run).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};

/// Key → a value computed at most once.
pub(super) struct Memo<K, V> {
    cells: Mutex<HashMap<K, Arc<OnceLock<V>>>>,
}

impl<K: Eq + Hash, V: Clone> Memo<K, V> {
    pub fn new() -> Memo<K, V> {
        Memo { cells: Mutex::new(HashMap::new()) }
    }

    fn cell(&self, key: K) -> Arc<OnceLock<V>> {
        // A poisoned map is still a map: a worker that panicked inserted a cell or nothing.
        self.cells.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default().clone()
    }

    /// The value of `key`: computed by `compute` if no one has (the map stays unlocked meanwhile,
    /// so other keys proceed), or waited for while another worker computes it.
    pub fn get_or_compute(&self, key: K, compute: impl FnOnce() -> V) -> V {
        self.cell(key).get_or_init(compute).clone()
    }

    /// Keep `value` as `key`'s unless it already has one.
    pub fn offer(&self, key: K, value: impl FnOnce() -> V) {
        let cell = self.cell(key);
        if cell.get().is_none() {
            let _ = cell.set(value());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Eight threads asking for one key at once run it once and all get its value; another key
    /// is its own run; an offered value is kept only where none was.
    #[test]
    fn one_key_runs_once_however_many_ask() {
        let memo: Memo<u32, u64> = Memo::new();
        let runs = AtomicUsize::new(0);
        let got: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        memo.get_or_compute(7, || {
                            runs.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            49
                        })
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got, vec![49; 8]);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for one key");
        assert_eq!(memo.get_or_compute(8, || 64), 64, "another key is another run");
        memo.offer(7, || 0);
        assert_eq!(memo.get_or_compute(7, || 1), 49, "an offer never replaces a value");
        memo.offer(9, || 81);
        assert_eq!(memo.get_or_compute(9, || 1), 81, "an offer fills an empty key");
    }
}
