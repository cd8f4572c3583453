//! The VM side of GPU sharing (`--gpu host=SOCKET`): registers with `vgpud`, receives the VRAM
//! memory object of which this VM maps only its partition, and gates every engine job on a
//! grant. A reader thread takes the daemon's messages: a grant wakes the GPU worker; a preempt
//! stops the running job through its `PreemptHandle` (the worker then keeps the saved context
//! and resumes it at the next grant). Protocol: `vgpu_proto::proto`, docs/architecture.md.
//!
//! When the daemon goes away (its connection ends: killed, crashed), the link waits for it to
//! come back on the same socket (`reconnect`) for `reconnect_ms`: the running job is preempted
//! (its context kept) and every job waits for a grant of the new instance, to which the link
//! re-registers claiming the partition it holds; nothing is reported to the guest unless the
//! wait runs out (then `GPU_LOST`, as a lost daemon always was).
//!
//! Several GPUs per daemon: the `Welcome` names the GPU the VM was placed on; a move to another
//! GPU of the daemon (`moving`) changes the partition a re-registration claims
//! (`HostLink::set_partition`: the GPU index, offset and memory object).
//!
//! Protocol version 4: the daemon sends a grant word (`kept`) through which it takes back a
//! grant not taken yet, or a turn's grant kept between two jobs, without this process running;
//! a version-3 daemon is registered with as version 3 (`older_daemon`).

// The host priority of the thread holding a grant (issue 25).
mod boost;
mod pin;
// Where and at which priority the link's threads run: raising and pinning around grants.
mod placement;
// Wakes the worker waiting for a grant (a pause, the device's end).
mod wake;
// The grant word (version 4): a kept grant the daemon takes back without this process.
mod kept;
// multigpu: the link's side of moving to another GPU of the daemon.
mod moving;
// The daemon's messages: the reader thread and what a message does to the link's state.
mod reader;
mod reconnect;
// Registering with the daemon (the first connection, protocol fallback to version 3).
mod register;

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pgpu::PreemptHandle;
use vgpu_proto::proto::{self, RunOutcome, ToDaemon, ToVm};
use vgpu_proto::wire::{Conn, Received};

pub use boost::{NICE_DEFAULT, SLICE_US_DEFAULT, current_nice};
pub use moving::MoveGrant;
pub use pin::{parse as parse_cpus, print as print_cpus};
use register::{hello, older_daemon};

/// `host=...,weight=,priority=,name=,reconnect_ms=,gpu=,nice=` of `--gpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub socket: PathBuf,
    pub weight: u32,
    pub priority: u8,
    pub name: String,
    /// How long to wait for a daemon that went away to come back on the socket (zero: the GPU
    /// is lost at once).
    pub reconnect: Duration,
    /// `gpu=N`: pinned to the daemon's GPU N; `None`: placed by the daemon (multigpu).
    pub gpu: Option<u32>,
    /// `nice=N`: the worker thread runs at this nice value while it holds a grant (`boost`;
    /// 0: unchanged).
    pub nice: i32,
    /// `rt=N`: the worker thread runs `SCHED_FIFO` at priority N instead (0: off; `boost`).
    pub rt: u8,
    /// `slice_us=N`: the worker thread's fair-scheduler slice while it holds a grant (0: the
    /// kernel's; `boost`).
    pub slice_us: u32,
    /// `cpus=N[-M]`: the worker thread runs on these CPUs while it waits for or holds a grant
    /// (`pin`; `None`: where it is).
    pub cpus: Option<(u16, u16)>,
}

impl HostConfig {
    /// A link to the daemon at `socket` as VM `name` with weight 1 in class 0, no wait for a
    /// daemon that went away, and the worker thread's scheduling left alone (no `nice`, `rt`
    /// or `slice_us`): what tests and tools start from.
    pub fn plain(socket: std::path::PathBuf, name: &str) -> Self {
        HostConfig {
            socket,
            weight: 1,
            priority: 0,
            name: name.into(),
            reconnect: Duration::ZERO,
            gpu: None,
            nice: 0,
            rt: 0,
            slice_us: 0,
            cpus: None,
        }
    }
}

/// The default of `reconnect_ms`.
pub const RECONNECT_DEFAULT: Duration = Duration::from_secs(10);

