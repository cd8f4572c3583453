//! The VM side of GPU sharing (`--gpu host=SOCKET`): registers with `vgpud`, receives the VRAM
//! memory object of which this VM maps only its partition, and gates every engine job on a
//! grant. A reader thread takes the daemon's messages: a grant wakes the GPU worker; a preempt
//! stops the running job through its `PreemptHandle` (the worker then keeps the saved context
//! and resumes it at the next grant). Protocol: `vgpu_proto::proto`, docs/architecture.md.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pgpu::PreemptHandle;

// multigpu: the link's side of moving to another GPU of the daemon.
mod moving;
pub use moving::MoveGrant;
use vgpu_proto::proto::{self, RunOutcome, ToDaemon, ToVm};
use vgpu_proto::wire::{Conn, Received};

/// `host=...,weight=,priority=,name=` of `--gpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub socket: PathBuf,
    pub weight: u32,
    pub priority: u8,
    pub name: String,
    /// `gpu=N`: pinned to the daemon's GPU N; `None`: placed by the daemon (multigpu).
    pub gpu: Option<u32>,
}

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

/// How often a worker waiting for a grant looks at `acquire_unless`'s `stop`.
const STOP_POLL: Duration = Duration::from_millis(5);

/// What registration gave.
pub struct Welcome {
    pub vm: u32,
    /// The GPU the daemon placed the VM on (its index and CUDA device ordinal).
    pub gpu: proto::Placement,
    pub vram_offset: u64,
    pub vram_size: u64,
    pub vram_fd: OwnedFd,
}

/// A grant being used by the worker.
#[derive(Debug)]
pub struct Ticket {
    seq: u64,
}

#[derive(Default)]
struct St {
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

struct Inner {
    conn: Conn,
    st: Mutex<St>,
    cv: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn send(&self, st: &mut St, msg: &ToDaemon) {
        if let Err(e) = self.conn.send(&proto::encode(msg), None) {
            st.lost.get_or_insert(format!("send to vgpud: {e}"));
            self.cv.notify_all();
        }
    }
}

/// See the module documentation.
pub struct HostLink {
    inner: Arc<Inner>,
    reader: Option<JoinHandle<()>>,
}

impl HostLink {
    /// Registers with the daemon; `vram` is the partition size asked for.
    pub fn connect(
        cfg: &HostConfig,
        vram: u64,
        channels: u32,
    ) -> Result<(Self, Welcome), HostError> {
        let conn = Conn::connect(&cfg.socket).map_err(|err| HostError::Connect {
            path: cfg.socket.clone(),
            err,
        })?;
        let hello = ToDaemon::Hello(proto::Hello {
            version: proto::VERSION,
            name: cfg.name.clone(),
            weight: cfg.weight,
            priority: cfg.priority,
            vram,
            channels,
            gpu: cfg.gpu,
        });
        let proto_err = |e: &dyn std::fmt::Display| HostError::Protocol(e.to_string());
        conn.send(&proto::encode(&hello), None)
            .map_err(|e| proto_err(&e))?;
        let mut buf = [0u8; proto::MAX_MESSAGE];
        let welcome = match conn.recv(&mut buf).map_err(|e| proto_err(&e))? {
            Received::Message(n, fd) => match (proto::decode::<ToVm>(&buf[..n]), fd) {
                (
                    Ok(ToVm::Welcome {
                        version,
                        vm,
                        vram_offset,
                        vram_size,
                        gpu: Some(gpu),
                    }),
                    Some(vram_fd),
                ) if version == proto::VERSION
                    && vram_size == vram
                    && cfg.gpu.is_none_or(|p| p == gpu.index) =>
                {
                    Welcome {
                        vm,
                        gpu,
                        vram_offset,
                        vram_size,
                        vram_fd,
                    }
                }
                (Ok(ToVm::Error { message, .. }), _) => return Err(HostError::Refused(message)),
                (other, _) => return Err(proto_err(&format!("unexpected answer {other:?}"))),
            },
            _ => return Err(HostError::Refused("connection closed".into())),
        };
        let inner = Arc::new(Inner {
            conn,
            st: Mutex::new(St::default()),
            cv: Condvar::new(),
        });
        let i = inner.clone();
        let reader = std::thread::Builder::new()
            .name("vgpu-host".into())
            .spawn(move || read_loop(&i))
            .map_err(|e| proto_err(&e))?;
        log::info!(
            "vgpu: registered with vgpud as vm {} on its gpu {} (device {}; {} MiB of VRAM at {:#x})",
            welcome.vm,
            welcome.gpu.index,
            welcome.gpu.device,
            welcome.vram_size >> 20,
            welcome.vram_offset
        );
        Ok((
            HostLink {
                inner,
                reader: Some(reader),
            },
            welcome,
        ))
    }

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
    /// is there (checked every few milliseconds while waiting): a pause does not wait for a
    /// grant. The Want stays outstanding; [`HostLink::idle`] withdraws it (or hands back a
    /// grant that crossed it).
    pub fn acquire_unless(
        &self,
        handle: &PreemptHandle,
        kernel: Option<u64>,
        stop: &dyn Fn() -> bool,
    ) -> Result<Ticket, HostError> {
        self.acquire_inner(handle, kernel, Some(stop))
    }

