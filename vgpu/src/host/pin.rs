//! The CPUs of the thread that holds the GPU (`--gpu host=...,cpus=N[-M]`, issue 25).
//!
//! On sim, the worker holding a grant *is* the GPU: it runs the interpreter. On a host with
//! more runnable threads than cores (64 VMs on 16 cores, their vCPUs booting or running guest
//! code) neither a nice value nor a short slice keeps it on a core: measured on the GPU
//! host, a worker raised to nice −10 was preempted once or twice per slice and then waited
//! 1-3 ms in its run queue (EEVDF's run-to-parity protects the nice-0 thread that took the
//! core for its whole slice, 3 ms on 16 CPUs), and that wait is the late stop vgpud counts.
//! A real GPU does not share its processors with the VMs' vCPUs; reserving host cores for the
//! simulated GPU, as hosts reserve cores for their device back ends, gives the model the same
//! property. With `cpus=`, the worker moves itself onto those CPUs when it starts to wait for a
//! grant and goes back to the CPUs it had when the grant ends or the wait is given up (one
//! `sched_setaffinity` each way); keeping the VMs' other threads off those CPUs is the host's
//! part (`taskset`, cgroup cpusets; `vgpu-bench fairness --gpu-cpus`). Only one VM per GPU holds
//! a grant, so one CPU per GPU is enough. On those CPUs the priorities are what keep the holder
//! running (`HostLink::acquire`, `release`):
//!
//! - the waiting workers of every VM sleep there *at their own level* and are raised (`nice=`)
//!   only when their grant comes; they do not poll for a standby, and they wake only for a
//!   message or a pause (`HostLink::interrupt`), not every 5 ms as they did: 63 waiters'
//!   periodic looks took the CPU from the holder on an H100 host (5-14 ms late stops). The
//!   holder, raised, runs before them, and a grant wakes its worker where no vCPU runs and
//!   where the previous holder just stopped: no move on the switch's path, no run-queue wait
//!   behind vCPUs.
//! - the holder stays raised while its VM keeps the grant between two jobs (the guest's CPU
//!   work on the way to the next job, which the GPU waits for);
//! - the VM's reader thread, which delivers the daemon's preempts while a job runs (a turn
//!   extended while nobody waited has no slice end to stop at by itself), moves there too
//!   while its VM holds the grant: left among the vCPUs it delivered them late in the boot
//!   storm (a 3.9 ms late stop the worker never saw as one);
//! - a VM that ends its run tells the daemon first and moves off after.
//!
//! Measured with 64 sim VMs on 16 cores (docs/performance.md, session 15), each form against no
//! pinning in one lease: waiters left on the vCPUs' CPUs and the worker moved at its grant:
//! the run-queue waits went, grants woken late (3-15 ms) stayed, and the move cost ~50 µs per
//! switch; every waiter raised on the GPU's CPU: their wake-ups (a daemon message, the 5 ms look
//! at a pause) took it from the holder, 21-27 ms late stops; this form: switch latency and
//! utilization no worse than without pinning, and the whole run's preemption maximum ≤ 2 ms in
//! most runs where no pinning had none.
//!
//! Where the set is refused (a CPU outside the process's cpuset) the VM says so once and runs
//! where it was.
//!
//! Known limits: the set is one per VM, not per GPU (a VM moved to another GPU of the daemon
//! keeps it; `vgpu-bench fairness` refuses fewer CPUs than GPUs), and a thread the worker
//! starts while it is on these CPUs inherits them for life (CPU masks have no reset on fork):
//! with the defaults none is (the sim engine's interpreter helpers exist only with
//! `workers=` > 1, `preempt=auto`'s wait timer only under `auto`), and those two would then
//! share the GPU's CPUs.

use std::sync::atomic::{AtomicBool, Ordering};

/// Highest CPU number `cpus=` takes (`cpu_set_t` holds 1024).
pub const MAX_CPU: u16 = 1023;