/// Errors of the daemon link.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("connect to vgpud at {path:?}: {err}")]
    Connect {
        path: PathBuf,
        err: vgpu_proto::wire::WireError,
    },
    #[error("vgpud refused the VM: {0}")]
    Refused(String),
    #[error("vgpud protocol: {0}")]
    Protocol(String),
    #[error("the GPU was taken away: {0}")]
    Lost(String),
    /// `acquire_unless`'s `stop` held before a grant came (a pause).
    #[error("stopped while waiting for a grant")]
    Interrupted,
}

/// How often a worker waiting for a grant looks at `acquire_unless`'s `stop` while the daemon
/// is away.
const STOP_POLL: Duration = Duration::from_millis(5);
/// How long a worker waiting for a grant sleeps at most before it looks at `acquire_unless`'s
/// `stop`: whoever sets what `stop` reads wakes it through [`HostLink::interrupt`], so this only
/// bounds a wake-up that was missed. Not shorter: 64 waiting workers looking every 5 ms woke
/// 12 800 times a second, on the GPU's CPU with `cpus=` (`pin`).
const STOP_SAFETY: Duration = Duration::from_millis(250);

/// What registration gave.
pub struct Welcome {
    pub vm: u32,
    /// The GPU the daemon placed the VM on (its index and CUDA device ordinal).
    pub gpu: proto::Placement,
    pub vram_offset: u64,
    pub vram_size: u64,
    pub vram_fd: OwnedFd,
    /// The daemon instance (version 3 daemons).
    pub boot: Option<String>,
}

/// A grant being used by the worker, of the connection `epoch` (a grant of a daemon instance that
/// went away is not reported to the next one).
#[derive(Debug)]
pub struct Ticket {
    seq: u64,
    epoch: u64,
}

/// The daemon went away: since when, and how it showed.
struct Down {
    since: Instant,
    why: String,
}

struct St {
    /// The connection to the daemon, and its generation (one more at each re-registration).
    conn: Arc<Conn>,
    epoch: u64,
    /// The daemon instance and our id there (the claim of a re-registration).
    boot: Option<String>,
    vm: u32,
    /// The daemon went away and the link waits for it to come back.
    down: Option<Down>,
    partition: Partition,
    /// A Want is outstanding (sent, no grant yet).
    wanting: bool,
    /// The outstanding Want carries the job's identity (a `Done`'s `more` does not: the
    /// worker's next `acquire` sends it).
    identified: bool,
    /// A grant received and not yet taken by the worker.
    grant: Option<Granted>,
    /// The grant the worker runs under, and the handle that stops its job.
    active: Option<(u64, PreemptHandle)>,
    /// The active grant is a turn (time-sliced): jobs may follow each other under it.
    turn: bool,
    /// Between two jobs of a turn: the worker keeps the active grant for its next job.
    held: bool,
    lost: Option<String>,
    /// The worker reads the socket itself (waiting for a grant); the reader thread keeps off.
    worker_reading: bool,
    /// A `Standby` came: poll for the grant instead of sleeping until this instant.
    standby_until: Option<Instant>,
    /// multigpu: the daemon's answer to a move request, not yet taken.
    move_answer: Option<moving::MoveAnswer>,
    /// The last grant was handed back unused because its slice had ended before the worker
    /// took it: the next one runs whatever its deadline (a VM always late still progresses).
    returned_late: bool,
    /// The worker thread, raised to the GPU's priority while it waits for a grant or holds
    /// one (`boost`).
    boosted: Option<boost::Raised>,
    /// The worker moved onto `cpus=` while it waits for or holds a grant.
    pinned: Option<pin::Pinned>,
    /// The reader thread moved onto `cpus=` while the VM holds a grant.
    reader_pinned: Option<pin::Pinned>,
    /// Version 4: the grant word of the current connection (`kept`), once the daemon sent it.
    word: Option<vgpu_proto::word::GrantWord>,
    /// The protocol version of the registration: this build's, or 3 with a daemon that
    /// refused it (no grant word); a re-registration asks the same (`older_daemon`).
    version: u32,
}

