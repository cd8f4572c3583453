//! The per-job time limit: a thread that preempts the running job when its deadline passes,
//! so a never-ending kernel cannot hold the GPU. Arming and disarming wake the thread only when
//! they must (a deadline earlier than the one it sleeps towards, or it sleeps with none): every
//! job arms and disarms it, and waking a sleeping thread costs tens of microseconds in a VM.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use pgpu::PreemptHandle;

#[derive(Default)]
struct Slot {
    armed: Option<(Instant, PreemptHandle)>,
    fired: bool,
    stop: bool,
    /// The thread sleeps until this instant (`None`: until notified).
    sleeping_until: Option<Instant>,
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
                    match g.armed.as_ref().map(|(d, h)| (*d, h.clone())) {
                        Some((deadline, handle)) => {
                            let now = Instant::now();
                            if now >= deadline {
                                handle.request();
                                g.fired = true;
                                g.armed = None;
                            } else {
                                let wait = deadline - now;
                                g.sleeping_until = Some(deadline);
                                g = cv
                                    .wait_timeout(g, wait)
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .0;
                            }
                        }
                        None => {
                            g.sleeping_until = None;
                            g = cv.wait(g).unwrap_or_else(PoisonError::into_inner);
                        }
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
        // A thread sleeping towards an earlier or equal instant finds the deadline then.
        if g.sleeping_until.is_none_or(|t| deadline < t) {
            cv.notify_all();
        }
    }

    /// Disarms; returns whether the deadline passed (the job was preempted by the watchdog).
    pub fn disarm(&self) -> bool {
        let (m, _) = &*self.slot;
        let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
        g.armed = None;
        // No wake-up: the thread finds nothing armed when its sleep ends.
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
