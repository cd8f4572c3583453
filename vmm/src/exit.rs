//! Why the VM stopped, and the shared latch every thread uses to say so: the first reason
//! wins, wakes the event loop, and tells the vCPUs to stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use vmm_sys_util::eventfd::EventFd;

/// Why the VM stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest wrote this code to the debug-exit port.
    Guest(u8),
    /// The guest reset the machine (i8042 or a KVM reset event).
    Reset,
    /// The guest powered off (KVM shutdown system event).
    PowerOff,
    /// The user pressed Ctrl-A x on the console.
    ConsoleQuit,
    /// The guest crashed hard: KVM_EXIT_SHUTDOWN (e.g. a triple fault) on this vCPU.
    TripleFault { vcpu: u8 },
    /// KVM could not run the vCPU or reported an internal error.
    VcpuError { vcpu: u8, what: String },
    /// `--timeout` expired.
    Timeout,
    /// A termination signal arrived.
    Signal(i32),
    /// The VM was migrated (`ctl migrate`): it runs on in the destination process.
    Migrated,
}

/// Exit code for a guest crash (triple fault).
pub const CODE_GUEST_CRASH: i32 = 3;
/// Exit code for a vCPU/KVM failure.
pub const CODE_VCPU_ERROR: i32 = 4;
/// Exit code for `--timeout` (as timeout(1) uses).
pub const CODE_TIMEOUT: i32 = 124;

impl ExitReason {
    /// The process exit code for this reason.
    pub fn code(&self) -> i32 {
        match self {
            ExitReason::Guest(c) => i32::from(*c),
            ExitReason::Reset
            | ExitReason::PowerOff
            | ExitReason::ConsoleQuit
            | ExitReason::Migrated => 0,
            ExitReason::TripleFault { .. } => CODE_GUEST_CRASH,
            ExitReason::VcpuError { .. } => CODE_VCPU_ERROR,
            ExitReason::Timeout => CODE_TIMEOUT,
            ExitReason::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitReason::Guest(c) => write!(f, "guest exited with code {c}"),
            ExitReason::Reset => write!(f, "guest reset the machine"),
            ExitReason::PowerOff => write!(f, "guest powered off"),
            ExitReason::ConsoleQuit => write!(f, "quit from the console (Ctrl-A x)"),
            ExitReason::TripleFault { vcpu } => {
                write!(f, "guest crashed: vCPU {vcpu} shut down (triple fault)")
            }
            ExitReason::VcpuError { vcpu, what } => write!(f, "vCPU {vcpu} failed: {what}"),
            ExitReason::Timeout => write!(f, "timed out (--timeout)"),
            ExitReason::Signal(s) => write!(f, "stopped by signal {s}"),
            ExitReason::Migrated => write!(f, "migrated to another process"),
        }
    }
}

/// The latch. Shared by `Arc`.
#[derive(Debug)]
pub struct ExitLatch {
    reason: Mutex<Option<ExitReason>>,
    stop: AtomicBool,
    event: EventFd,
}

impl ExitLatch {
    /// A new, unset latch.
    pub fn new() -> std::io::Result<Self> {
        Ok(ExitLatch {
            reason: Mutex::new(None),
            stop: AtomicBool::new(false),
            event: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    /// Records `reason` unless one was recorded already, and wakes everyone.
    pub fn request(&self, reason: ExitReason) {
        let mut r = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if r.is_none() {
            log::debug!("exit requested: {reason}");
            *r = Some(reason);
        }
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self.event.write(1) {
            log::error!("wake the event loop: {e}");
        }
    }

    /// Whether the VM should stop.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The recorded reason.
    pub fn reason(&self) -> Option<ExitReason> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The eventfd the event loop watches.
    pub fn event(&self) -> &EventFd {
        &self.event
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins_and_codes() {
        let l = ExitLatch::new().unwrap();
        assert!(!l.stopping());
        l.request(ExitReason::Guest(7));
        l.request(ExitReason::Timeout);
        assert!(l.stopping());
        assert_eq!(l.reason(), Some(ExitReason::Guest(7)));
        assert_eq!(ExitReason::Guest(7).code(), 7);
        assert_eq!(ExitReason::TripleFault { vcpu: 0 }.code(), CODE_GUEST_CRASH);
        assert_eq!(ExitReason::Signal(15).code(), 143);
        assert_eq!(ExitReason::Timeout.code(), 124);
    }
}