    fn acquire_inner(
        &self,
        handle: &PreemptHandle,
        kernel: Option<u64>,
        stop: Option<&dyn Fn() -> bool>,
    ) -> Result<Ticket, HostError> {
        let mut st = self.inner.lock();
        loop {
            if let Some(why) = &st.lost {
                let e = HostError::Lost(why.clone());
                self.inner.stop_reading(&mut st);
                return Err(e);
            }
            if st.held
                && let Some((seq, _)) = &st.active
            {
                let seq = *seq;
                st.held = false;
                self.inner.stop_reading(&mut st);
                return Ok(Ticket { seq });
            }
            if let Some(g) = st.grant.take() {
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
                return Ok(Ticket { seq: g.seq });
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
                return Err(HostError::Interrupted);
            }
            // Read the socket ourselves until the grant comes (no thread hand-off on the grant
            // path; the reader thread keeps off meanwhile); after a standby hint, poll instead
            // of sleeping.
            st.worker_reading = true;
            let spin_until = st.standby_until.take();
            drop(st);
            let ready = match spin_until {
                Some(t) => {
                    self.inner.conn.spin_readable(t);
                    Ok(())
                }
                None => self
                    .inner
                    .conn
                    .wait_readable_for(stop.map(|_| STOP_POLL))
                    .map(|_| ()),
            };
            st = self.inner.lock();
            match ready {
                Ok(()) => self.inner.receive(&mut st),
                Err(e) => self.inner.lose(&mut st, format!("poll vgpud: {e}")),
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
    }

    /// The worker has nothing to run: withdraw a Want (or hand back a grant not yet used).
    pub fn idle(&self) {
        let mut st = self.inner.lock();
        if st.held
            && let Some((seq, _)) = st.active.take()
        {
            st.held = false;
            st.wanting = false;
            self.inner.send(&mut st, &empty_done(seq));
        } else if let Some(Granted { seq, .. }) = st.grant.take() {
            st.wanting = false;
            self.inner.send(&mut st, &empty_done(seq));
        } else if st.wanting {
            st.wanting = false;
            self.inner.send(&mut st, &ToDaemon::Idle {});
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
    }

    /// Why the link is gone, if it is.
    pub fn lost(&self) -> Option<String> {
        self.inner.lock().lost.clone()
    }
}

fn empty_done(seq: u64) -> ToDaemon {
    ToDaemon::Done {
        seq,
        outcome: RunOutcome::Completed,
        gpu_ns: 0,
        start_ns: 0,
        end_ns: 0,
        more: false,
    }
}

impl Inner {
    /// Reads one waiting message, if any, and acts on it (under the state lock: whichever
    /// thread reads, the state changes the same way).
    fn receive(&self, st: &mut St) {
        let mut buf = [0u8; proto::MAX_MESSAGE];
        let (n, fd) = match self.conn.try_recv(&mut buf) {
            Ok(Received::Message(n, fd)) => (n, fd),
            Ok(Received::Empty) => return,
            Ok(Received::Closed) => return self.lose(st, "vgpud closed the connection".into()),
            Err(e) => return self.lose(st, format!("receive from vgpud: {e}")),
        };
        let msg = match proto::decode::<ToVm>(&buf[..n]) {
            Ok(m) => m,
            Err(e) => return log::error!("vgpu: bad message from vgpud: {e}"),
        };
        match msg {
            ToVm::Grant {
                seq,
                slice_ns,
                deadline_ns,
            } => {
                log::debug!("vgpu: grant {seq} received at {}", proto::monotonic_ns());
                if st.wanting && st.grant.is_none() {
                    st.wanting = false;
                    st.grant = Some(Granted {
                        seq,
                        preempted: false,
                        turn: slice_ns > 0,
                        deadline_ns,
                    });
                    self.cv.notify_all();
                } else {
                    // Crossed with our Idle: nothing to run.
                    self.send(st, &empty_done(seq));
                }
            }
            ToVm::Preempt { seq } => match (&st.active, &mut st.grant) {
                (Some((s, h)), _) if *s == seq => {
                    h.request();
                }
                (_, Some(g)) if g.seq == seq => g.preempted = true,
                _ => {} // for a grant that already ended
            },
            ToVm::Error { message, fatal } => {
                log::error!("vgpu: vgpud: {message}");
                if fatal {
                    self.lose(st, message);
                }
            }
            ToVm::Standby { spin_us } => {
                log::debug!("vgpu: standby at {}", proto::monotonic_ns());
                let spin = Duration::from_micros(spin_us.min(10_000));
                st.standby_until = Some(Instant::now() + 2 * spin);
            }
            ToVm::Welcome { .. } => log::error!("vgpu: unexpected welcome from vgpud"),
            // multigpu: the answers of a move (`moving`).
            m @ (ToVm::MoveReady { .. } | ToVm::MoveRefused { .. } | ToVm::Moved { .. }) => {
                st.move_answer = Some(moving::MoveAnswer::of(m, fd));
                self.cv.notify_all();
            }
        }
    }

    /// The worker stops reading the socket (it has a grant, or the link is gone): the reader
    /// thread takes over, woken only if the worker was reading.
    fn stop_reading(&self, st: &mut St) {
        if std::mem::take(&mut st.worker_reading) {
            self.cv.notify_all();
        }
    }

    /// The link is gone: stop the running job, wake everyone.
    fn lose(&self, st: &mut St, why: String) {
        if st.lost.is_none() {
            log::warn!("vgpu: {why}");
            st.lost = Some(why);
        }
        if let Some((_, h)) = &st.active {
            h.request();
        }
        self.cv.notify_all();
    }
}

/// The reader thread: takes the daemon's messages while the worker is not reading them itself
/// (it does while it waits for a grant: no thread hand-off on the grant path). It exists for
/// the preempts that arrive while a job runs.
fn read_loop(inner: &Inner) {
    loop {
        let mut st = inner.lock();
        while st.worker_reading && st.lost.is_none() {
            st = inner.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        if st.lost.is_some() {
            return;
        }
        drop(st);
        let ready = inner.conn.wait_readable();
        let mut st = inner.lock();
        if let Err(e) = ready {
            return inner.lose(&mut st, format!("poll vgpud: {e}"));
        }
        if !st.worker_reading {
            inner.receive(&mut st);
        }
    }
}

impl Drop for HostLink {
    fn drop(&mut self) {
        {
            let mut st = self.inner.lock();
            if st.lost.is_none() {
                self.inner.send(&mut st, &ToDaemon::Bye {});
            }
        }
        self.inner.conn.shutdown();
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use vgpu_proto::wire::Listener;

    use super::*;

    /// The next message on the daemon's side of the link.
    fn recv(c: &Conn) -> ToDaemon {
        let mut buf = [0u8; proto::MAX_MESSAGE];
        loop {
            c.wait_readable().unwrap();
            match c.recv(&mut buf).unwrap() {
                Received::Message(n, _) => return proto::decode(&buf[..n]).unwrap(),
                Received::Empty => {}
                Received::Closed => panic!("the VM closed the link"),
            }
        }
    }

    fn grant(c: &Conn, seq: u64) {
        let g = ToVm::Grant {
            seq,
            slice_ns: 0,
            deadline_ns: 0,
        };
        c.send(&proto::encode(&g), None).unwrap();
    }

    fn done(seq: u64, more: bool) -> ToDaemon {
        ToDaemon::Done {
            seq,
            outcome: RunOutcome::Completed,
            gpu_ns: 1000,
            start_ns: 0,
            end_ns: 0,
            more,
        }
    }

    #[test]
    fn wants_carry_the_job_identity_and_the_job_a_more_announced_is_identified() {
        let dir = std::env::temp_dir().join(format!("vgpu-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("sock");
        let listener = Listener::bind(&socket).unwrap();
        // A scripted daemon: registers the VM, grants each job, returns what the VM sent.
        let daemon = std::thread::spawn(move || {
            let conn = loop {
                if let Some(c) = listener.accept().unwrap() {
                    break c;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            let ToDaemon::Hello(h) = recv(&conn) else {
                panic!("expected hello")
            };
            let vram = std::fs::File::open("/dev/null").unwrap();
            let welcome = ToVm::Welcome {
                version: proto::VERSION,
                vm: 1,
                vram_offset: 0,
                vram_size: h.vram,
                gpu: Some(proto::Placement {
                    index: 0,
                    device: 0,
                }),
            };
            conn.send(&proto::encode(&welcome), Some(vram.as_fd()))
                .unwrap();
            let mut seen = Vec::new();
            for seq in 1..=4 {
                // Job 3 was announced by job 2's `more` and has no identity: no want.
                if seq != 3 {
                    seen.push(recv(&conn));
                }
                grant(&conn, seq);
                seen.push(recv(&conn));
            }
            seen
        });
        let cfg = HostConfig {
            socket,
            weight: 1,
            priority: 0,
            name: "t".into(),
            gpu: None,
        };
        let (link, _welcome) = HostLink::connect(&cfg, 2 << 20, 1).unwrap();
        let handle = PreemptHandle::new();
        for (kernel, more) in [
            (Some(7), true),
            (Some(9), true),
            (None, false),
            (None, false),
        ] {
            let t = link.acquire(&handle, kernel).unwrap();
            let gpu = Duration::from_micros(1);
            link.release(t, RunOutcome::Completed, gpu, (0, 0), more);
        }
        let want = |kernel| ToDaemon::Want { kernel };
        assert_eq!(
            daemon.join().unwrap(),
            [
                want(Some(7)),
                done(1, true),
                // The implicit want of `more` gets its identity from the next acquire.
                want(Some(9)),
                done(2, true),
                done(3, false),
                want(None),
                done(4, false),
            ]
        );
        drop(link);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