/// A grant as received.
#[derive(Debug, Clone, Copy)]
struct Granted {
    seq: u64,
    /// A preempt for it came before the worker took it.
    preempted: bool,
    /// A time-sliced grant: jobs may follow each other under it.
    turn: bool,
    /// Stop by ourselves at this `CLOCK_MONOTONIC` instant (0: none).
    deadline_ns: u64,
}

/// The `Instant` of a `CLOCK_MONOTONIC` time in nanoseconds (both are that clock on Linux).
fn instant_of(mono_ns: u64) -> Instant {
    let now_ns = proto::monotonic_ns();
    let now = Instant::now();
    if mono_ns >= now_ns {
        now + Duration::from_nanos(mono_ns - now_ns)
    } else {
        now.checked_sub(Duration::from_nanos(now_ns - mono_ns))
            .unwrap_or(now)
    }
}

/// What a re-registration claims besides the partition (fixed at the first registration).
struct Claim {
    cfg: HostConfig,
    vram: u64,
    channels: u32,
}

/// The partition the VM holds, as a re-registration claims it (changed by a move to another
/// GPU: `HostLink::set_partition`).
#[derive(Clone)]
struct Partition {
    /// The daemon's GPU index.
    gpu: u32,
    offset: u64,
    /// The VRAM memory object (sim: where the partition's pages live; the daemon adopts it).
    fd: Arc<OwnedFd>,
}

struct Inner {
    st: Mutex<St>,
    cv: Condvar,
    claim: Claim,
    boost: boost::Boost,
    pin: pin::Pin,
    /// The reader thread's id (0 until it runs), for `pin`.
    reader_tid: std::sync::atomic::AtomicI32,
    /// Wakes a worker waiting for a grant to look at its `stop` and at `lost`
    /// ([`HostLink::interrupt`], [`HostLink::close`]).
    wake: wake::Wake,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends on the current connection; nothing while the daemon is away (the messages of a
    /// connection mean nothing to the next instance).
    fn send(&self, st: &mut St, msg: &ToDaemon) {
        if st.down.is_some() || st.lost.is_some() {
            return;
        }
        if let Err(e) = st.conn.send(&proto::encode(msg), None) {
            self.disconnected(st, format!("send to vgpud: {e}"));
        }
    }

    /// Hands grant `seq` back unused (no job ran in it) and wants the next one.
    fn hand_back(&self, st: &mut St, seq: u64) {
        self.end_unused(st, seq, RunOutcome::Completed);
    }

    /// Ends grant `seq` with no job running in it (`outcome`, no stamps) and wants the next
    /// one: the VM has work queued.
    fn end_unused(&self, st: &mut St, seq: u64, outcome: RunOutcome) {
        st.wanting = true;
        st.identified = false;
        let done = ToDaemon::Done {
            seq,
            outcome,
            gpu_ns: 0,
            start_ns: 0,
            end_ns: 0,
            more: true,
        };
        self.send(st, &done);
    }

    /// Gives back a turn's grant kept between two jobs (`held`) whose stop is due: `Done`
    /// preempted, no run in it, more work queued. The reader thread does at a preempt for it
    /// (the daemon's own, or its backstop 1 ms after a slice end the VM was told), the worker's
    /// next `acquire` at a slice end it finds passed, whichever comes first. The worker, busy
    /// with the guest's work up to its next job (or waiting for a core), must not keep the GPU
    /// idle from the VMs waiting until it comes back: on the 16-core host with 64 VMs that took
    /// 12.8 ms (issue 25). Its next `acquire` waits for a new grant. False when no grant is
    /// kept.
    fn give_up_kept(&self, st: &mut St) -> bool {
        if !st.held {
            return false;
        }
        let Some((seq, _)) = st.active.take() else {
            return false;
        };
        st.held = false;
        if self.let_go(st, seq) {
            self.end_unused(st, seq, RunOutcome::Preempted);
        } else {
            // The daemon took it back through the word: it counts the grant as ended, the VM
            // as queued (`kept`).
            st.wanting = true;
            st.identified = false;
        }
        // The grant is over: its worker (doing the guest's work) back to its own level and
        // CPUs, off the next holder's (`cpus=`).
        self.lower(st);
        true
    }
}

/// See the module documentation.
pub struct HostLink {
    inner: Arc<Inner>,
    reader: Option<JoinHandle<()>>,
}

impl HostLink {
    /// Blocks until the daemon grants the GPU (or returns the grant of the current turn, kept
    /// by `release`). From then until the grant ends, a preempt for it calls
    /// `handle.request()` (the handle is cleared at a new grant, not within a turn). `kernel`:
    /// the job's identity (`vgpu_proto::kernel::KernelKey`), sent with the Want.
    pub fn acquire(
        &self,
        handle: &PreemptHandle,
        kernel: Option<u64>,
    ) -> Result<Ticket, HostError> {
        self.acquire_inner(handle, kernel, None)
    }

