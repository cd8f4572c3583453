//! The daemon: one thread, one `ppoll` loop over the listening socket, the VM connections, the
//! pidfds of departed VM processes and a stop descriptor; the scheduler decides who holds the
//! GPU, the loop sends grants and preempts, enforces slice ends and revokes the grant of a VM
//! that does not yield. Message handling is in `handle`; each GPU's state (VRAM pool,
//! scheduler, grant in flight) and the placement of VMs on GPUs are in `gpus`.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use scheduler::{Accounting, Config as SchedConfig, Pick, VmId};

use crate::gpus::Gpu;
use crate::partition::PartitionError;
use crate::proto::{self, ToVm, monotonic_ns};
use crate::report::{Report, VmReport, WindowReport};
use crate::session::{Session, ms};
use crate::wire::{Listener, Received, WireError};

/// Runtime configuration of the daemon (`vgpud --help`).
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    /// Physical VRAM of each GPU, shared by its VMs.
    pub vram: u64,
    /// Channel quota of each GPU: channels all its VMs together may use.
    pub channels: u32,
    /// multigpu: the CUDA device ordinal of each GPU the daemon manages, in index order (each
    /// gets its own VRAM pool, channel quota and scheduler); empty: one GPU, device 0.
    pub gpus: Vec<u32>,
    pub sched: SchedConfig,
    /// The scheduler configuration as given (for the report).
    pub sched_text: String,
    /// A VM that has not ended its run this long after a Preempt loses the grant and is
    /// disconnected.
    pub revoke_after: Duration,
    /// A non-preemptive grant (FIFO, CREDIT, BAND) running longer than this is preempted.
    pub max_run: Duration,
    pub report: Option<PathBuf>,
    pub report_every: Option<Duration>,
    /// Around the end of a slice other VMs wait for, the daemon polls without sleeping from
    /// `spin` before to `spin` after it, and the VM likely to run next is told to do the same
    /// (`Standby`): waking a sleeping thread costs 100-400 µs in a nested VM, more than the
    /// switch itself. Zero: never spin (machines with few CPUs).
    pub spin: Duration,
    /// A VM told to stop at its slice end (`Grant.deadline_ns`) is sent a `Preempt` this long
    /// after it, in case it did not.
    pub backstop: Duration,
    /// restart: after a start on a stale socket (the previous instance did not exit cleanly),
    /// first registrations wait this long so that the previous instance's VMs re-register
    /// first (`adopt`); zero: no wait.
    pub adopt: Duration,
}

