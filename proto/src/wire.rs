//! Unix `SOCK_SEQPACKET` sockets for the protocol: message boundaries kept by the kernel, a
//! file descriptor passed with `SCM_RIGHTS` (the VRAM memory object), the peer's pid from
//! `SO_PEERCRED`. std's `UnixStream` is a byte stream and passes no descriptors, hence libc.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Errors of socket operations.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("socket path {0:?} is too long")]
    PathTooLong(std::path::PathBuf),
    #[error("{op}: {err}")]
    Os { op: &'static str, err: io::Error },
    #[error("socket {0:?} is in use (something listens on it)")]
    InUse(std::path::PathBuf),
    #[error("{0:?} exists and is not a socket (left as it is)")]
    NotASocket(std::path::PathBuf),
    #[error("message truncated (longer than {0} bytes)")]
    Truncated(usize),
}

fn os(op: &'static str) -> WireError {
    WireError::Os {
        op,
        err: io::Error::last_os_error(),
    }
}

fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), WireError> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(WireError::PathTooLong(path.into()));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn socket(nonblocking: bool) -> Result<OwnedFd, WireError> {
    let mut ty = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, ty, 0) };
    if fd < 0 {
        return Err(os("socket"));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A listening socket (non-blocking accept).
pub struct Listener {
    fd: OwnedFd,
    path: std::path::PathBuf,
    /// A stale socket was at the path: whoever listened there went away without removing it
    /// (a daemon killed or crashed; a clean exit removes its socket).
    replaced_stale: bool,
}

impl Listener {
    /// Binds and listens at `path`. A stale socket file (nobody accepting) is replaced; a live
    /// one is an error.
    /// Something already at `path` is removed only if it is a stale socket (nobody accepts
    /// connections on it); a live socket, a regular file, a directory or a symbolic link is
    /// refused.
    pub fn bind(path: &Path) -> Result<Self, WireError> {
        use std::os::unix::fs::FileTypeExt;
        let mut replaced_stale = false;
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(WireError::Os {
                    op: "inspect the socket path",
                    err,
                });
            }
            Ok(m) if !m.file_type().is_socket() => {
                return Err(WireError::NotASocket(path.into()));
            }
            Ok(_) => {
                // A stream socket refuses a seqpacket connection with EPROTOTYPE: in use too.
                let stale = match std::os::unix::net::UnixStream::connect(path) {
                    Err(e) => e.kind() == io::ErrorKind::ConnectionRefused,
                    Ok(_) => false,
                };
                if !stale {
                    return Err(WireError::InUse(path.into()));
                }
                replaced_stale = true;
            }
        }
        // A stale socket is replaced by a rename over it, not removed first: the path names a
        // socket at every moment, so a VM that connects meanwhile (a restart's re-registration
        // or a VM starting) is refused by the old one and retries, rather than finding no file
        // (which it takes for a wrong path). Bound beside it when that name fits.
        let beside = replaced_stale
            .then(|| {
                let mut n = path.as_os_str().to_owned();
                n.push(format!(".new-{}", std::process::id()));
                std::path::PathBuf::from(n)
            })
            .filter(|b| sockaddr(b).is_ok());
        if replaced_stale && beside.is_none() {
            std::fs::remove_file(path).map_err(|err| WireError::Os {
                op: "remove the stale socket",
                err,
            })?;
        }
        let at = beside.as_deref().unwrap_or(path);
        if beside.is_some() {
            let _ = std::fs::remove_file(at);
        }
        let fd = socket(true)?;
        let (addr, len) = sockaddr(at)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } < 0 {
            return Err(os("bind"));
        }
        // SAFETY: listen on the socket we own.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
            let e = os("listen");
            if beside.is_some() {
                let _ = std::fs::remove_file(at);
            }
            return Err(e);
        }
        if beside.is_some()
            && let Err(err) = std::fs::rename(at, path)
        {
            let _ = std::fs::remove_file(at);
            return Err(WireError::Os {
                op: "rename the new socket over the stale one",
                err,
            });
        }
        Ok(Listener {
            fd,
            path: path.into(),
            replaced_stale,
        })
    }

    /// Whether `bind` replaced a stale socket (its previous listener did not exit cleanly).
    pub fn replaced_stale(&self) -> bool {
        self.replaced_stale
    }

    /// Accepts one pending connection (non-blocking); `None` when none is pending.
    pub fn accept(&self) -> Result<Option<Conn>, WireError> {
        // SAFETY: accept4 with null address pointers; the result is checked.
        let fd = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if fd < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(WireError::Os { op: "accept", err }),
            };
        }
        // SAFETY: a fresh descriptor from accept4, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Some(Conn { fd }))
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One connection.
pub struct Conn {
    fd: OwnedFd,
}

