//! The per-job time limit: a thread that preempts the running job when its deadline passes,
//! so a never-ending kernel cannot hold the GPU.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use pgpu::PreemptHandle;

#[derive(Default)]
struct Slot {
    armed: Option<(Instant, PreemptHandle)>,
    fired: bool,
    stop: bool,
}

/// See the module documentation.
pub struct Watchdog {
    slot: Arc<(Mutex<Slot>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    pub fn start() -> std::io::Result<Self> {
        let slot: Arc<(Mutex<Slot>, Condvar)> = Arc::default();
        let s = slot.clone();
        let thread = std::thread::Builder::new()
            .name("vgpu-watchdog".into())
            .spawn(move || {
                let (m, cv) = &*s;
                let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
                while !g.stop {
                    match &g.armed {
                        Some((deadline, handle)) => {
                            let now = Instant::now();
                            if now >= *deadline {
                                handle.request();
                                g.fired = true;
                                g.armed = None;
                            } else {
                                let wait = *deadline - now;
                                g = cv
                                    .wait_timeout(g, wait)
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .0;
                            }
                        }
                        None => g = cv.wait(g).unwrap_or_else(PoisonError::into_inner),
                    }
                }
            })?;
        Ok(Watchdog {
            slot,
            thread: Some(thread),
        })
    }

    /// Preempts `handle` at `deadline` unless disarmed first.
    pub fn arm(&self, deadline: Instant, handle: PreemptHandle) {
        let (m, cv) = &*self.slot;
        let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
        g.armed = Some((deadline, handle));
        g.fired = false;
        cv.notify_all();
    }

    /// Disarms; returns whether the deadline passed (the job was preempted by the watchdog).
    pub fn disarm(&self) -> bool {
        let (m, cv) = &*self.slot;
        let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
        g.armed = None;
        cv.notify_all();
        std::mem::take(&mut g.fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.slot;
            m.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
