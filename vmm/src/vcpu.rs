//! vCPU threads: each runs KVM_RUN in a loop, dispatches port and MMIO exits to the buses,
//! counts exits, and turns KVM's shutdown/error exits into a VM exit reason. A stopping or
//! pausing VM kicks its vCPUs out of KVM_RUN with a real-time signal; a pausing one parks them
//! at the [`PauseGate`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::{KVM_SYSTEM_EVENT_CRASH, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::{VcpuExit, VcpuFd};
use mmio::Bus;
use serde::Serialize;
use vmm_sys_util::signal::{Killable, SIGRTMIN, register_signal_handler};

use crate::exit::{ExitLatch, ExitReason};
use crate::pause::PauseGate;

/// Exits of one vCPU by kind.
#[derive(Debug, Default)]
pub struct ExitCounters {
    io_in: AtomicU64,
    io_out: AtomicU64,
    mmio_read: AtomicU64,
    mmio_write: AtomicU64,
    other: AtomicU64,
    handle_ns: AtomicU64,
}

/// A snapshot of [`ExitCounters`].
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ExitCounts {
    pub io_in: u64,
    pub io_out: u64,
    pub mmio_read: u64,
    pub mmio_write: u64,
    pub other: u64,
    /// Time spent in the VMM handling port and MMIO exits (bus dispatch and device), in ns.
    pub handle_ns: u64,
}

