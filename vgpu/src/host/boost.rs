//! The host priority of the thread that holds the GPU (`--gpu host=...,nice=N`, issue 25).
//!
//! While a VM holds a grant of a shared GPU, its worker thread *is* that GPU for everybody: on
//! sim it runs the interpreter, and whether it stops at the slice end the daemon told it depends
//! on it being on a core. With many VMs per host, the VM's own vCPU (woken by the completion
//! interrupt the worker just raised) or other VMs' threads can take its core, and a thread
//! waiting in a run queue stops late: measured with 64 VMs on 16 cores, 1-25 ms preemption
//! tails while the host was 75% idle. And a worker that wakes late for its grant starts late,
//! which the daemon counts the same way. So the worker raises itself to `nice` when it starts
//! to wait for a grant (asleep, or polling for the few hundred microseconds of a standby) and
//! goes back to its own level when the grant ends or the wait is given up (one `setpriority`
//! each way, a few microseconds per grant); the rest of the time — the guest's CPU work between
//! jobs, doorbell polling — it runs as any other thread, so a guest cannot use the priority
//! beyond the slices the daemon gives it.
//!
//! Raising a priority needs `CAP_SYS_NICE` (or `RLIMIT_NICE`): where it is refused the link
//! says so once and runs on unraised.
//!
//! A nice value bounds nothing: under EEVDF a raised thread that has run past its weighted
//! share waits behind whole slices of nice-0 threads, and a running thread displaced from its
//! core is picked again only at the next tick or wake-up there (4 ms at `HZ=250`). Measured on
//! the 2-core dev box with 8 VMs and other builds running: stops 1-16 ms late, each with an
//! involuntary switch of the worker and a fraction of the wall time on a CPU (the worker logs
//! such stops, `worker::job`). So `rt=N` (off by default) makes the thread `SCHED_FIFO` at
//! priority N instead, for the same span: a runnable real-time thread takes its core from any
//! fair thread at once. The span stays bounded by the daemon: the engine stops by itself at the
//! slice end, and a VM that does not is revoked. A real-time thread does not poll for a
//! standby (`HostLink::acquire`): a poller that only yields to its own priority would hold
//! its core. Where real-time is refused (no `CAP_SYS_NICE`, or a cgroup without real-time
//! runtime, as in most containers) the link says so once and uses `nice`.
//!
//! `slice_us=N` (off by default) also gives the raised thread a short slice of the fair
//! scheduler (Linux 6.12+: EEVDF's custom slice, `sched_attr.sched_runtime`; the default is
//! 0.75 ms × (1 + log2 CPUs), 3 ms on 16 cores). EEVDF picks the eligible thread of earliest
//! virtual deadline, a thread's deadline is its slice (weighted) after its eligible time, and a
//! waking thread preempts the running one only with an earlier deadline: with a slice of
//! 100 µs the worker's deadline comes before those of the nice-0 threads around it, so they
//! neither displace it from its core nor run ahead of it when it waits in a run queue. No
//! privilege is needed (it raises no priority: the thread's share stays its weight's), so it
//! also applies where `nice` is refused. It ends with the raise (`lower`); the link's reader
//! thread, raised for its life, keeps it for its life. A kernel before 6.12 takes the call and
//! keeps no slice: the first raise reads it back and, finding none, says so once.
//!
//! Either way the thread is raised with `SCHED_RESET_ON_FORK`: a thread it starts while
//! raised (a `ptx-helper-*` of the sim engine's pool, the `pgpu-wait-timer`, started on first
//! use from whichever thread runs a job) is a fair-class thread at nice 0, not one that
//! inherits the raise for life (sched(7)).

use std::sync::atomic::{AtomicBool, Ordering};

/// The default of `nice=`.
pub const NICE_DEFAULT: i32 = -10;
/// The default of `slice_us=` (0: the kernel's slice).
pub const SLICE_US_DEFAULT: u32 = 0;

