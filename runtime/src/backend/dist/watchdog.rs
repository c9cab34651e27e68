//! A timeout for calls that cannot time out themselves.
//!
//! NCCL operations between processes wait on the device for their peer: if the peer process died
//! or stopped, the kernel spins and the host call that waits for it (a stream synchronize, a
//! communicator's creation) never returns. NCCL has no per-call timeout for that, so every
//! distributed call is entered here; a background thread checks the call in progress and, once
//! it has run longer than the timeout, hands a [`RuntimeError::Watchdog`] naming the process, the
//! call and the ranks to the expiry action.
//!
//! The stuck call cannot be unblocked from inside the library, so the process has to end — but
//! whether and how it ends (status, message) is the binary's decision, not a library's: the binary
//! installs an [`OverrunHook`] with [`install_overrun_hook`] (`src/main.rs`: print the error and
//! end with status 2 at once, so the other processes' own watchdogs end them in turn instead of
//! hanging forever), and `backend::open_distributed` refuses to start a distributed run without
//! one.

use crate::error::RuntimeError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What to do when a call overruns: receives the [`RuntimeError::Watchdog`].
pub type OnExpire = Box<dyn Fn(RuntimeError) + Send + 'static>;

/// The binary's answer to an overrun distributed call: it must not return, because the call it
/// answers never will (the thread that made it waits on the device for a peer that is gone).
pub type OverrunHook = fn(RuntimeError) -> !;

static OVERRUN_HOOK: OnceLock<OverrunHook> = OnceLock::new();

/// Install the binary's [`OverrunHook`]; the first installation wins (the process has one owner of
/// its exit decisions).
pub fn install_overrun_hook(hook: OverrunHook) {
    let _ = OVERRUN_HOOK.set(hook);
}

/// The installed [`OverrunHook`], if the binary installed one.
pub fn overrun_hook() -> Option<OverrunHook> {
    OVERRUN_HOOK.get().copied()
}

struct State {
    who: String,
    timeout: Duration,
    /// The call in progress and when it started.
    current: Mutex<Option<(String, Instant)>>,
    stop: AtomicBool,
}

/// The watchdog of one process's distributed backend; stops its thread when dropped.
pub struct Watchdog {
    state: Arc<State>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Marks a call in progress until dropped.
pub struct WatchGuard {
    state: Arc<State>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        *self.state.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// The overrun of a call that has run past `timeout` at `now`, or `None` while it has not.
pub fn overdue(
    who: &str,
    current: Option<&(String, Instant)>,
    now: Instant,
    timeout: Duration,
) -> Option<RuntimeError> {
    let (call, since) = current?;
    let ran = now.saturating_duration_since(*since);
    (ran > timeout).then(|| RuntimeError::Watchdog {
        process: who.to_string(),
        call: call.clone(),
        ran,
        limit: timeout,
    })
}

impl Watchdog {
    /// Start watching for `who` (e.g. `process 1/2`): a call running longer than `timeout` calls
    /// `on_expire` once with its [`RuntimeError::Watchdog`].
    pub fn start(who: impl Into<String>, timeout: Duration, on_expire: OnExpire) -> Watchdog {
        let state =
            Arc::new(State { who: who.into(), timeout, current: Mutex::new(None), stop: AtomicBool::new(false) });
        let s = state.clone();
        let tick = (timeout / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
        let thread = std::thread::Builder::new()
            .name("memra-watchdog".into())
            .spawn(move || {
                while !s.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(tick);
                    let overrun = {
                        let cur = s.current.lock().unwrap_or_else(|p| p.into_inner());
                        overdue(&s.who, cur.as_ref(), Instant::now(), s.timeout)
                    };
                    if let Some(e) = overrun {
                        on_expire(e);
                        return;
                    }
                }
            })
            .ok();
        Watchdog { state, thread }
    }

    /// Mark `call` as in progress until the guard drops.
    pub fn enter(&self, call: String) -> WatchGuard {
        *self.state.current.lock().unwrap_or_else(|p| p.into_inner()) = Some((call, Instant::now()));
        WatchGuard { state: self.state.clone() }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn the_overrun_names_the_process_the_call_and_the_time() {
        let t0 = Instant::now();
        let cur = ("recv on rank 0 → rank 1".to_string(), t0);
        assert!(overdue("process 1/2", Some(&cur), t0 + Duration::from_secs(5), Duration::from_secs(10)).is_none());
        assert!(overdue("process 1/2", None, t0 + Duration::from_secs(50), Duration::from_secs(10)).is_none());
        let e = overdue("process 1/2", Some(&cur), t0 + Duration::from_secs(12), Duration::from_secs(10)).unwrap();
        match &e {
            RuntimeError::Watchdog { process, call, ran, limit } => {
                assert_eq!((process.as_str(), call.as_str()), ("process 1/2", "recv on rank 0 → rank 1"));
                assert_eq!((*ran, *limit), (Duration::from_secs(12), Duration::from_secs(10)));
            }
            other => panic!("not a watchdog overrun: {other:?}"),
        }
        let m = e.to_string();
        assert!(
            m.starts_with("process 1/2: `recv on rank 0 → rank 1` has not returned after 12 s (timeout 10 s)"),
            "{m}"
        );
    }

    #[test]
    fn a_stuck_call_expires_and_a_finished_one_does_not() {
        let (tx, rx) = channel();
        let tx = Mutex::new(tx);
        let w = Watchdog::start(
            "process 0/2",
            Duration::from_millis(60),
            Box::new(move |e: RuntimeError| {
                let _ = tx.lock().unwrap().send(e.to_string());
            }),
        );
        // Calls that return in time never fire.
        for _ in 0..5 {
            let g = w.enter("collect on every rank".into());
            std::thread::sleep(Duration::from_millis(10));
            drop(g);
        }
        std::thread::sleep(Duration::from_millis(150));
        assert!(rx.try_recv().is_err(), "nothing was stuck");
        let _g = w.enter("read (broadcast from the owner) on rank 0".into());
        let m = rx.recv_timeout(Duration::from_secs(5)).expect("the stuck call expires");
        assert!(m.contains("process 0/2: `read (broadcast from the owner) on rank 0` has not returned"), "{m}");
    }
}