impl ExitCounters {
    pub fn snapshot(&self) -> ExitCounts {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ExitCounts {
            io_in: l(&self.io_in),
            io_out: l(&self.io_out),
            mmio_read: l(&self.mmio_read),
            mmio_write: l(&self.mmio_write),
            other: l(&self.other),
            handle_ns: l(&self.handle_ns),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Everything a vCPU thread needs.
pub struct Vcpu {
    pub id: u8,
    pub fd: VcpuFd,
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub latch: Arc<ExitLatch>,
    pub counters: Arc<ExitCounters>,
    pub gate: Arc<PauseGate>,
}

/// Offset from SIGRTMIN of the signal used to kick vCPUs.
const KICK_SIGNAL_OFFSET: i32 = 0;

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the (empty) kick signal handler; call once before starting vCPUs.
pub fn install_kick_handler() -> Result<(), vmm_sys_util::errno::Error> {
    register_signal_handler(SIGRTMIN() + KICK_SIGNAL_OFFSET, kick_handler)
}

impl Vcpu {
    /// Starts the vCPU's thread.
    pub fn spawn(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name(format!("vcpu{}", self.id))
            .spawn(move || self.run())
    }

    fn run(mut self) {
        let id = self.id;
        log::debug!("vcpu{id}: running");
        while !self.latch.stopping() {
            if self.gate.pause_requested() {
                if let Some(reason) = self.complete_pending_exit() {
                    self.latch.request(reason);
                    break;
                }
                let (fd, gate, latch) = (&self.fd, &self.gate, &self.latch);
                gate.park(usize::from(id), latch, &mut |msrs| {
                    crate::snapshot::cpu::capture(fd, u32::from(id), msrs)
                        .map_err(|e| e.to_string())
                });
                continue;
            }
            let reason = match self.fd.run() {
                Ok(exit) => dispatch(exit, id, &self.pio, &self.mmio, &self.counters),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    None
                }
                Err(e) => Some(ExitReason::VcpuError {
                    vcpu: id,
                    what: format!("KVM_RUN: {e}"),
                }),
            };
            if let Some(reason) = reason {
                if matches!(
                    reason,
                    ExitReason::VcpuError { .. } | ExitReason::TripleFault { .. }
                ) {
                    self.log_state();
                }
                self.latch.request(reason);
                break;
            }
        }
        log::debug!("vcpu{id}: stopped");
    }
}

impl Vcpu {
    /// Re-enters KVM with `immediate_exit` set so that it completes the last port or MMIO exit
    /// (an IN's value reaches RAX only then) without running the guest; KVM's documented way
    /// to bring a vCPU to a consistent state before reading it.
    fn complete_pending_exit(&mut self) -> Option<ExitReason> {
        self.fd.set_kvm_immediate_exit(1);
        let mut reason = None;
        // A string instruction may need several rounds; bounded all the same.
        for _ in 0..64 {
            match self.fd.run() {
                Ok(exit) => {
                    reason = dispatch(exit, self.id, &self.pio, &self.mmio, &self.counters);
                    if reason.is_some() {
                        break;
                    }
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => break,
                Err(e) => {
                    reason = Some(ExitReason::VcpuError {
                        vcpu: self.id,
                        what: format!("KVM_RUN (completing an exit before a pause): {e}"),
                    });
                    break;
                }
            }
        }
        self.fd.set_kvm_immediate_exit(0);
        reason
    }

    /// Logs the registers that explain a crash.
    fn log_state(&mut self) {
        let run = self.fd.get_kvm_run();
        if run.exit_reason == kvm_bindings::KVM_EXIT_INTERNAL_ERROR {
            // SAFETY: the kernel filled the `internal` member for this exit reason.
            let internal = unsafe { run.__bindgen_anon_1.internal };
            let n = (internal.ndata as usize).min(internal.data.len());
            log::error!(
                "vcpu{}: KVM internal error, suberror {} data {:x?}",
                self.id,
                internal.suberror,
                &internal.data[..n]
            );
        }
        match (self.fd.get_regs(), self.fd.get_sregs()) {
            (Ok(r), Ok(s)) => log::error!(
                "vcpu{}: rip={:#x} rsp={:#x} rflags={:#x} cr0={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#x}",
                self.id,
                r.rip,
                r.rsp,
                r.rflags,
                s.cr0,
                s.cr3,
                s.cr4,
                s.efer,
                s.cs.selector
            ),
            (Err(e), _) | (_, Err(e)) => log::error!("vcpu{}: cannot read registers: {e}", self.id),
        }
    }
}

/// Handles one exit; returns a reason if the VM must stop.
fn dispatch(
    exit: VcpuExit<'_>,
    id: u8,
    pio: &Bus,
    mmio: &Bus,
    c: &ExitCounters,
) -> Option<ExitReason> {
    let start = Instant::now();
    let timed = |c: &ExitCounters| {
        c.handle_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed)
    };
    match exit {
        VcpuExit::IoIn(port, data) => {
            bump(&c.io_in);
            pio.read(u64::from(port), data);
            timed(c);
        }
        VcpuExit::IoOut(port, data) => {
            bump(&c.io_out);
            pio.write(u64::from(port), data);
            timed(c);
        }
        VcpuExit::MmioRead(addr, data) => {
            bump(&c.mmio_read);
            mmio.read(addr, data);
            timed(c);
        }
        VcpuExit::MmioWrite(addr, data) => {
            bump(&c.mmio_write);
            mmio.write(addr, data);
            timed(c);
        }
        VcpuExit::Shutdown => return Some(ExitReason::TripleFault { vcpu: id }),
        VcpuExit::SystemEvent(kind, _) => {
            bump(&c.other);
            return Some(match kind {
                KVM_SYSTEM_EVENT_SHUTDOWN => ExitReason::PowerOff,
                KVM_SYSTEM_EVENT_RESET => ExitReason::Reset,
                KVM_SYSTEM_EVENT_CRASH => ExitReason::TripleFault { vcpu: id },
                other => ExitReason::VcpuError {
                    vcpu: id,
                    what: format!("system event {other}"),
                },
            });
        }
        VcpuExit::FailEntry(reason, cpu) => {
            return Some(ExitReason::VcpuError {
                vcpu: id,
                what: format!("VM entry failed (hardware reason {reason:#x} on cpu {cpu})"),
            });
        }
        VcpuExit::InternalError => {
            return Some(ExitReason::VcpuError {
                vcpu: id,
                what: "KVM internal error".into(),
            });
        }
        VcpuExit::Hlt => {
            // With the in-kernel irqchip KVM handles HLT itself; seeing it means the guest halted
            // with nothing that could wake it.
            return Some(ExitReason::VcpuError {
                vcpu: id,
                what: "halted with no way to wake".into(),
            });
        }
        other => {
            bump(&c.other);
            log::warn!("vcpu{id}: unhandled exit {other:?}");
        }
    }
    None
}

/// Sends the kick signal to one vCPU thread (harmless if it is parked or has ended but is not
/// joined yet).
pub fn kick(t: &JoinHandle<()>) {
    let _ = t.kill(SIGRTMIN() + KICK_SIGNAL_OFFSET);
}

/// Kicks every vCPU thread until it has left KVM_RUN and joins it (at most `patience` each).
pub fn stop_all(threads: Vec<JoinHandle<()>>, patience: Duration) {
    for t in threads {
        let start = Instant::now();
        while !t.is_finished() && start.elapsed() < patience {
            let _ = t.kill(SIGRTMIN() + KICK_SIGNAL_OFFSET);
            std::thread::sleep(Duration::from_micros(200));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            log::error!("a vCPU thread did not stop within {patience:?}");
        }
    }
}