/// A thread raised by [`Boost::raise`], and the level it goes back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raised {
    tid: libc::pid_t,
    old: i32,
    /// Raised to `SCHED_FIFO` (else to a nice value).
    rt: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Boost {
    /// The nice value of the thread holding a grant; 0: no change.
    nice: i32,
    /// The `SCHED_FIFO` priority of the thread holding a grant; 0: not real-time.
    rt: u8,
    /// Refused once: not asked again (and said once).
    refused: AtomicBool,
    /// Real-time refused once: `nice` from then on (said once).
    rt_refused: AtomicBool,
    /// The fair-scheduler slice of a raised thread, ns (0: the kernel's).
    slice_ns: u64,
    /// The slice refused once (an older kernel): not asked again (said once).
    slice_refused: AtomicBool,
    /// The slice was read back once (a kernel before 6.12 takes `sched_runtime` and ignores
    /// it for fair threads).
    slice_checked: AtomicBool,
    /// Clearing `SCHED_RESET_ON_FORK` at `lower` was refused once (no `CAP_SYS_NICE`): not
    /// tried again.
    reset_refused: AtomicBool,
}

/// The calling thread's id.
fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// The nice value of thread `tid`.
fn nice_of(tid: libc::pid_t) -> std::io::Result<i32> {
    // getpriority may return -1 as a value: errno tells.
    // SAFETY: __errno_location returns this thread's errno, which we may write.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: plain system call on a thread id of this process.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    let err = std::io::Error::last_os_error();
    if n == -1 && err.raw_os_error().is_some_and(|e| e != 0) {
        return Err(err);
    }
    Ok(n)
}

/// Sets thread `tid`'s nice value.
fn set_nice(tid: libc::pid_t, nice: i32) -> std::io::Result<()> {
    // SAFETY: plain system call on a thread id of this process.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `struct sched_attr` of sched_setattr(2), its first version (`SCHED_ATTR_SIZE_VER1`).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// `SCHED_FLAG_RESET_ON_FORK` of `sched_attr.sched_flags`.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// Makes thread `tid` a fair-class thread at `nice` with a slice of `slice_ns` (EEVDF's custom
/// slice; the kernel clamps it to 0.1-100 ms) and `SCHED_RESET_ON_FORK`.
fn set_slice(tid: libc::pid_t, nice: i32, slice_ns: u64) -> std::io::Result<()> {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: SCHED_FLAG_RESET_ON_FORK,
        nice,
        runtime: slice_ns,
        ..SchedAttr::default()
    };
    // SAFETY: sched_setattr on a thread id of this process with a live, fully initialised
    // attribute of the size it states; flags 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            &attr as *const SchedAttr,
            0u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Thread `tid`'s fair-scheduler slice in ns: its custom slice, 0 where it has none or the
/// kernel keeps none (before Linux 6.12).
fn slice_of(tid: libc::pid_t) -> std::io::Result<u64> {
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr on a thread id of this process into a live attribute of the size
    // passed; flags 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as u32,
            0u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr.runtime)
}

