//! `vgpu-bench preempt --requester warm`: one long-lived thread makes every preemption
//! request of a run (after its first, a thread that has already called the CUDA driver, as a
//! scheduler's would be), instead of a fresh thread per request (`fresh`, the default: the
//! hook's driver calls then pay the driver's first-call cost on that thread).

use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use pgpu::PreemptHandle;

/// The long-lived requesting thread.
pub struct Requester {
    tx: Option<Sender<(PreemptHandle, Duration)>>,
    done: Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl Requester {
    pub fn new() -> Requester {
        let (tx, rx) = channel::<(PreemptHandle, Duration)>();
        let (done_tx, done) = channel();
        let thread = std::thread::spawn(move || {
            while let Ok((h, d)) = rx.recv() {
                std::thread::sleep(d);
                h.request();
                if done_tx.send(()).is_err() {
                    break;
                }
            }
        });
        Requester {
            tx: Some(tx),
            done,
            thread: Some(thread),
        }
    }

    /// Requests preemption on `h` after `d`; `false` if the thread is gone.
    pub fn request_after(&self, h: &PreemptHandle, d: Duration) -> bool {
        self.tx
            .as_ref()
            .is_some_and(|tx| tx.send((h.clone(), d)).is_ok())
    }

    /// Waits until the request asked last was made.
    pub fn wait(&self) {
        let _ = self.done.recv();
    }
}

impl Drop for Requester {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_arrive_after_the_delay_from_one_thread() {
        let r = Requester::new();
        let h = PreemptHandle::new();
        let t0 = std::time::Instant::now();
        assert!(r.request_after(&h, Duration::from_millis(5)));
        r.wait();
        let at = h.requested_at().expect("requested");
        assert!(at.duration_since(t0) >= Duration::from_millis(5));
        h.clear();
        assert!(r.request_after(&h, Duration::ZERO));
        r.wait();
        assert!(h.is_requested());
    }
}
