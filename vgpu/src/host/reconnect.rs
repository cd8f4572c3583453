//! The daemon went away: the link keeps the VM's GPU state, waits for a daemon to listen on the
//! same socket again, and re-registers there claiming what it holds (protocol version 3,
//! `Hello::resume`, docs/architecture.md "Restart"): the boot id of the instance it knew, its
//! partition's offset, and the VRAM memory object attached (on sim the partition's pages live
//! in it, kept alive by this process's mapping). A restarted daemon welcomes it with the same
//! partition of the same object; anything else (the claim refused, another partition) is
//! the GPU lost, as is no daemon within `reconnect_ms`.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_proto::proto::{self, ToVm};
use vgpu_proto::wire::{Conn, Received};

use super::{Down, Inner, St, hello};

/// How often a link waiting for its daemon tries to connect.
pub(super) const RETRY: Duration = Duration::from_millis(10);

/// Why a re-registration did not happen.
enum Rereg {
    /// The daemon answered and will not take the claim (or welcomed something else).
    Refused(String),
    /// No answer (the connection ended, or the time ran out): try again.
    Again(String),
}

/// (device, inode) of a descriptor.
fn identity(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    // SAFETY: stat is plain data; all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the stat we own.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

impl Inner {
    /// The connection ended without the daemon saying why (killed, crashed): wait for it to
    /// come back if the link can (a version-3 daemon and `reconnect_ms` > 0), else the GPU is
    /// lost. The running job is stopped (its context kept: it resumes at a grant of the next
    /// instance); wants and grants of this connection are forgotten.
    pub(super) fn disconnected(&self, st: &mut St, why: String) {
        if st.lost.is_some() || st.down.is_some() {
            return;
        }
        if self.claim.cfg.reconnect.is_zero() || st.boot.is_none() {
            return self.lose(st, why);
        }
        log::warn!(
            "vgpu: vgpud went away ({why}); GPU work paused, waiting up to {} ms for it on {:?}",
            self.claim.cfg.reconnect.as_millis(),
            self.claim.cfg.socket
        );
        st.down = Some(Down {
            since: Instant::now(),
            why,
        });
        st.wanting = false;
        st.identified = false;
        st.grant = None;
        st.held = false;
        st.standby_until = None;
        // The word was the connection's: the next instance sends its own (`kept`).
        st.word = None;
        if let Some((_, h)) = st.active.take() {
            h.request();
        }
        self.lower(st);
        self.cv.notify_all();
    }

    /// Run by the reader thread while the daemon is away: connects to the socket every
    /// `RETRY` and re-registers, until it succeeds, is refused, or `reconnect_ms` has passed.
    pub(super) fn reconnect(&self) {
        let (since, why) = match &self.lock().down {
            Some(d) => (d.since, d.why.clone()),
            None => return,
        };
        let limit = self.claim.cfg.reconnect;
        let deadline = since + limit;
        let mut last = String::from("nobody listens");
        loop {
            {
                let mut st = self.lock();
                if st.lost.is_some() || st.down.is_none() {
                    return;
                }
                if Instant::now() >= deadline {
                    let msg = format!(
                        "vgpud went away ({why}) and did not come back within {} ms ({last})",
                        limit.as_millis()
                    );
                    return self.lose(&mut st, msg);
                }
            }
            match Conn::connect(&self.claim.cfg.socket) {
                Ok(conn) => match self.reregister(&conn, deadline) {
                    Ok(()) => return self.resumed(conn, since),
                    Err(Rereg::Refused(m)) => {
                        let mut st = self.lock();
                        if super::older_daemon(st.version, &m) {
                            // Replaced by a daemon of the older protocol: claim as version 3.
                            log::warn!("vgpu: the restarted vgpud: {m}: claiming as version 3");
                            st.version = proto::RESUME_VERSION;
                            continue;
                        }
                        return self.lose(&mut st, format!("the restarted vgpud: {m}"));
                    }
                    Err(Rereg::Again(m)) => last = m,
                },
                Err(e) => last = e.to_string(),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(RETRY.min(left));
        }
    }

    /// Sends the claim on `conn` and waits (until `deadline`) for its welcome, checked: the
    /// same partition of the same memory object, from another instance.
    fn reregister(&self, conn: &Conn, deadline: Instant) -> Result<(), Rereg> {
        let c = &self.claim;
        let (boot, vm, part) = {
            let st = self.lock();
            (
                st.boot.clone().unwrap_or_default(),
                st.vm,
                st.partition.clone(),
            )
        };
        let resume = proto::Resume {
            boot: boot.clone(),
            vm,
            gpu: part.gpu,
            vram_offset: part.offset,
        };
        let version = self.lock().version;
        let msg = proto::encode(&hello(&c.cfg, c.vram, c.channels, Some(resume), version));
        conn.send(&msg, Some(part.fd.as_fd()))
            .map_err(|e| Rereg::Again(format!("send the claim: {e}")))?;
        let mut buf = [0u8; proto::MAX_MESSAGE];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.lock().lost.is_some() {
                return Err(Rereg::Again("no answer to the claim".into()));
            }
            let wait = left.min(Duration::from_millis(50));
            match conn.wait_readable_for(Some(wait)) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => return Err(Rereg::Again(e.to_string())),
            }
            let (n, fd) = match conn.recv(&mut buf) {
                Ok(Received::Message(n, fd)) => (n, fd),
                Ok(Received::Empty) => continue,
                Ok(Received::Closed) => return Err(Rereg::Again("closed before a welcome".into())),
                Err(e) => return Err(Rereg::Again(e.to_string())),
            };
            return match proto::decode::<ToVm>(&buf[..n]) {
                Ok(ToVm::Welcome {
                    version: welcomed,
                    vm: new_vm,
                    vram_offset,
                    vram_size,
                    boot: Some(new_boot),
                    gpu,
                }) if welcomed == version
                    && gpu.is_none_or(|g| g.index == part.gpu)
                    && vram_offset == part.offset
                    && vram_size == c.vram
                    && new_boot != boot
                    && fd.as_ref().and_then(|f| identity(f.as_fd()))
                        == identity(part.fd.as_fd()) =>
                {
                    let mut st = self.lock();
                    st.boot = Some(new_boot);
                    st.vm = new_vm;
                    Ok(())
                }
                Ok(ToVm::Error { message, .. }) => Err(Rereg::Refused(message)),
                Ok(ToVm::Standby { .. }) => continue,
                other => Err(Rereg::Refused(format!(
                    "welcomed the claim with something else: {other:?}"
                ))),
            };
        }
    }

    /// Re-registered on `conn`: the link works again (a new generation: grants of the old
    /// connection are forgotten), the waiting worker goes on.
    fn resumed(&self, conn: Conn, since: Instant) {
        let mut st = self.lock();
        if st.lost.is_some() {
            return;
        }
        st.conn = Arc::new(conn);
        st.epoch += 1;
        st.down = None;
        log::warn!(
            "vgpu: re-registered with the restarted vgpud (instance {}) as vm {} after {} ms",
            st.boot.as_deref().unwrap_or("?"),
            st.vm,
            since.elapsed().as_millis()
        );
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::path::{Path, PathBuf};

    use pgpu::PreemptHandle;
    use vgpu_proto::proto::{RunOutcome, ToDaemon};
    use vgpu_proto::wire::Listener;

    use super::*;
    use crate::host::{HostConfig, HostError, HostLink};

    const VRAM: u64 = 2 << 20;
    const OFFSET: u64 = 4 << 20;

    fn memfd() -> OwnedFd {
        // SAFETY: memfd_create with a static name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"vgpud-vram".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor nobody else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// The next message (and descriptor) on the daemon's side; `None` when the VM closed.
    fn next(c: &Conn) -> Option<(ToDaemon, Option<OwnedFd>)> {
        let mut buf = [0u8; proto::MAX_MESSAGE];
        loop {
            c.wait_readable().unwrap();
            match c.recv(&mut buf).unwrap() {
                Received::Message(n, fd) => return Some((proto::decode(&buf[..n]).unwrap(), fd)),
                Received::Empty => {}
                Received::Closed => return None,
            }
        }
    }

    fn accept(l: &Listener) -> Conn {
        loop {
            if let Some(c) = l.accept().unwrap() {
                return c;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn send(c: &Conn, m: &ToVm, fd: Option<BorrowedFd<'_>>) {
        c.send(&proto::encode(m), fd).unwrap();
    }

    fn welcome(boot: &str) -> ToVm {
        welcome_at(boot, OFFSET)
    }

    fn welcome_at(boot: &str, vram_offset: u64) -> ToVm {
        ToVm::Welcome {
            version: proto::VERSION,
            vm: 3,
            vram_offset,
            vram_size: VRAM,
            boot: Some(boot.into()),
            gpu: Some(proto::Placement {
                index: 0,
                device: 0,
            }),
        }
    }

    /// A scripted first daemon instance: registers the VM, grants its first want, and goes
    /// away (connection and socket) once `go` is told.
    fn first_instance(
        socket: &Path,
        vram: OwnedFd,
    ) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let l = Listener::bind(socket).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let c = accept(&l);
            let Some((ToDaemon::Hello(h), None)) = next(&c) else {
                panic!("expected a first hello")
            };
            assert_eq!(h.resume, None);
            send(&c, &welcome("aa"), Some(vram.as_fd()));
            assert!(matches!(next(&c), Some((ToDaemon::Want { .. }, _))));
            send(
                &c,
                &ToVm::Grant {
                    seq: 1,
                    slice_ns: 0,
                    deadline_ns: 0,
                },
                None,
            );
            let _ = rx.recv();
        });
        (tx, t)
    }

    fn link(socket: PathBuf, reconnect_ms: u64) -> HostLink {
        let cfg = HostConfig {
            reconnect: Duration::from_millis(reconnect_ms),
            ..HostConfig::plain(socket, "t")
        };
        HostLink::connect(&cfg, VRAM, 1).unwrap().0
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vgpu-reconnect-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_link_whose_daemon_goes_away_stops_its_job_and_re_registers_with_the_next_one() {
        let d = dir("back");
        let socket = d.join("sock");
        let (gone, first) = first_instance(&socket, memfd());
        let link = link(socket.clone(), 5000);
        let handle = PreemptHandle::new();
        let t = link.acquire(&handle, Some(7)).unwrap();
        // The partition moved (another range of another object): that is what is claimed.
        let vram = memfd();
        let ino = identity(vram.as_fd());
        link.set_partition(0, OFFSET + VRAM, vram.try_clone().unwrap());
        assert!(!handle.is_requested());
        // The daemon goes away while the job runs: the job is told to stop.
        gone.send(()).unwrap();
        first.join().unwrap();
        let t0 = Instant::now();
        while !handle.is_requested() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the job was not stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(link.lost().is_none(), "waiting, not lost");
        // The stopped job's end is reported to nobody.
        link.release(
            t,
            RunOutcome::Preempted,
            Duration::from_micros(5),
            (1, 2),
            true,
        );
        // The next instance: the claim names the first one and the partition, with the object.
        let socket2 = socket.clone();
        let second = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let l = Listener::bind(&socket2).unwrap();
            let c = accept(&l);
            let Some((ToDaemon::Hello(h), Some(fd))) = next(&c) else {
                panic!("expected a claim with the VRAM object")
            };
            let r = h.resume.clone().expect("a claim");
            assert_eq!(
                (r.boot.as_str(), r.vm, r.gpu, r.vram_offset, h.vram),
                ("aa", 3, 0, OFFSET + VRAM, VRAM)
            );
            assert_eq!(identity(fd.as_fd()), ino);
            send(&c, &welcome_at("bb", OFFSET + VRAM), Some(fd.as_fd()));
            // The job (preempted at the loss) asks again; the same seq is a new grant here.
            let Some((ToDaemon::Want { kernel }, None)) = next(&c) else {
                panic!("expected a want")
            };
            assert_eq!(kernel, Some(7));
            send(
                &c,
                &ToVm::Grant {
                    seq: 1,
                    slice_ns: 0,
                    deadline_ns: 0,
                },
                None,
            );
            let Some((ToDaemon::Done { seq: 1, more, .. }, _)) = next(&c) else {
                panic!("expected done")
            };
            assert!(!more);
            assert!(matches!(next(&c), Some((ToDaemon::Bye {}, _))));
        });
        let t = link.acquire(&handle, Some(7)).unwrap();
        assert!(!handle.is_requested(), "a fresh grant");
        link.release(
            t,
            RunOutcome::Completed,
            Duration::from_micros(5),
            (3, 4),
            false,
        );
        drop(link);
        second.join().unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn no_daemon_within_reconnect_ms_or_a_refused_claim_is_the_gpu_lost() {
        let d = dir("lost");
        let socket = d.join("sock");
        // Nobody comes back: lost after the bound.
        let (gone, first) = first_instance(&socket, memfd());
        let link1 = link(socket.clone(), 300);
        let handle = PreemptHandle::new();
        let t = link1.acquire(&handle, None).unwrap();
        gone.send(()).unwrap();
        first.join().unwrap();
        let t0 = Instant::now();
        link1.release(t, RunOutcome::Completed, Duration::ZERO, (0, 0), true);
        match link1.acquire(&handle, None) {
            Err(HostError::Lost(m)) => assert!(m.contains("did not come back"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
        drop(link1);
        // The next instance refuses the claim: lost at once, with its reason.
        let (gone, first) = first_instance(&socket, memfd());
        let link2 = link(socket.clone(), 30_000);
        let t = link2.acquire(&handle, None).unwrap();
        gone.send(()).unwrap();
        first.join().unwrap();
        let s2 = socket.clone();
        let second = std::thread::spawn(move || {
            let l = Listener::bind(&s2).unwrap();
            let c = accept(&l);
            assert!(matches!(next(&c), Some((ToDaemon::Hello(_), Some(_)))));
            let refusal = ToVm::Error {
                message: "re-registration refused: a conflicting claim".into(),
                fatal: true,
            };
            send(&c, &refusal, None);
        });
        let t0 = Instant::now();
        link2.release(t, RunOutcome::Completed, Duration::ZERO, (0, 0), false);
        match link2.acquire(&handle, None) {
            Err(HostError::Lost(m)) => assert!(m.contains("conflicting claim"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
        second.join().unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }
}