/// Whether a poller should give its core away at every look (`sched_yield`): yes while the
/// host runs no more threads than it has CPUs — then whoever shares the poller's core is
/// likely the thread it waits for (the VM on the GPU), which a spinning poller would delay by
/// its whole spin. Not on an oversubscribed host (guests that spin on their fences): a yield
/// there hands the core to a thread that keeps it until the next scheduler tick (4 ms on the
/// GPU host), and the poller sees its message that much later (measured with 64 spinning
/// guests on 16 cores: GPU utilization 18% with yields, 61% without). One read of
/// `/proc/loadavg` (runnable threads) per polling period.
pub fn polite_spin() -> bool {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    std::fs::read_to_string("/proc/loadavg").map_or(true, |s| polite_with(&s, cpus))
}

/// [`polite_spin`] for a `/proc/loadavg` text and a CPU count (unreadable: polite).
fn polite_with(loadavg: &str, cpus: usize) -> bool {
    // "0.50 0.40 0.30 R/T last-pid": R runnable threads (the caller among them) of T.
    let running = loadavg
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').next())
        .and_then(|r| r.parse::<usize>().ok());
    running.is_none_or(|r| r <= cpus)
}

/// What `recv` got.
pub enum Received {
    /// A message (and a descriptor, if one was attached).
    Message(usize, Option<OwnedFd>),
    /// The peer closed the connection.
    Closed,
    /// Non-blocking socket: nothing to read now.
    Empty,
}

