//! The daemon's messages on the VM side of GPU sharing: the reader thread (`read_loop`), and
//! what one message does to the link's state (`Inner::receive`, under the state lock whichever
//! thread reads it), the end of reading and the link lost for good.

use super::*;

pub(super) fn empty_done(seq: u64) -> ToDaemon {
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
    pub(super) fn receive(&self, st: &mut St) {
        let mut buf = [0u8; proto::MAX_MESSAGE];
        let conn = st.conn.clone();
        let (n, fd) = match conn.try_recv(&mut buf) {
            Ok(Received::Message(n, fd)) => (n, fd),
            Ok(Received::Empty) => return,
            Ok(Received::Closed) => {
                return self.disconnected(st, "vgpud closed the connection".into());
            }
            Err(e) => return self.disconnected(st, format!("receive from vgpud: {e}")),
        };
        let msg = match proto::decode::<ToVm>(&buf[..n]) {
            Ok(m) => m,
            Err(e) => return log::error!("vgpu: bad message from vgpud: {e}"),
        };
        // A grant the daemon took back through the word is over before anything follows.
        self.reconcile(st);
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
                } else if self.let_go_granted(st, seq) {
                    // Crossed with our Idle: nothing to run (unless the daemon took it back
                    // through the word already: then nothing is sent for it).
                    self.send(st, &empty_done(seq));
                }
            }
            ToVm::Preempt { seq } => match (&st.active, &mut st.grant) {
                (Some((s, _)), _) if *s == seq && st.held => {
                    // Between two jobs of a turn: no job to stop; the GPU goes back now
                    // (`give_up_kept`), not when the worker comes back to its next job.
                    self.give_up_kept(st);
                }
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
            // Version 4: right after the welcome (`kept`).
            ToVm::GrantWord {} => self.take_word(st, fd),
            ToVm::Welcome { .. } => log::error!("vgpu: unexpected welcome from vgpud"),
            // Answers a status connection (`vgpud status`), never a VM's.
            ToVm::StatusPart { .. } => log::error!("vgpu: unexpected status part from vgpud"),
            // multigpu: the answers of a move (`moving`).
            m @ (ToVm::MoveReady { .. } | ToVm::MoveRefused { .. } | ToVm::Moved { .. }) => {
                st.move_answer = Some(moving::MoveAnswer::of(m, fd));
                self.cv.notify_all();
            }
        }
    }

    /// The worker stops reading the socket (it has a grant, or the link is gone): the reader
    /// thread takes over, woken only if the worker was reading.
    pub(super) fn stop_reading(&self, st: &mut St) {
        if std::mem::take(&mut st.worker_reading) {
            self.cv.notify_all();
        }
    }

    /// The link is gone: stop the running job, wake everyone.
    pub(super) fn lose(&self, st: &mut St, why: String) {
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
/// the preempts that arrive while a job runs, and re-registers when the daemon went away.
/// It runs at the priority of the GPU's thread (`boost`) throughout.
pub(super) fn read_loop(inner: &Inner) {
    // It delivers the preempts that come while a job runs (a turn nobody waited for, a
    // priority preemption): raised for its whole life, as the worker is while it holds a
    // grant. It only reads the daemon's messages, which no guest controls.
    let _raised = inner.boost.raise();
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    inner
        .reader_tid
        .store(tid, std::sync::atomic::Ordering::Relaxed);
    loop {
        let mut st = inner.lock();
        while st.worker_reading && st.lost.is_none() && st.down.is_none() {
            st = inner.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        if st.lost.is_some() {
            // This thread ends: nothing may move its id later (`pin`; a reused id would be
            // another thread's).
            inner
                .reader_tid
                .store(0, std::sync::atomic::Ordering::Relaxed);
            drop(st.reader_pinned.take());
            return;
        }
        if st.down.is_some() {
            drop(st);
            inner.reconnect();
            continue;
        }
        let (conn, epoch) = (st.conn.clone(), st.epoch);
        drop(st);
        let ready = conn.wait_readable();
        let mut st = inner.lock();
        if st.epoch != epoch || st.down.is_some() {
            continue;
        }
        if let Err(e) = ready {
            inner.disconnected(&mut st, format!("poll vgpud: {e}"));
            continue;
        }
        if !st.worker_reading {
            inner.receive(&mut st);
        }
    }
}