/// A thread moved by [`Pin::pin`], and the CPUs it goes back to.
pub(crate) struct Pinned {
    tid: libc::pid_t,
    old: Box<libc::cpu_set_t>,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pinned({})", self.tid)
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Pin {
    /// The CPUs (first, last), inclusive; `None`: the thread is left where it is.
    cpus: Option<(u16, u16)>,
    /// Refused once: not asked again (and said once).
    refused: AtomicBool,
}

fn empty_set() -> Box<libc::cpu_set_t> {
    // SAFETY: an all-zero `cpu_set_t` is a valid empty set.
    Box::new(unsafe { std::mem::zeroed() })
}

/// Thread `tid`'s CPUs into `set`.
fn get(tid: libc::pid_t, set: &mut libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: `set` is a live, writable `cpu_set_t` of the size passed.
    if unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Moves thread `tid` onto `set`.
fn set(tid: libc::pid_t, set: &libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: `set` is a live `cpu_set_t` of the size passed, only read.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Pin {
    pub fn new(cpus: Option<(u16, u16)>) -> Self {
        Pin {
            cpus,
            refused: AtomicBool::new(false),
        }
    }

    /// Whether threads are moved (configured and not refused so far).
    pub fn active(&self) -> bool {
        self.cpus.is_some() && !self.refused.load(Ordering::Relaxed)
    }

    /// Moves the calling thread onto the configured CPUs. `None`: nothing changed (off, or
    /// refused).
    pub fn pin(&self) -> Option<Pinned> {
        // SAFETY: gettid has no arguments and cannot fail.
        self.pin_tid(unsafe { libc::gettid() })
    }

    /// Moves thread `tid` of this process onto the configured CPUs.
    pub fn pin_tid(&self, tid: libc::pid_t) -> Option<Pinned> {
        let (first, last) = self.cpus?;
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        let mut old = empty_set();
        let mut want = empty_set();
        for c in first..=last.min(MAX_CPU) {
            // SAFETY: `c` < 1024, within the set.
            unsafe { libc::CPU_SET(usize::from(c), &mut want) };
        }
        match get(tid, &mut old).and_then(|()| set(tid, &want)) {
            Ok(()) => Some(Pinned { tid, old }),
            Err(e) => {
                if !self.refused.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "vgpu: cannot move the GPU worker onto CPUs {first}-{last} while it holds \
                         the GPU ({e}; a CPU outside this process's cpuset?): it runs where it was"
                    );
                }
                None
            }
        }
    }

    /// Puts a moved thread back on its CPUs (from any thread of the process).
    pub fn unpin(&self, p: Pinned) {
        if let Err(e) = set(p.tid, &p.old) {
            log::debug!("vgpu: CPUs of thread {} back: {e}", p.tid);
        }
    }
}

/// Parses `cpus=`: `N` or `N-M` (inclusive, upwards).
pub fn parse(v: &str) -> Option<(u16, u16)> {
    let num = |t: &str| t.parse::<u16>().ok().filter(|&n| n <= MAX_CPU);
    match v.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (num(a)?, num(b)?);
            (a <= b).then_some((a, b))
        }
        None => num(v).map(|n| (n, n)),
    }
}

/// `cpus=` as written: `N` or `N-M`.
pub fn print((a, b): (u16, u16)) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mine() -> Vec<usize> {
        let mut s = empty_set();
        // SAFETY: gettid cannot fail.
        get(unsafe { libc::gettid() }, &mut s).unwrap();
        // SAFETY: `s` is initialised; CPU_ISSET only reads it.
        (0..1024)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &s) })
            .collect()
    }

    #[test]
    fn parses_a_cpu_or_a_range() {
        assert_eq!(parse("14"), Some((14, 14)));
        assert_eq!(parse("2-3"), Some((2, 3)));
        for bad in ["", "3-2", "a", "1-", "-1", "1024", "1,2"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(print((14, 14)), "14");
        assert_eq!(print((2, 3)), "2-3");
    }

    /// The thread runs on the configured CPU while pinned and on all of its own once put
    /// back — pinned on one thread, put back from another (as the link's `lower` may be).
    #[test]
    fn pins_and_puts_back_from_another_thread() {
        let own = mine();
        let last = *own.last().unwrap() as u16;
        let pin = std::sync::Arc::new(Pin::new(Some((last, last))));
        let (tx, rx) = std::sync::mpsc::channel();
        let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
        let p2 = pin.clone();
        let t = std::thread::spawn(move || {
            let before = mine();
            let pinned = p2.pin().expect("pinned");
            let during = mine();
            tx.send(pinned).unwrap();
            back_rx.recv().unwrap();
            (before, during, mine())
        });
        let pinned = rx.recv().unwrap();
        pin.unpin(pinned);
        back_tx.send(()).unwrap();
        let (before, during, after) = t.join().unwrap();
        assert_eq!(before, own);
        assert_eq!(during, vec![last as usize]);
        assert_eq!(after, own);
    }

    #[test]
    fn unpin_restores_the_old_set() {
        let own = mine();
        let first = *own.first().unwrap() as u16;
        let pin = Pin::new(Some((first, first)));
        let p = pin.pin().expect("pinned");
        assert_eq!(mine(), vec![first as usize]);
        pin.unpin(p);
        assert_eq!(mine(), own);
    }

    #[test]
    fn a_cpu_outside_the_set_is_refused_once_and_left_alone() {
        let own = mine();
        let pin = Pin::new(Some((MAX_CPU, MAX_CPU)));
        if own.contains(&(MAX_CPU as usize)) {
            return;
        }
        assert!(pin.pin().is_none());
        assert!(!pin.active());
        assert!(pin.pin().is_none());
        assert_eq!(mine(), own);
    }
}