/// Errors that stop the daemon.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("socket: {0}")]
    Wire(#[from] WireError),
    #[error("VRAM: {0}")]
    Vram(#[from] PartitionError),
    #[error("scheduler configuration: {0}")]
    Sched(#[from] scheduler::ConfigError),
    #[error("poll: {0}")]
    Poll(std::io::Error),
    #[error("write --report {0}")]
    Report(String),
}

/// The grant in flight.
pub(crate) struct Run {
    pub vm: VmId,
    pub conn: u64,
    pub seq: u64,
    pub granted_ns: u64,
    /// Slice end (monotonic ns), or the `max_run` limit of a non-preemptive grant.
    pub deadline_ns: u64,
    pub preempt_sent_ns: Option<u64>,
    /// Time-sliced grant: jobs may follow each other (`Progress`).
    pub turn: bool,
    /// The slice of a turn; the turn is extended by this while no other VM waits.
    pub slice_ns: u64,
    /// The end of the slice as granted.
    pub slice_end_ns: u64,
    /// The VM was told to stop by itself at `slice_end_ns` (others were waiting).
    pub self_deadline: bool,
    /// A standby hint went out for this run's end.
    pub standby_sent: bool,
    /// The turn outlived its slice because no other VM waited.
    pub extended: bool,
    /// GPU time of the jobs reported by `Progress` so far, and how many.
    pub turn_gpu_ns: u64,
    pub turn_jobs: u32,
    /// The end stamp of the grant's last job (the grant time before the first).
    pub last_stamp_ns: u64,
    /// Version-4 VMs: when to look at the VM's grant word next, once the stop is due (`kept`).
    pub word_check_ns: Option<u64>,
    /// The daemon took the grant back through the VM's word (`kept`), after this many looks
    /// at the word, the last one this late after it was planned.
    pub revoked: bool,
    /// The daemon may take the grant back through the word before the VM takes it (not a VM's
    /// grant after `kept::SPARE_AFTER` such take-backs in a row), and did (`unstarted`).
    pub may_revoke_unstarted: bool,
    pub unstarted: bool,
    pub word_looks: u32,
    pub look_late_ns: u64,
    /// A take-back through the word won and the VM's queued messages are being read
    /// (`kept::revoke_kept`): a `Want` or `Idle` the VM sent after it saw `Revoked` is kept
    /// here (the last one) and applied once the grant has ended, not dropped as one that
    /// crossed a grant in flight.
    pub revoking: bool,
    pub after_revoke: Option<AfterRevoke>,
}

/// A VM's message read while its grant is being taken back (`Run::after_revoke`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRevoke {
    Want(Option<scheduler::KernelKey>),
    Idle,
}

/// A departed VM's partition, held until its process has exited.
struct Quarantined {
    pidfd: Option<OwnedFd>,
    /// Index of its GPU.
    gpu: usize,
    /// The VRAM memory object of the partition (restart: an adopted one, or its GPU's own).
    object: crate::adopt::ObjectKey,
    offset: u64,
    size: u64,
    channels: u32,
    name: String,
}

/// See the module documentation.
pub struct Daemon {
    pub(crate) cfg: DaemonConfig,
    listener: Listener,
    /// The GPUs, in index order (at least one).
    pub(crate) gpus: Vec<Gpu>,
    origin_ns: u64,
    pub(crate) sessions: BTreeMap<u64, Session>,
    pub(crate) by_vm: BTreeMap<VmId, u64>,
    quarantine: Vec<Quarantined>,
    /// The current polling period around a slice end yields at every look
    /// (`wire::polite_spin`, decided when the period starts).
    spin_polite: bool,
    next_conn: u64,
    pub(crate) next_vm: u32,
    next_seq: u64,
    /// GPU time per window of every VM ever registered (the scheduler forgets removed ones).
    pub(crate) accounting: Accounting,
    pub(crate) report: Report,
    pub(crate) gone: Vec<VmReport>,
    last_report_ns: u64,
    last_at: std::cell::Cell<Duration>,
    /// Why the last write of the report failed (cleared by a successful one).
    report_error: Option<String>,
    /// restart: this instance's boot id, adopted memory objects, the adoption window.
    pub(crate) adoption: crate::adopt::Adoption,
    /// status: the last status snapshot (monotonic ns until which it is reused, its parts):
    /// many status connections cost one snapshot (`status::reuse_ns`).
    pub(crate) status_cache: Option<(u64, std::sync::Arc<Vec<String>>)>,
}

impl Daemon {
    /// Binds the socket and creates each GPU's VRAM memory object and scheduler.
    pub fn new(cfg: DaemonConfig) -> Result<Self, DaemonError> {
        let devices = if cfg.gpus.is_empty() {
            vec![0]
        } else {
            cfg.gpus.clone()
        };
        let gpus = devices
            .iter()
            .enumerate()
            .map(|(i, &d)| Gpu::new(i as u32, d, cfg.vram, cfg.channels, &cfg.sched))
            .collect::<Result<Vec<_>, _>>()?;
        let listener = Listener::bind(&cfg.socket)?;
        let own: Vec<BorrowedFd<'_>> = gpus.iter().map(|g| g.pool.fd()).collect();
        let adoption = crate::adopt::Adoption::new(
            &own,
            listener.replaced_stale(),
            cfg.adopt.as_nanos() as u64,
        );
        let accounting = Accounting::new(cfg.sched.window, usize::MAX >> 1);
        let mut report = Report {
            version: proto::VERSION,
            sched: cfg.sched_text.clone(),
            window_ns: cfg.sched.window.as_nanos() as u64,
            boot: adoption.boot.clone(),
            ..Report::default()
        };
        report.restart.stale_socket = listener.replaced_stale();
        let origin_ns = monotonic_ns();
        log::info!(
            "vgpud: listening on {:?}; {} GPU{} (devices {:?}), each VRAM {} MiB, {} channels, scheduler {:?}",
            cfg.socket,
            gpus.len(),
            if gpus.len() == 1 { "" } else { "s" },
            devices,
            cfg.vram >> 20,
            cfg.channels,
            cfg.sched_text
        );
        Ok(Daemon {
            cfg,
            listener,
            gpus,
            origin_ns,
            sessions: BTreeMap::new(),
            by_vm: BTreeMap::new(),
            quarantine: Vec::new(),
            spin_polite: true,
            next_conn: 0,
            next_vm: 1,
            next_seq: 1,
            accounting,
            report,
            gone: Vec::new(),
            last_report_ns: origin_ns,
            last_at: std::cell::Cell::new(Duration::ZERO),
            report_error: None,
            adoption,
            status_cache: None,
        })
    }

    /// Names the GPUs after discovery (`--gpus all`): each device's name and memory, for the
    /// report. Devices not managed here are ignored.
    pub fn describe_gpus(&mut self, devices: &[crate::discover::Discovered]) {
        for g in &mut self.gpus {
            if let Some(d) = devices.iter().find(|d| d.ordinal == g.device) {
                g.report.name = Some(d.name.clone());
                g.report.memory = Some(d.memory);
            }
        }
    }

    /// Scheduler time of the monotonic instant `mono_ns`, never earlier than a time already
    /// handed out (events are stamped in the order they are handled).
    pub(crate) fn at(&self, mono_ns: u64) -> Duration {
        let t =
            Duration::from_nanos(mono_ns.saturating_sub(self.origin_ns)).max(self.last_at.get());
        self.last_at.set(t);
        t
    }

    /// Runs until `stop` becomes readable (or closed); writes the report at the end.
    pub fn run(&mut self, stop: BorrowedFd<'_>) -> Result<Report, DaemonError> {
        loop {
            let now = monotonic_ns();
            self.adopt_tick(now);
            for g in 0..self.gpus.len() {
                self.timers(g, now);
                self.schedule(g, now);
            }
            self.track_demand(now);
            if self
                .cfg
                .report_every
                .is_some_and(|e| now - self.last_report_ns >= e.as_nanos() as u64)
            {
                self.last_report_ns = now;
                self.write_report(now);
            }
            if self.poll_once(stop)? {
                break;
            }
        }
        let now = monotonic_ns();
        self.track_demand(now);
        let r = self.write_report(now);
        match self.report_error.take() {
            Some(e) => Err(DaemonError::Report(e)),
            None => Ok(r),
        }
    }

    /// One `ppoll` round and the events it found; true when `stop` fired.
    fn poll_once(&mut self, stop: BorrowedFd<'_>) -> Result<bool, DaemonError> {
        let ev = libc::POLLIN;
        let mut fds = vec![
            pollfd(stop.as_raw_fd(), ev),
            pollfd(self.listener.as_fd().as_raw_fd(), ev),
        ];
        let conns: Vec<u64> = self.sessions.keys().copied().collect();
        for c in &conns {
            fds.push(pollfd(self.sessions[c].conn.as_fd().as_raw_fd(), ev));
        }
        let q0 = fds.len();
        for q in &self.quarantine {
            fds.push(pollfd(q.pidfd.as_ref().map_or(-1, |f| f.as_raw_fd()), ev));
        }
        let now = monotonic_ns();
        let mut spinning = false;
        for g in 0..self.gpus.len() {
            if self.spin_window(g, now) {
                if !spinning && !self.gpus[g].run.as_ref().is_some_and(|r| r.standby_sent) {
                    // A new polling period: yield at every look unless the host is
                    // oversubscribed (`wire::polite_spin`).
                    self.spin_polite = crate::wire::polite_spin();
                }
                spinning = true;
                self.send_standby(g);
            }
        }
        let timeout = self.next_deadline().map(|d| {
            let left = if spinning { 0 } else { d.saturating_sub(now) };
            libc::timespec {
                tv_sec: (left / 1_000_000_000) as libc::time_t,
                tv_nsec: (left % 1_000_000_000) as libc::c_long,
            }
        });
        let tp = timeout
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `fds` is a live array of pollfd of the given length; `tp` is null or points
        // at a timespec that outlives the call; no signal mask is changed.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as _, tp, std::ptr::null()) };
        if n == 0 && spinning && self.spin_polite {
            // Polling around a slice end: give the core away if anything else wants it (the
            // VM on the GPU may share it and must stop on time; returns at once otherwise).
            std::thread::yield_now();
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(DaemonError::Poll(e));
        }
        // On stop, the messages already received are handled first (a VM's last report counts).
        let stop = fds[0].revents != 0;
        if fds[1].revents != 0 {
            self.accept_all()?;
        }
        for (i, c) in conns.iter().enumerate() {
            if fds[2 + i].revents != 0 {
                self.read_all(*c);
            }
        }
        let exited: Vec<usize> = (0..self.quarantine.len())
            .filter(|i| fds[q0 + i].revents != 0)
            .collect();
        for i in exited.into_iter().rev() {
            let q = self.quarantine.remove(i);
            self.reclaim(q);
        }
        let closing: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.closing)
            .map(|(c, _)| *c)
            .collect();
        for c in closing {
            self.drop_session(c);
        }
        Ok(stop)
    }

    fn accept_all(&mut self) -> Result<(), DaemonError> {
        while let Some(conn) = self.listener.accept()? {
            let id = self.next_conn;
            self.next_conn += 1;
            let s = Session::new(conn);
            log::debug!("vgpud: connection {id} from pid {:?}", s.pid);
            self.sessions.insert(id, s);
        }
        Ok(())
    }

    /// Reads every message waiting on connection `c`.
    pub(crate) fn read_all(&mut self, c: u64) {
        let mut buf = [0u8; proto::MAX_MESSAGE];
        loop {
            let Some(s) = self.sessions.get_mut(&c) else {
                return;
            };
            if s.closing {
                return;
            }
            match s.conn.recv(&mut buf) {
                Ok(Received::Empty) => return,
                Ok(Received::Closed) => {
                    s.closing = true;
                    return;
                }
                Ok(Received::Message(n, fd)) => self.handle(c, &buf[..n], fd),
                Err(e) => {
                    self.report.refused += 1;
                    s.refuse(format!("{e}"), false);
                    if !matches!(e, WireError::Truncated(_)) {
                        s.closing = true;
                        return;
                    }
                }
            }
        }
    }

    /// Sends a grant to the next VM when GPU `g` is free.
    fn schedule(&mut self, g: usize, now_ns: u64) {
        let gpu = &mut self.gpus[g];
        if gpu.run.is_some() || gpu.wait_until_ns.is_some_and(|w| w > now_ns) {
            return;
        }
        gpu.wait_until_ns = None;
        let now = self.at(now_ns);
        let picked = self.gpus[g].sched.pick(now);
        match picked {
            Ok(Pick::Run(d)) => {
                let Some(&conn) = self.by_vm.get(&d.run) else {
                    log::error!("vgpud: scheduler picked unknown vm {}", d.run.0);
                    let _ = self.gpus[g].sched.remove(d.run, now);
                    return;
                };
                let seq = self.next_seq;
                self.next_seq += 1;
                let slice_ns = d.slice.map_or(0, |s| s.as_nanos().max(1) as u64);
                let limit = if slice_ns > 0 {
                    slice_ns
                } else {
                    self.cfg.max_run.as_nanos() as u64
                };
                // Others wait: the VM stops by itself at the slice end (no message, no thread
                // to wake); the daemon's preempt follows only as a backstop.
                let self_deadline = slice_ns > 0 && self.others_waiting(g, d.run);
                // Version 4: the word says `Granted` before the grant goes out (`kept`); a VM
                // whose last grants went back unstarted has this one spared.
                let (word, spared) = self
                    .sessions
                    .get(&conn)
                    .and_then(|s| s.reg.as_ref())
                    .and_then(|r| Some((r.word.as_ref()?, r.unstarted_streak)))
                    .map_or((false, false), |(w, streak)| {
                        (w.grant(seq), streak >= crate::kept::SPARE_AFTER)
                    });
                let backstop = if self_deadline {
                    self.cfg.backstop.as_nanos() as u64
                } else {
                    0
                };
                self.gpus[g].run = Some(Run {
                    vm: d.run,
                    conn,
                    seq,
                    granted_ns: now_ns,
                    deadline_ns: now_ns + limit + backstop,
                    preempt_sent_ns: None,
                    turn: slice_ns > 0,
                    slice_ns,
                    slice_end_ns: now_ns + limit,
                    self_deadline,
                    standby_sent: false,
                    extended: false,
                    turn_gpu_ns: 0,
                    turn_jobs: 0,
                    last_stamp_ns: now_ns,
                    // A VM told its slice end: its word is looked at from then on (`kept`).
                    word_check_ns: (word && self_deadline).then_some(now_ns + limit),
                    revoked: false,
                    may_revoke_unstarted: word && !spared,
                    unstarted: false,
                    word_looks: 0,
                    look_late_ns: 0,
                    revoking: false,
                    after_revoke: None,
                });
                self.report.grants += 1;
                self.gpus[g].report.grants += 1;
                self.note_use(Some(now_ns), None);
                log::debug!(
                    "vgpud: grant {seq} to vm {} on gpu {g} (slice {slice_ns} ns) at {now_ns}",
                    d.run.0
                );
                if let Some(s) = self.sessions.get_mut(&conn) {
                    if let Some(r) = &mut s.reg {
                        r.report.grants += 1;
                    }
                    let deadline_ns = if self_deadline { now_ns + limit } else { 0 };
                    s.send(&ToVm::Grant {
                        seq,
                        slice_ns,
                        deadline_ns,
                    });
                }
            }
            Ok(Pick::Wait { until, .. }) => {
                log::debug!("vgpud: wait until {} at {now_ns}", self.mono_of(until));
                self.gpus[g].wait_until_ns = Some(self.origin_ns + until.as_nanos() as u64);
            }
            Ok(Pick::Idle) => {}
            Err(e) => log::error!("vgpud: scheduler pick: {e}"),
        }
    }

    /// The monotonic instant (ns) of a scheduler time.
    pub(crate) fn mono_of(&self, at: Duration) -> u64 {
        self.origin_ns
            .saturating_add(u64::try_from(at.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Slice ends, run limits and revocations on GPU `g`.
    fn timers(&mut self, g: usize, now_ns: u64) {
        let others = self.gpus[g]
            .run
            .as_ref()
            .is_some_and(|r| self.others_waiting(g, r.vm));
        // A turn's grant the VM keeps between two jobs goes back through its word as soon as
        // its stop is due (`kept`), without the VM.
        if self.recheck_word(g, now_ns, others) {
            return;
        }
        let Some(run) = &mut self.gpus[g].run else {
            return;
        };
        match run.preempt_sent_ns {
            None if now_ns >= run.deadline_ns && run.turn && !others => {
                // Nobody else wants the GPU: preempting would only cost a round trip. The turn
                // goes on; a VM that asks from now on preempts it at once (`submit`).
                run.deadline_ns = now_ns + run.slice_ns;
                run.extended = true;
            }
            None if now_ns >= run.deadline_ns => {
                let vm = run.vm;
                self.preempt_now(g, vm);
            }
            Some(sent) if now_ns - sent >= self.cfg.revoke_after.as_nanos() as u64 => {
                let conn = run.conn;
                self.report.evictions += 1;
                if let Some(s) = self.sessions.get_mut(&conn) {
                    if let Some(r) = &mut s.reg {
                        r.report.evicted = true;
                    }
                    let why = format!(
                        "grant revoked: no yield {} after preempt",
                        ms(self.cfg.revoke_after)
                    );
                    s.refuse(why, true);
                }
                self.drop_session(conn);
            }
            _ => {}
        }
    }

    /// Whether a registered VM of GPU `g` other than `vm` is queued for it.
    pub(crate) fn others_waiting(&self, g: usize, vm: VmId) -> bool {
        self.sessions
            .values()
            .filter_map(|s| s.reg.as_ref())
            .any(|r| r.pending && r.id != vm && r.gpu == g)
    }

    /// Whether `now` is in the spin window around the end of a slice others wait for on GPU
    /// `g`.
    fn spin_window(&self, g: usize, now: u64) -> bool {
        let spin = self.cfg.spin.as_nanos() as u64;
        spin > 0
            && self.gpus[g].run.as_ref().is_some_and(|r| {
                r.self_deadline && now + spin >= r.slice_end_ns && now <= r.slice_end_ns + spin
            })
    }

    /// Tells the VM likely to run next that its grant is near (once per run): the scheduler's
    /// guess (TIMESLICE), else the VM that has waited longest.
    fn send_standby(&mut self, g: usize) {
        let Some(run) = self.gpus[g].run.as_mut().filter(|r| !r.standby_sent) else {
            return;
        };
        run.standby_sent = true;
        let vm = run.vm;
        let next = match self.gpus[g]
            .sched
            .peek_next()
            .and_then(|v| self.by_vm.get(&v))
        {
            Some(c) => Some(*c),
            None => self
                .sessions
                .iter()
                .filter_map(|(c, s)| s.reg.as_ref().map(|r| (c, r)))
                .filter(|(_, r)| r.pending && r.id != vm && r.gpu == g)
                .min_by_key(|(_, r)| r.want_since_ns)
                .map(|(c, _)| *c),
        };
        let spin_us = self.cfg.spin.as_micros() as u64;
        if let Some(s) = next.and_then(|c| self.sessions.get_mut(&c)) {
            s.send(&ToVm::Standby { spin_us });
        }
    }

    /// The earliest instant the loop must wake at without an event.
    fn next_deadline(&self) -> Option<u64> {
        let spin = self.cfg.spin.as_nanos() as u64;
        let runs = self.gpus.iter().filter_map(|g| {
            g.run.as_ref().map(|r| {
                let t = match r.preempt_sent_ns {
                    None if spin > 0 && r.self_deadline && !r.standby_sent => {
                        r.slice_end_ns.saturating_sub(spin)
                    }
                    None => r.deadline_ns,
                    Some(s) => s + self.cfg.revoke_after.as_nanos() as u64,
                };
                // The next look at a version-4 VM's grant word (`kept`); not through a turn
                // extended because nobody waits.
                let word = r
                    .word_check_ns
                    .filter(|_| r.preempt_sent_ns.is_some() || !r.extended);
                word.map_or(t, |w| w.min(t))
            })
        });
        let waits = self.gpus.iter().filter_map(|g| g.wait_until_ns);
        let report = self
            .cfg
            .report_every
            .map(|e| self.last_report_ns + e.as_nanos() as u64);
        runs.chain(waits)
            .chain(report)
            .chain(self.adoption.window_until_ns)
            .min()
    }

    /// Demand time per GPU (some VM of it wants it or holds it); the report's total is the sum.
    fn track_demand(&mut self, now_ns: u64) {
        for g in 0..self.gpus.len() {
            let demand = self.gpus[g].run.is_some()
                || self
                    .sessions
                    .values()
                    .any(|s| s.reg.as_ref().is_some_and(|r| r.pending && r.gpu == g));
            self.report.demand_ns += self.gpus[g].track_demand(demand, now_ns);
        }
    }

    /// Removes a connection: the VM leaves the scheduler (the GPU is free at once if it held
    /// it) and its partition waits in quarantine until its process has exited.
    pub(crate) fn drop_session(&mut self, c: u64) {
        let Some(s) = self.sessions.remove(&c) else {
            return;
        };
        let Some(mut reg) = s.reg else {
            return;
        };
        let now_ns = monotonic_ns();
        self.by_vm.remove(&reg.id);
        let g = reg.gpu;
        let now = self.at(now_ns);
        match self.gpus[g].sched.remove(reg.id, now) {
            Ok(r) if r.was_running => log::info!("vgpud: vm {} left holding the GPU", reg.id.0),
            Ok(_) => {}
            Err(e) => log::error!("vgpud: remove vm {}: {e}", reg.id.0),
        }
        let gpu = &mut self.gpus[g];
        if gpu.run.as_ref().is_some_and(|r| r.vm == reg.id) {
            gpu.run = None;
        }
        gpu.weights -= u64::from(reg.report.weight);
        reg.report.gone_ns = Some(self.at(now_ns).as_nanos() as u64);
        log::info!(
            "vgpud: {} gone{}",
            reg.report.name,
            if reg.report.evicted { " (evicted)" } else { "" }
        );
        let q = Quarantined {
            pidfd: s.pid.and_then(pidfd_open),
            gpu: g,
            object: reg.object,
            offset: reg.report.vram_offset,
            size: reg.report.vram_size,
            channels: reg.report.channels,
            name: reg.report.name.clone(),
        };
        // multigpu: a partition reserved for a move waits for the process like its own one.
        let reserved = reg.moving.map(|m| Quarantined {
            pidfd: s.pid.and_then(pidfd_open),
            gpu: m.gpu,
            object: self.own_object(m.gpu),
            offset: m.offset,
            size: reg.report.vram_size,
            channels: reg.report.channels,
            name: format!("{} (move reservation)", reg.report.name),
        });
        self.gone.push(reg.report);
        let own = s.pid == Some(std::process::id() as i32);
        for q in std::iter::once(q).chain(reserved) {
            if q.pidfd.is_none() || own {
                // The process is gone already (or is this one: an in-process client).
                self.reclaim(q);
            } else {
                self.quarantine.push(q);
            }
        }
    }

    fn reclaim(&mut self, q: Quarantined) {
        let gpu = &mut self.gpus[q.gpu];
        gpu.pool.release(q.offset, q.size);
        gpu.channels_used -= q.channels;
        if q.object != self.own_object(q.gpu) {
            self.release_object(q.object, Some((q.offset, q.size)));
        }
        log::info!(
            "vgpud: reclaimed {} MiB VRAM and {} channels of {} on gpu {}",
            q.size >> 20,
            q.channels,
            q.name,
            q.gpu
        );
    }

    /// Builds the report (and writes it when `--report` is set).
    pub fn write_report(&mut self, now_ns: u64) -> Report {
        let r = self.build_report(now_ns, true);
        if let Some(p) = &self.cfg.report {
            self.report_error = match r.write(p) {
                Ok(()) => None,
                Err(e) => {
                    log::error!("vgpud: write report {p:?}: {e}");
                    Some(format!("{}: {e}", p.display()))
                }
            };
        }
        r
    }

    /// The report as of `now_ns`, from what the daemon holds (no I/O); without `series`, no
    /// windows and no latency samples (a status).
    pub(crate) fn build_report(&self, now_ns: u64, series: bool) -> Report {
        let mut r = self.report.clone();
        r.now_ns = self.at(now_ns).as_nanos() as u64;
        r.vms = self.gone.clone();
        r.vms.extend(
            self.sessions
                .values()
                .filter_map(|s| s.reg.as_ref().map(|g| g.report.clone())),
        );
        r.vms.sort_by_key(|v| v.id);
        r.gpus = self
            .gpus
            .iter()
            .map(|g| {
                let on: Vec<u32> = r
                    .vms
                    .iter()
                    .filter(|v| v.gpu == g.index)
                    .map(|v| v.id)
                    .collect();
                g.snapshot(on)
            })
            .collect();
        if !series {
            r.preempt_latency_ns = Vec::new();
            r.switch_latency_ns = Vec::new();
            for g in &mut r.gpus {
                g.preempt_latency_ns = Vec::new();
                g.switch_latency_ns = Vec::new();
            }
            r.fill_shares();
            return r;
        }
        r.windows = self
            .accounting
            .windows()
            .map(|w| WindowReport {
                start_ns: w.start.as_nanos() as u64,
                per_vm: w
                    .per_vm
                    .iter()
                    .map(|(v, d)| (v.0, d.as_nanos() as u64))
                    .collect(),
            })
            .collect();
        r.fill_shares();
        r
    }
}

fn pollfd(fd: i32, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// A pidfd for `pid` (readable once the process has exited); `None` if it is gone already.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: the pidfd_open system call with no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