impl Conn {
    /// A connected pair (socketpair(2)), for the fuzz harness and tests.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn pair() -> Result<(Conn, Conn), WireError> {
        let mut fds = [0; 2];
        let ty = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC;
        // SAFETY: socketpair writes two descriptors into `fds`; the result is checked.
        if unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, fds.as_mut_ptr()) } < 0 {
            return Err(os("socketpair"));
        }
        // SAFETY: two fresh descriptors from socketpair, owned by nobody else.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((Conn { fd: a }, Conn { fd: b }))
    }

    /// Connects (blocking socket).
    pub fn connect(path: &Path) -> Result<Self, WireError> {
        let fd = socket(false)?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) } < 0 {
            return Err(os("connect"));
        }
        Ok(Conn { fd })
    }

    /// Sends one message, with `fd` attached when given.
    pub fn send(&self, msg: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<(), WireError> {
        let mut iov = libc::iovec {
            iov_base: msg.as_ptr() as *mut libc::c_void,
            iov_len: msg.len(),
        };
        let mut cbuf = [0u64; 4];
        // SAFETY: msghdr is plain data; all zeroes is valid.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        if let Some(fd) = fd {
            let raw: RawFd = fd.as_raw_fd();
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
            hdr.msg_control = cbuf.as_mut_ptr().cast();
            hdr.msg_controllen = space;
            // SAFETY: the control buffer (32 bytes, 8-aligned) holds one cmsghdr with one int;
            // CMSG_FIRSTHDR/CMSG_DATA point inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&hdr);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), raw);
            }
        }
        loop {
            // SAFETY: `hdr` points at `iov` (our message) and the control buffer, both alive.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(WireError::Os { op: "send", err });
            }
        }
    }

    /// Receives one message into `buf`. A message longer than `buf` is an error (and is
    /// consumed); an attached descriptor is returned owned (extra ones are closed).
    pub fn recv(&self, buf: &mut [u8]) -> Result<Received, WireError> {
        self.recv_flags(buf, 0)
    }

    /// As `recv`, without blocking even on a blocking socket (`Received::Empty` if nothing).
    pub fn try_recv(&self, buf: &mut [u8]) -> Result<Received, WireError> {
        self.recv_flags(buf, libc::MSG_DONTWAIT)
    }

    /// Waits until a message (or end of file) can be read.
    pub fn wait_readable(&self) -> Result<(), WireError> {
        self.wait_readable_for(None).map(|_| ())
    }

    /// As [`Conn::wait_readable`], for at most `limit` (`None`: no limit); whether a message
    /// (or the end) can be read.
    pub fn wait_readable_for(&self, limit: Option<std::time::Duration>) -> Result<bool, WireError> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = limit.map_or(-1, |d| d.as_millis().clamp(1, i32::MAX as u128) as i32);
        loop {
            // SAFETY: one live pollfd; the timeout in milliseconds (-1: none).
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n >= 0 {
                return Ok(n > 0);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(WireError::Os { op: "poll", err });
            }
        }
    }

    /// As [`Conn::wait_readable_for`], also returning when `other` is readable (an eventfd
    /// another thread writes to wake the waiter); whether a message (or the end) can be read.
    pub fn wait_readable_or(
        &self,
        other: BorrowedFd<'_>,
        limit: Option<std::time::Duration>,
    ) -> Result<bool, WireError> {
        let mut p = [
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: other.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = limit.map_or(-1, |d| d.as_millis().clamp(1, i32::MAX as u128) as i32);
        loop {
            // SAFETY: two live pollfds; the timeout in milliseconds (-1: none).
            let n = unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
            if n >= 0 {
                return Ok(p[0].revents != 0);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(WireError::Os { op: "poll", err });
            }
        }
    }

    /// Polls (without sleeping) until a message can be read or `until` has passed; `polite`:
    /// giving the core away at every look (the caller asks [`polite_spin`]).
    pub fn spin_readable(&self, until: std::time::Instant, polite: bool) {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        while std::time::Instant::now() < until {
            // SAFETY: one live pollfd; zero timeout.
            if unsafe { libc::poll(&mut p, 1, 0) } != 0 {
                return;
            }
            // Give the core away if anything else wants it (returns at once otherwise): the
            // poller must not delay the thread it waits for — the VM running on the GPU now,
            // which may share its core (issue 25: 0.6 ms preemption tails, the length of a
            // standby, on a 16-core host).
            if polite {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn recv_flags(&self, buf: &mut [u8], flags: i32) -> Result<Received, WireError> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: msghdr is plain data; all zeroes is valid.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = cbuf.as_mut_ptr().cast();
        hdr.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = loop {
            // SAFETY: `hdr` points at `buf` and the control buffer, both alive and writable.
            let n = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut hdr,
                    libc::MSG_CMSG_CLOEXEC | flags,
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(Received::Empty),
                io::ErrorKind::ConnectionReset => return Ok(Received::Closed),
                _ => return Err(WireError::Os { op: "recv", err }),
            }
        };
        let mut fds = Vec::new();
        // SAFETY: walking the control messages the kernel wrote into our buffer; each
        // SCM_RIGHTS payload is an array of ints the kernel installed in this process, now ours.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&hdr);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    let count =
                        ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                c = libc::CMSG_NXTHDR(&hdr, c);
            }
        }
        if hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return Err(WireError::Truncated(buf.len()));
        }
        if n == 0 && fds.is_empty() {
            return Ok(Received::Closed);
        }
        Ok(Received::Message(n, fds.into_iter().next()))
    }

    /// The pid of the process at the other end (`SO_PEERCRED`, taken at connect time).
    pub fn peer_pid(&self) -> Option<i32> {
        // SAFETY: ucred is plain data.
        let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `cred`.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut cred).cast(),
                &mut len,
            )
        };
        (r == 0 && cred.pid > 0).then_some(cred.pid)
    }

    /// Shuts both directions down (the peer sees end of file; our descriptor stays valid).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on a socket we own.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_boundaries_and_carry_a_descriptor() {
        let dir = std::env::temp_dir().join(format!("vgpud-wire-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let l = Listener::bind(&path).unwrap();
        assert!(!l.replaced_stale());
        assert!(matches!(Listener::bind(&path), Err(WireError::InUse(_))));
        // The probe (a stream connect, refused by this seqpacket socket) queued nothing.
        assert!(l.accept().unwrap().is_none());
        let c = Conn::connect(&path).unwrap();
        let s = l.accept().unwrap().unwrap();
        assert_eq!(s.peer_pid(), Some(std::process::id() as i32));
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        s.send(b"one", Some(file.as_fd())).unwrap();
        s.send(b"two!", None).unwrap();
        let mut buf = [0u8; 16];
        match c.recv(&mut buf).unwrap() {
            Received::Message(3, Some(fd)) => assert!(fd.as_raw_fd() >= 0),
            _ => panic!("expected a message with a descriptor"),
        }
        assert!(matches!(
            c.recv(&mut buf).unwrap(),
            Received::Message(4, None)
        ));
        c.send(&[7u8; 32], None).unwrap();
        let mut small = [0u8; 8];
        assert!(matches!(s.recv(&mut small), Err(WireError::Truncated(8))));
        assert!(matches!(s.recv(&mut small).unwrap(), Received::Empty));
        drop(c);
        assert!(matches!(s.recv(&mut buf).unwrap(), Received::Closed));
        drop(l);
        assert!(!path.exists());
        // A socket left behind by a listener that went away (std does not remove it) is stale.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let l = Listener::bind(&path).unwrap();
        assert!(l.replaced_stale());
        drop(l);
        let _ = std::fs::remove_dir(&dir);
    }

    /// CPU time of the calling thread.
    fn thread_cpu() -> std::time::Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes into the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Pins the calling thread to `cpu`.
    fn pin(cpu: usize) {
        // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; sched_setaffinity reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                0
            );
        }
    }

    /// A poller waiting for a message (a VM told its grant is near) gives its core to a thread
    /// that shares it — there, the VM running on the GPU, which must stop on time (issue 25:
    /// 0.6 ms preemption tails, a standby's length, on a 16-core host). Both threads pinned to
    /// one core: the busy one gets most of it (a poller that only spins takes half).
    #[test]
    fn a_poller_leaves_its_core_to_a_busy_thread_beside_it() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let conn = Conn {
            fd: OwnedFd::from(a),
        };
        // SAFETY: sched_getcpu has no arguments.
        let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let busy = std::thread::spawn(move || {
            pin(cpu);
            let mut x = 0u64;
            while !s.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            thread_cpu()
        });
        let poller = std::thread::spawn(move || {
            pin(cpu);
            // Let the busy thread start first.
            std::thread::sleep(std::time::Duration::from_millis(20));
            let t0 = thread_cpu();
            let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
            conn.spin_readable(until, true);
            thread_cpu() - t0
        });
        let polled = poller.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        let worked = busy.join().unwrap();
        assert!(
            polled * 3 < worked,
            "the poller took {polled:?} of the core, the busy thread {worked:?}"
        );
    }

    /// Polite polling only while the host runs no more threads than it has CPUs.
    #[test]
    fn polite_spin_follows_the_runnable_threads() {
        assert!(polite_with("0.50 0.40 0.30 3/812 4242\n", 16));
        assert!(polite_with("0.50 0.40 0.30 16/812 4242\n", 16));
        assert!(!polite_with("64.1 60.2 30.3 70/812 4242\n", 16));
        assert!(polite_with("garbage", 16));
        assert!(polite_with("", 2));
    }
}

#[cfg(test)]
mod bind_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("vgpu-wire-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    #[test]
    fn a_stale_socket_is_replaced_by_a_rename_and_nothing_is_left_beside_it() {
        let d = dir("stale");
        let path = d.join("sock");
        // A killed daemon's socket: bound, nobody listening.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let old = std::fs::symlink_metadata(&path).unwrap().ino();
        let l = Listener::bind(&path).unwrap();
        assert!(l.replaced_stale());
        assert_ne!(std::fs::symlink_metadata(&path).unwrap().ino(), old);
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("sock")]);
        let _c = Conn::connect(&path).unwrap();
        let mut accepted = None;
        for _ in 0..1000 {
            accepted = l.accept().unwrap();
            if accepted.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(accepted.is_some());
        // A live socket is refused; a plain file is refused and kept.
        assert!(matches!(Listener::bind(&path), Err(WireError::InUse(_))));
        drop(l);
        std::fs::write(&path, b"keep").unwrap();
        assert!(matches!(
            Listener::bind(&path),
            Err(WireError::NotASocket(_))
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
        let _ = std::fs::remove_dir_all(&d);
    }
}