    /// As [`HostLink::acquire`], but returns `Interrupted` once `stop()` holds while no grant
    /// is there (checked when [`HostLink::interrupt`] wakes the waiting worker, and at the
    /// latest every 250 ms): a pause does not wait for a grant. The Want stays outstanding;
    /// [`HostLink::idle`] withdraws it (or hands back a grant that crossed it).
    pub fn acquire_unless(
        &self,
        handle: &PreemptHandle,
        kernel: Option<u64>,
        stop: &dyn Fn() -> bool,
    ) -> Result<Ticket, HostError> {
        self.acquire_inner(handle, kernel, Some(stop))
    }

    /// Wakes a worker waiting for a grant in [`HostLink::acquire_unless`] to look at its
    /// `stop` now (call after making it hold: a pause).
    pub fn interrupt(&self) {
        self.inner.wake.wake();
    }

    fn acquire_inner(
        &self,
        handle: &PreemptHandle,
        kernel: Option<u64>,
        stop: Option<&dyn Fn() -> bool>,
    ) -> Result<Ticket, HostError> {
        let mut st = self.inner.lock();
        loop {
            // Waiting for a grant, or holding one: this thread is (about to be) the GPU. Raised
            // while it waits too, so that it runs as soon as the grant comes (it sleeps
            // meanwhile, or polls for the few hundred microseconds of a standby). With
            // `cpus=` it waits on the GPU's CPUs instead, at its own level (the holder there
            // is raised), and is raised when the grant comes.
            if self.inner.pin.active() {
                self.inner.pin(&mut st);
            } else {
                self.inner.raise(&mut st);
            }
            if let Some(why) = &st.lost {
                let e = HostError::Lost(why.clone());
                self.inner.stop_reading(&mut st);
                self.inner.lower(&mut st);
                return Err(e);
            }
            if st.down.is_some() {
                // The daemon went away: wait for the link to re-register (or give up).
                self.inner.stop_reading(&mut st);
                if stop.is_some_and(|f| f()) {
                    self.inner.lower(&mut st);
                    return Err(HostError::Interrupted);
                }
                st = self
                    .inner
                    .cv
                    .wait_timeout(st, STOP_POLL)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            if st.held
                && let Some((_, h)) = &st.active
                && h.deadline().is_some_and(|d| Instant::now() >= d)
            {
                // The slice ended while the grant was kept between two jobs (the worker was
                // busy or descheduled getting to the next one) and no preempt made the reader
                // thread give it back yet: give it back now, as `release` does at a slice end, and
                // wait for the next grant. Starting the job would keep the GPU from the VMs
                // waiting until its first preemption point (issue 25).
                self.inner.give_up_kept(&mut st);
                continue;
            }
            if st.held
                && let Some((seq, _)) = &st.active
            {
                let seq = *seq;
                if !self.inner.resume_kept(&mut st, seq) {
                    // The daemon took the kept grant back (`kept`): want a new one.
                    continue;
                }
                st.held = false;
                self.inner.stop_reading(&mut st);
                self.inner.take_gpu(&mut st);
                return Ok(Ticket {
                    seq,
                    epoch: st.epoch,
                });
            }
            if let Some(g) = st.grant.take() {
                if g.deadline_ns != 0
                    && !g.preempted
                    && !st.returned_late
                    && proto::monotonic_ns() >= g.deadline_ns
                {
                    // The worker took the grant after its slice had ended (woken late): a job
                    // started now would hold the GPU from the VMs waiting until its first
                    // check, and the daemon would count the whole wait as preemption latency
                    // (issue 25). Hand it back unused and want the next one — which runs
                    // whatever its deadline, so a VM that is always late still progresses.
                    log::debug!(
                        "vgpu: grant {} taken after its slice end: handed back",
                        g.seq
                    );
                    st.returned_late = true;
                    if self.inner.let_go_granted(&st, g.seq) {
                        self.inner.hand_back(&mut st, g.seq);
                    } else {
                        // The daemon took it back through the word meanwhile (`kept`).
                        self.inner.revoked_unstarted(&mut st);
                    }
                    continue;
                }
                if !self.inner.take_granted(&mut st, g.seq) {
                    // The daemon took it back before the worker came (`kept`): ask again.
                    continue;
                }
                st.returned_late = false;
                handle.clear();
                // Others wait: the engine stops by itself at the slice end.
                handle.set_deadline((g.deadline_ns != 0).then(|| instant_of(g.deadline_ns)));
                if g.preempted {
                    handle.request();
                }
                st.active = Some((g.seq, handle.clone()));
                st.turn = g.turn;
                log::debug!("vgpu: grant {} taken at {}", g.seq, proto::monotonic_ns());
                self.inner.stop_reading(&mut st);
                self.inner.take_gpu(&mut st);
                return Ok(Ticket {
                    seq: g.seq,
                    epoch: st.epoch,
                });
            }
            if !st.wanting || (!st.identified && kernel.is_some()) {
                // A new Want, or the identity of the job a `Done`'s `more` announced.
                st.wanting = true;
                st.identified = true;
                self.inner.send(&mut st, &ToDaemon::Want { kernel });
                continue;
            }
            if stop.is_some_and(|f| f()) {
                self.inner.stop_reading(&mut st);
                self.inner.lower(&mut st);
                return Err(HostError::Interrupted);
            }
            // Read the socket ourselves until the grant comes (no thread hand-off on the grant
            // path; the reader thread keeps off meanwhile); after a standby hint, poll instead
            // of sleeping.
            st.worker_reading = true;
            // A real-time worker sleeps through a standby: polling, it would hold its core
            // from every fair thread (it wakes at once anyway).
            // So does one waiting on the GPU's CPUs (`cpus=`): it would take them from the holder.
            let spin_until = st
                .standby_until
                .take()
                .filter(|_| !self.inner.boost.realtime() && !self.inner.pin.active());
            // Off the priority of a grant it no longer holds (a kept grant taken back), and
            // its reader off the GPU's CPUs.
            if self.inner.pin.active() {
                self.inner.lower_priority(&mut st);
                self.inner.unpin_reader(&mut st);
            }
            let (conn, epoch) = (st.conn.clone(), st.epoch);
            drop(st);
            let ready = match spin_until {
                Some(t) => {
                    conn.spin_readable(t, vgpu_proto::wire::polite_spin());
                    Ok(())
                }
                None if stop.is_some() => conn
                    .wait_readable_or(self.inner.wake.as_fd(), Some(STOP_SAFETY))
                    .map(|_| self.inner.wake.drain()),
                None => conn.wait_readable_for(None).map(|_| ()),
            };
            st = self.inner.lock();
            if st.epoch != epoch {
                continue;
            }
            match ready {
                Ok(()) => self.inner.receive(&mut st),
                Err(e) => self.inner.disconnected(&mut st, format!("poll vgpud: {e}")),
            }
        }
    }

    /// Reports the end of a job: how it ended, its GPU time and `CLOCK_MONOTONIC` stamps, and
    /// whether another job is ready (`more`). Within a turn, a completed job with more work
    /// behind it and no preempt pending keeps the grant (`Progress`; the next `acquire` returns
    /// at once); otherwise the grant ends (`Done`; with `more` the next `acquire` needs no new
    /// Want).
    pub fn release(
        &self,
        t: Ticket,
        outcome: RunOutcome,
        gpu: Duration,
        (start_ns, end_ns): (u64, u64),
        more: bool,
    ) {
        let mut st = self.inner.lock();
        if t.epoch != st.epoch || st.down.is_some() {
            // A grant of an instance that went away (the loss stopped the job): nothing to
            // report; its next run waits for a grant of the next instance.
            self.inner.lower(&mut st);
            return;
        }
        let preempted = st.active.as_ref().is_some_and(|(_, h)| h.is_requested());
        if outcome == RunOutcome::Completed && more && st.turn && !preempted {
            st.held = true;
            let msg = ToDaemon::Progress {
                seq: t.seq,
                gpu_ns: gpu.as_nanos() as u64,
                start_ns,
                end_ns,
            };
            self.inner.send(&mut st, &msg);
            // After the `Progress` (the daemon reads it before it acts on the word): the
            // daemon may take the grant back from here without this process (`kept`).
            self.inner
                .word_store(&st, t.seq, vgpu_proto::word::State::Kept);
            // Kept: the grant, not the priority (the guest's CPU work; `acquire` raises) —
            // unless the thread is on the GPU's CPUs (`cpus=`), which are its VM's while the
            // grant is: there the other VMs' waiting workers would delay its way to the next
            // job, and with it the GPU.
            if st.pinned.is_none() {
                self.inner.lower_priority(&mut st);
            }
            return;
        }
        st.active = None;
        st.held = false;
        st.wanting = more;
        st.identified = false;
        let msg = ToDaemon::Done {
            seq: t.seq,
            outcome,
            gpu_ns: gpu.as_nanos() as u64,
            start_ns,
            end_ns,
            more,
        };
        self.inner.send(&mut st, &msg);
        // After the Done: the next VM's grant does not wait for this thread's move off the
        // GPU's CPUs (`cpus=`) or its priority's drop.
        self.inner.lower(&mut st);
    }

    /// The worker has nothing to run: withdraw a Want (or hand back a grant not yet used).
    pub fn idle(&self) {
        let mut st = self.inner.lock();
        self.idle_inner(&mut st);
        // Back to the guest's work, at the thread's own level and on its own CPUs — after the
        // hand-back, so that the next grant does not wait for the move (`cpus=`).
        self.inner.lower(&mut st);
    }

    fn idle_inner(&self, st: &mut St) {
        if st.held
            && let Some((seq, _)) = st.active.take()
        {
            st.held = false;
            st.wanting = false;
            if self.inner.let_go(st, seq) {
                self.inner.send(st, &reader::empty_done(seq));
            } else {
                // Taken back through the word: the daemon still counts the VM queued.
                self.inner.send(st, &ToDaemon::Idle {});
            }
        } else if let Some(Granted { seq, .. }) = st.grant.take() {
            st.wanting = false;
            // Taken back through the word: the daemon set the VM aside already (`kept`).
            if self.inner.let_go_granted(st, seq) {
                self.inner.send(st, &reader::empty_done(seq));
            }
        } else if st.wanting {
            st.wanting = false;
            self.inner.send(st, &ToDaemon::Idle {});
        }
    }

    /// Ends the link from this side (device shutdown): a worker waiting for a grant returns
    /// `Lost`, a running job is stopped.
    pub fn close(&self) {
        let mut st = self.inner.lock();
        st.lost
            .get_or_insert_with(|| "the device is shutting down".into());
        if let Some((_, h)) = &st.active {
            h.request();
        }
        self.inner.cv.notify_all();
        // A worker waiting for a grant sleeps on the socket and the eventfd: it sees `lost`.
        self.inner.wake.wake();
    }

    /// The VM's partition is now `[offset, offset + size)` of `fd` on the daemon's GPU `gpu`
    /// (a move to another GPU): what a re-registration after a restart claims.
    pub fn set_partition(&self, gpu: u32, offset: u64, fd: OwnedFd) {
        self.inner.lock().partition = Partition {
            gpu,
            offset,
            fd: Arc::new(fd),
        };
    }

    /// Why the link is gone, if it is.
    pub fn lost(&self) -> Option<String> {
        self.inner.lock().lost.clone()
    }
}

impl Drop for HostLink {
    fn drop(&mut self) {
        let conn = {
            let mut st = self.inner.lock();
            if st.lost.is_none() {
                self.inner.send(&mut st, &ToDaemon::Bye {});
            }
            // From here the end of the connection is ours, not the daemon going away.
            st.lost
                .get_or_insert_with(|| "the device is shutting down".into());
            self.inner.cv.notify_all();
            st.conn.clone()
        };
        conn.shutdown();
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod placement_tests;
#[cfg(test)]
mod tests;