/// Sets thread `tid`'s scheduling policy (`SCHED_FIFO` at `prio`, or `SCHED_OTHER` with 0).
fn set_policy(tid: libc::pid_t, policy: libc::c_int, prio: i32) -> std::io::Result<()> {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: plain system call on a thread id of this process, with a live sched_param.
    if unsafe { libc::sched_setscheduler(tid, policy, &p) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Boost {
    pub fn new(nice: i32, rt: u8) -> Self {
        Boost {
            nice,
            rt,
            refused: AtomicBool::new(false),
            rt_refused: AtomicBool::new(false),
            slice_ns: 0,
            slice_refused: AtomicBool::new(false),
            slice_checked: AtomicBool::new(false),
            reset_refused: AtomicBool::new(false),
        }
    }

    /// With `slice_us=`: a raised thread's fair-scheduler slice (0: the kernel's).
    pub fn with_slice_us(mut self, us: u32) -> Self {
        self.slice_ns = u64::from(us) * 1000;
        self
    }

    /// Whether raised threads run real-time (configured and not refused so far).
    pub fn realtime(&self) -> bool {
        self.rt > 0 && !self.rt_refused.load(Ordering::Relaxed)
    }

    /// Raises the calling thread to the configured level. `None`: nothing changed (off, the
    /// thread already at or above it, or refused).
    pub fn raise(&self) -> Option<Raised> {
        let tid = gettid();
        if self.realtime() {
            // Reset on fork: threads this one starts while raised (an engine's helper or timer
            // threads, started on first use) are fair-class threads, not real-time for life.
            let policy = libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK;
            match set_policy(tid, policy, i32::from(self.rt)) {
                Ok(()) => {
                    return Some(Raised {
                        tid,
                        old: 0,
                        rt: true,
                    });
                }
                Err(e) => {
                    if !self.rt_refused.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "vgpu: cannot make the GPU worker real-time (SCHED_FIFO {}) while it \
                             holds the GPU ({e}; needs CAP_SYS_NICE and real-time runtime in its \
                             cgroup): it uses nice {} instead",
                            self.rt,
                            self.nice
                        );
                    }
                }
            }
        }
        let slice = self.slice_ns > 0 && !self.slice_refused.load(Ordering::Relaxed);
        if (self.nice == 0 || self.refused.load(Ordering::Relaxed)) && !slice {
            return None;
        }
        let old = nice_of(tid).ok()?;
        let mut now = old;
        if self.nice != 0 && !self.refused.load(Ordering::Relaxed) && old > self.nice {
            match set_nice(tid, self.nice) {
                Ok(()) => {
                    now = self.nice;
                    // Threads this one starts while raised start at nice 0, not at the raised
                    // level for life (sched(7): a negative nice is reset in children; the
                    // fair class and the nice value just set are kept).
                    let reset = libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK;
                    if let Err(e) = set_policy(tid, reset, 0) {
                        log::debug!("vgpu: SCHED_RESET_ON_FORK on thread {tid}: {e}");
                    }
                }
                Err(e) => {
                    if !self.refused.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "vgpu: cannot raise the GPU worker to nice {} while it holds the \
                             GPU ({e}; needs CAP_SYS_NICE): it runs at nice {old}, and may \
                             stop late at slice ends on a busy host (--gpu nice=0 silences \
                             this)",
                            self.nice
                        );
                    }
                }
            }
        }
        let mut sliced = false;
        if slice {
            // Last: a policy change without a slice resets it to the kernel's.
            let set = set_slice(tid, now, self.slice_ns).and_then(|()| {
                if self.slice_checked.swap(true, Ordering::Relaxed) {
                    return Ok(());
                }
                // The kernel clamps it to 0.1-100 ms; one that keeps no custom slice reads 0.
                match slice_of(tid)? {
                    0 => Err(std::io::Error::other("the kernel keeps no custom slice")),
                    _ => Ok(()),
                }
            });
            match set {
                Ok(()) => sliced = true,
                Err(e) => {
                    if !self.slice_refused.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "vgpu: cannot give the GPU worker a {} µs slice while it holds the \
                             GPU ({e}; needs Linux 6.12): it runs with the kernel's",
                            self.slice_ns / 1000
                        );
                    }
                }
            }
        }
        (now != old || sliced).then_some(Raised {
            tid,
            old,
            rt: false,
        })
    }

    /// Puts a raised thread back to its own level (from any thread of the process), without
    /// the reset-on-fork flag (`SCHED_OTHER` without it clears it).
    pub fn lower(&self, r: Raised) {
        if r.rt {
            // Back to the fair class, at the nice value it kept meanwhile.
            if let Err(e) = set_policy(r.tid, libc::SCHED_OTHER, 0) {
                log::debug!("vgpu: thread {} back to SCHED_OTHER: {e}", r.tid);
            }
            return;
        }
        if let Err(e) = set_nice(r.tid, r.old) {
            log::debug!("vgpu: nice of thread {} back to {}: {e}", r.tid, r.old);
        }
        // The kernel's slice again (a policy change without a slice would do it too, but the
        // one below may be refused).
        if self.slice_ns > 0
            && let Err(e) = set_slice(r.tid, r.old, 0)
        {
            log::debug!("vgpu: slice of thread {} back to the kernel's: {e}", r.tid);
        }
        // Clearing the reset-on-fork flag needs CAP_SYS_NICE (sched(7)); where refused, the
        // thread's children start at nice 0 rather than at its own negative level, if any
        // (not tried again).
        if !self.reset_refused.load(Ordering::Relaxed)
            && let Err(e) = set_policy(r.tid, libc::SCHED_OTHER, 0)
        {
            self.reset_refused.store(true, Ordering::Relaxed);
            log::debug!("vgpu: thread {} without SCHED_RESET_ON_FORK: {e}", r.tid);
        }
    }

    /// Whether raising was refused (and is no longer tried).
    #[cfg(test)]
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The calling thread's nice value (tests, diagnostics).
pub fn current_nice() -> std::io::Result<i32> {
    nice_of(gettid())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raise then lower on a thread of its own (the test harness's threads are shared):
    /// where the host permits it the level is the configured one and comes back; where not,
    /// nothing changes and the refusal is remembered.
    #[test]
    fn raise_sets_the_level_and_lower_restores_it() {
        std::thread::spawn(|| {
            let before = current_nice().unwrap();
            let b = Boost::new(-5, 0);
            match b.raise() {
                Some(r) => {
                    assert_eq!(current_nice().unwrap(), -5);
                    // Already raised: nothing more to do.
                    assert_eq!(b.raise(), None);
                    b.lower(r);
                    assert_eq!(current_nice().unwrap(), before);
                }
                None => {
                    assert!(b.refused() || before <= -5);
                    assert_eq!(current_nice().unwrap(), before);
                }
            }
            // Off: never touches the thread.
            assert_eq!(Boost::new(0, 0).raise(), None);
        })
        .join()
        .unwrap();
    }

    /// With `slice_us=`, a raised thread has that slice (where the kernel takes custom slices:
    /// Linux 6.12+, no privilege needed), and the kernel's again once lowered; without, the
    /// slice is never touched.
    #[test]
    fn a_raised_thread_has_the_configured_slice_until_lowered() {
        std::thread::spawn(|| {
            let tid = gettid();
            let before = slice_of(tid).unwrap();
            let b = Boost::new(0, 0).with_slice_us(200);
            match b.raise() {
                Some(r) => {
                    assert_eq!(slice_of(tid).unwrap(), 200_000);
                    b.lower(r);
                    assert_eq!(slice_of(tid).unwrap(), before);
                }
                None => assert!(b.slice_refused.load(Ordering::Relaxed)),
            }
            assert_eq!(Boost::new(0, 0).raise(), None);
            assert_eq!(slice_of(tid).unwrap(), before);
        })
        .join()
        .unwrap();
    }

    /// The calling thread's scheduling policy and whether it has `SCHED_RESET_ON_FORK`.
    fn policy_and_reset() -> (libc::c_int, bool) {
        // SAFETY: plain system call on the calling thread.
        let p = unsafe { libc::sched_getscheduler(0) };
        (
            p & !libc::SCHED_RESET_ON_FORK,
            p & libc::SCHED_RESET_ON_FORK != 0,
        )
    }

    /// The calling thread's scheduling policy.
    fn policy() -> libc::c_int {
        policy_and_reset().0
    }

    /// `rt=`: real-time while raised and back to the fair class at the same nice value after;
    /// where the host refuses real-time, the nice value is used instead and the refusal is
    /// remembered.
    #[test]
    fn realtime_raise_and_lower_or_fall_back_to_nice() {
        std::thread::spawn(|| {
            let before = current_nice().unwrap();
            let b = Boost::new(-5, 1);
            assert!(b.realtime());
            let r = b.raise();
            if policy() == libc::SCHED_FIFO {
                assert!(r.is_some_and(|r| r.rt));
                assert_eq!(current_nice().unwrap(), before);
                b.lower(r.unwrap());
                assert_eq!(policy(), libc::SCHED_OTHER);
                assert_eq!(current_nice().unwrap(), before);
            } else {
                // Refused: the nice path ran (or was refused too), never real-time again.
                assert!(!b.realtime());
                assert_eq!(policy(), libc::SCHED_OTHER);
                if let Some(r) = r {
                    assert!(!r.rt);
                    assert_eq!(current_nice().unwrap(), -5);
                    b.lower(r);
                }
                assert_eq!(current_nice().unwrap(), before);
            }
        })
        .join()
        .unwrap();
    }

    /// A thread started by a raised thread does not inherit the raise (`SCHED_RESET_ON_FORK`):
    /// fair class, nice 0 or more; for the real-time path and the nice path.
    #[test]
    fn threads_started_while_raised_do_not_inherit_it() {
        for rt in [1u8, 0] {
            std::thread::spawn(move || {
                let b = Boost::new(-5, rt);
                let Some(r) = b.raise() else {
                    eprintln!("skipped (rt={rt}): raising is not permitted on this host");
                    return;
                };
                assert!(r.rt || current_nice().unwrap() == -5);
                assert!(
                    policy_and_reset().1,
                    "rt={rt}: raised with SCHED_RESET_ON_FORK"
                );
                let (pol, nice) = std::thread::spawn(|| (policy(), current_nice().unwrap()))
                    .join()
                    .unwrap();
                assert_eq!(pol, libc::SCHED_OTHER, "rt={rt}: the child is fair-class");
                assert!(
                    nice >= 0,
                    "rt={rt}: the child's nice {nice} is not the raise"
                );
                b.lower(r);
                assert_eq!(policy(), libc::SCHED_OTHER);
            })
            .join()
            .unwrap();
        }
    }
}
