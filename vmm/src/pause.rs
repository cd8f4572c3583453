//! Pausing and resuming the vCPUs. A pause raises a flag and kicks every vCPU thread out of
//! KVM_RUN (the kick signal of [`crate::vcpu`], repeated until all are parked, since a kick
//! that lands just before KVM_RUN is lost); each vCPU completes its last port/MMIO exit,
//! parks, and while parked reads its own state when a snapshot asks for it. Resuming releases
//! them. Exit counters are never reset.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::exit::ExitLatch;
use crate::snapshot::state::VcpuState;

/// How often parked vCPUs look at the exit latch.
const PARKED_POLL: Duration = Duration::from_millis(50);

/// Errors pausing or capturing the vCPUs.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("the VM is stopping")]
    Stopping,
    #[error("{parked} of {total} vCPUs parked within {0:?}", .timeout)]
    Timeout {
        parked: usize,
        total: usize,
        timeout: Duration,
    },
    #[error("the VM is not paused")]
    NotPaused,
    #[error("{0}")]
    Capture(String),
}

#[derive(Default)]
struct Gate {
    paused: bool,
    parked: usize,
    /// Bumped by each capture request; a parked vCPU captures once per generation.
    capture_gen: u64,
    msrs: Vec<u32>,
    captured: Vec<Option<Result<VcpuState, String>>>,
}

/// See the module documentation. Shared by the vCPU threads and the controller.
#[derive(Default)]
pub struct PauseGate {
    wanted: AtomicBool,
    gate: Mutex<Gate>,
    cv: Condvar,
}

impl PauseGate {
    fn lock(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether vCPUs should park (cheap; checked before every KVM_RUN).
    pub fn pause_requested(&self) -> bool {
        self.wanted.load(Ordering::Acquire)
    }

    /// Whether a pause is in force.
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// vCPU side: parks until resumed or the VM stops, capturing state on request.
    pub fn park(
        &self,
        id: usize,
        latch: &ExitLatch,
        capture: &mut dyn FnMut(&[u32]) -> Result<VcpuState, String>,
    ) {
        let mut g = self.lock();
        g.parked += 1;
        self.cv.notify_all();
        let mut seen_gen = g.capture_gen;
        while g.paused && !latch.stopping() {
            if g.capture_gen != seen_gen {
                seen_gen = g.capture_gen;
                let msrs = g.msrs.clone();
                drop(g);
                let r = capture(&msrs);
                g = self.lock();
                if let Some(slot) = g.captured.get_mut(id) {
                    *slot = Some(r);
                }
                self.cv.notify_all();
                continue;
            }
            g = self
                .cv
                .wait_timeout(g, PARKED_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        g.parked -= 1;
        self.cv.notify_all();
    }

    /// Controller side: asks every vCPU to park and waits (calling `kick` every millisecond)
    /// until `total` have. On failure the pause is lifted again.
    pub fn pause(
        &self,
        total: usize,
        latch: &ExitLatch,
        kick: &dyn Fn(),
        timeout: Duration,
    ) -> Result<(), PauseError> {
        let mut g = self.lock();
        g.paused = true;
        self.wanted.store(true, Ordering::Release);
        let start = Instant::now();
        while g.parked < total {
            if latch.stopping() || start.elapsed() > timeout {
                let parked = g.parked;
                drop(g);
                self.resume();
                return Err(if latch.stopping() {
                    PauseError::Stopping
                } else {
                    PauseError::Timeout {
                        parked,
                        total,
                        timeout,
                    }
                });
            }
            drop(g);
            kick();
            g = self.lock();
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(1))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    /// Controller side: has each of the `total` parked vCPUs read its state (MSRs `msrs`).
    pub fn capture(
        &self,
        total: usize,
        msrs: &[u32],
        latch: &ExitLatch,
        timeout: Duration,
    ) -> Result<Vec<VcpuState>, PauseError> {
        let mut g = self.lock();
        if !g.paused || g.parked < total {
            return Err(PauseError::NotPaused);
        }
        g.capture_gen += 1;
        g.msrs = msrs.to_vec();
        g.captured = (0..total).map(|_| None).collect();
        self.cv.notify_all();
        let start = Instant::now();
        while g.captured.iter().any(Option::is_none) {
            if latch.stopping() {
                return Err(PauseError::Stopping);
            }
            if start.elapsed() > timeout {
                return Err(PauseError::Capture(format!(
                    "vCPUs did not report their state within {timeout:?}"
                )));
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(5))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        std::mem::take(&mut g.captured)
            .into_iter()
            .map(|r| match r {
                Some(Ok(s)) => Ok(s),
                Some(Err(e)) => Err(PauseError::Capture(e)),
                None => Err(PauseError::Capture("missing vCPU state".into())),
            })
            .collect()
    }

    /// Lifts the pause: parked vCPUs return to KVM_RUN.
    pub fn resume(&self) {
        let mut g = self.lock();
        g.paused = false;
        self.wanted.store(false, Ordering::Release);
        self.cv.notify_all();
    }
}
