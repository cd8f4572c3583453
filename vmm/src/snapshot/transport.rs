//! Where a migration stream travels (docs/snapshot.md, "Migration"): `unix:PATH` or a bare
//! path (a unix socket, bound like `--api-socket`), `tcp:HOST:PORT` on **loopback only**, or
//! `tls:HOST:PORT` on any address. Plain `tcp:` is neither encrypted nor authenticated (as
//! QEMU's and Cloud Hypervisor's plain `tcp:` migration): whoever can connect to the port can
//! send a VM (refused unless it checks out, as any stream) or, as the source, be sent one, so it
//! is limited to addresses that resolve only to loopback. `tls:` is mutual TLS ([`super::tls`]):
//! each side proves itself with a certificate from the CA the other trusts before any state is
//! read or sent; the destination keeps listening after a connection that fails its handshake.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::tls::{self, TlsError, TlsFiles, TlsStream};
use crate::api::server::{ApiError, ApiSocket};

/// How long the source tries to open a TCP connection to one address.
const CONNECT: Duration = Duration::from_secs(10);

/// Errors naming or opening an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "{0:?}: not a migration address (unix:PATH, a path, tcp:HOST:PORT on loopback, or \
         tls:HOST:PORT)"
    )]
    Syntax(String),
    #[error("{0}: a unix socket path must be absolute here")]
    Relative(String),
    #[error("{spec:?}: resolve: {err}")]
    Resolve { spec: String, err: io::Error },
    #[error(
        "{spec:?} resolves to {addr}, which is not loopback: the migration stream is neither \
         encrypted nor authenticated, so tcp: is for loopback only (reach another host with \
         tls:HOST:PORT and certificates, or through an SSH tunnel to its loopback port)"
    )]
    NotLoopback { spec: String, addr: SocketAddr },
    #[error("{spec}: {err}")]
    Io { spec: String, err: io::Error },
    #[error(transparent)]
    Unix(#[from] ApiError),
    #[error(
        "{0}: needs --tls-cert, --tls-key and --tls-ca (given to the VM at start, or to ctl \
         migrate)"
    )]
    NoTlsFiles(String),
    #[error("{0}: TLS files are for tls: addresses only")]
    TlsFilesUnused(String),
    #[error("{spec}: {err}")]
    Tls { spec: String, err: TlsError },
}

/// A parsed migration address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    /// `HOST:PORT` as given (resolved when used, to loopback addresses only).
    Tcp(String),
    /// `HOST:PORT` as given (any address; HOST is the name the destination's certificate
    /// must carry).
    Tls(String),
}

impl Endpoint {
    /// `unix:PATH`, `tcp:HOST:PORT` or `tls:HOST:PORT` (HOST may be bracketed IPv6), or a
    /// bare path.
    pub fn parse(s: &str) -> Result<Self, EndpointError> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(EndpointError::Syntax(s.into()));
            }
            return Ok(Endpoint::Unix(p.into()));
        }
        let host_port = |hp: &str| {
            let ok = hp
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            ok.then(|| hp.to_owned())
                .ok_or_else(|| EndpointError::Syntax(s.into()))
        };
        if let Some(hp) = s.strip_prefix("tcp:") {
            return host_port(hp).map(Endpoint::Tcp);
        }
        if let Some(hp) = s.strip_prefix("tls:") {
            let hp = host_port(hp)?;
            let host = hp.rsplit_once(':').map_or("", |(h, _)| h);
            tls::server_name(host).map_err(|err| EndpointError::Tls {
                spec: s.into(),
                err,
            })?;
            return Ok(Endpoint::Tls(hp));
        }
        if s.is_empty() || (s.contains(':') && !s.contains('/')) {
            // `host:port` or another scheme: not taken for a relative file name.
            return Err(EndpointError::Syntax(s.into()));
        }
        Ok(Endpoint::Unix(s.into()))
    }

    /// The same address with a relative unix path made absolute (the client side: the VM
    /// resolves paths in its own directory).
    pub fn absolute(self) -> io::Result<Self> {
        Ok(match self {
            Endpoint::Unix(p) => Endpoint::Unix(std::path::absolute(p)?),
            t => t,
        })
    }

    /// The socket addresses of a `tcp:` or `tls:` endpoint; for `tcp:` every one HOST
    /// resolves to must be loopback.
    fn resolve(&self) -> Result<Vec<SocketAddr>, EndpointError> {
        let spec = self.to_string();
        let (hp, loopback) = match self {
            Endpoint::Tcp(hp) => (hp, true),
            Endpoint::Tls(hp) => (hp, false),
            Endpoint::Unix(_) => return Err(EndpointError::Syntax(spec)),
        };
        let addrs: Vec<SocketAddr> = hp
            .to_socket_addrs()
            .map_err(|err| EndpointError::Resolve {
                spec: spec.clone(),
                err,
            })?
            .collect();
        if let Some(a) = addrs.iter().find(|a| loopback && !a.ip().is_loopback()) {
            return Err(EndpointError::NotLoopback { spec, addr: *a });
        }
        if addrs.is_empty() {
            return Err(EndpointError::Resolve {
                spec,
                err: io::Error::other("no address"),
            });
        }
        Ok(addrs)
    }

    /// `tls` read and checked for a `tls:` endpoint (where it is required); refused for the
    /// others.
    fn identity(&self, tls: Option<&TlsFiles>) -> Result<Option<tls::Identity>, EndpointError> {
        let spec = self.to_string();
        match (self, tls) {
            (Endpoint::Tls(_), Some(f)) => f
                .load()
                .map(Some)
                .map_err(|err| EndpointError::Tls { spec, err }),
            (Endpoint::Tls(_), None) => Err(EndpointError::NoTlsFiles(spec)),
            (_, Some(_)) => Err(EndpointError::TlsFilesUnused(spec)),
            (_, None) => Ok(None),
        }
    }

    fn io(&self) -> impl FnOnce(io::Error) -> EndpointError + '_ {
        move |err| EndpointError::Io {
            spec: self.to_string(),
            err,
        }
    }

    /// A TCP connection to the first address that answers (each tried for [`CONNECT`]).
    fn tcp_connect(&self) -> Result<TcpStream, EndpointError> {
        let mut last = io::Error::other("no address");
        for a in self.resolve()? {
            match TcpStream::connect_timeout(&a, CONNECT) {
                Ok(s) => {
                    // Small answers go out at once (the bulk is written through a large
                    // buffer).
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        Err(self.io()(last))
    }

    /// Connects (the source side); a `tls:` endpoint needs `tls` (read now, before the
    /// connection) and completes its handshake here, the destination's acceptance included.
    pub fn connect(&self, tls: Option<&TlsFiles>) -> Result<Link, EndpointError> {
        let id = self.identity(tls)?;
        match (self, id) {
            (Endpoint::Unix(p), _) => UnixStream::connect(p).map(Link::Unix).map_err(self.io()),
            (Endpoint::Tls(hp), Some(id)) => {
                let tls_err = |err| EndpointError::Tls {
                    spec: self.to_string(),
                    err,
                };
                let host = hp.rsplit_once(':').map_or("", |(h, _)| h);
                let name = tls::server_name(host).map_err(tls_err)?;
                let config = id.client().map_err(tls_err)?;
                let sock = self.tcp_connect()?;
                let peer = sock.peer_addr().map_or(hp.clone(), |a| a.to_string());
                let s = TlsStream::connect(config, name, sock, &peer).map_err(tls_err)?;
                Ok(Link::Tls(Box::new(Mutex::new(s))))
            }
            _ => self.tcp_connect().map(Link::Tcp),
        }
    }

    /// Binds the destination side (`--incoming`): a unix socket is checked like
    /// `--api-socket`; a tcp address must be loopback; a tls one needs `tls` (read and
    /// checked now).
    pub fn bind(&self, tls: Option<&TlsFiles>) -> Result<Incoming, EndpointError> {
        let id = self.identity(tls)?;
        match (self, id) {
            (Endpoint::Unix(p), _) => Ok(Incoming::Unix(ApiSocket::bind(p)?)),
            (_, id) => {
                let config = match id {
                    Some(id) => Some(id.server().map_err(|err| EndpointError::Tls {
                        spec: self.to_string(),
                        err,
                    })?),
                    None => None,
                };
                let l = TcpListener::bind(&self.resolve()?[..]).map_err(self.io())?;
                Ok(match config {
                    Some(config) => Incoming::Tls(l, config),
                    None => Incoming::Tcp(l),
                })
            }
        }
    }

    /// The unix socket path, if this is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Endpoint::Unix(p) => Some(p),
            Endpoint::Tcp(_) | Endpoint::Tls(_) => None,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(hp) => write!(f, "tcp:{hp}"),
            Endpoint::Tls(hp) => write!(f, "tls:{hp}"),
        }
    }
}

/// A bound `--incoming` endpoint.
pub enum Incoming {
    Unix(ApiSocket),
    Tcp(TcpListener),
    /// The listener and the destination's TLS configuration.
    Tls(TcpListener, Arc<rustls::ServerConfig>),
}

impl Incoming {
    /// Waits for one connection (a unix socket's file is removed then). On `tls:`, one whose
    /// handshake succeeds within [`tls::SERVER_HANDSHAKE`]: a connection that fails it (no
    /// certificate, one the CA did not issue, an expired one, not TLS at all) is logged and
    /// closed, and the next one is awaited.
    pub fn accept_one(self) -> io::Result<Link> {
        self.accept_within(tls::SERVER_HANDSHAKE)
    }

    /// Whether a connection is pending within `limit` (then [`Self::accept_one`] takes it);
    /// false if none came.
    pub fn pending_within(&self, limit: Duration) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Incoming::Unix(s) => s.as_raw_fd(),
            Incoming::Tcp(l) | Incoming::Tls(l, _) => l.as_raw_fd(),
        };
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if readable(fd, left)? {
                return Ok(true);
            }
            if left.is_zero() {
                return Ok(false);
            }
        }
    }

    /// Stops listening (a unix socket's file is removed).
    pub fn close(self) {
        if let Incoming::Unix(s) = self {
            s.remove();
        }
    }

    /// [`Self::accept_one`] with the handshake's time limit given.
    pub fn accept_within(self, limit: Duration) -> io::Result<Link> {
        if let Incoming::Unix(s) = self {
            return s.accept_one().map(Link::Unix);
        }
        loop {
            if let Some(link) = self.accept_attempt(limit)? {
                return Ok(link);
            }
        }
    }

    /// Takes one connection (blocking until one comes: call after [`Self::pending_within`]
    /// said one is pending). `None`: a `tls:` connection whose handshake failed within
    /// [`tls::SERVER_HANDSHAKE`], logged and closed (the listener listens on), so that a caller
    /// with a deadline of its own can go back to waiting. A unix socket's file stays until
    /// [`Self::close`].
    pub fn accept_pending(&self) -> io::Result<Option<Link>> {
        self.accept_attempt(tls::SERVER_HANDSHAKE)
    }

    fn accept_attempt(&self, limit: Duration) -> io::Result<Option<Link>> {
        match self {
            Incoming::Unix(s) => s.accept().map(|c| Some(Link::Unix(c))),
            Incoming::Tcp(l) => {
                let (s, peer) = l.accept()?;
                log::info!("migration: incoming connection from {peer}");
                let _ = s.set_nodelay(true);
                Ok(Some(Link::Tcp(s)))
            }
            Incoming::Tls(l, config) => {
                let (s, peer) = l.accept()?;
                let _ = s.set_nodelay(true);
                match TlsStream::accept(config.clone(), s, &peer.to_string(), limit) {
                    Ok(s) => {
                        log::info!("migration: TLS connection from {peer} accepted");
                        Ok(Some(Link::Tls(Box::new(Mutex::new(s)))))
                    }
                    Err(e) => {
                        log::warn!("migration: refused: {e}; still listening");
                        Ok(None)
                    }
                }
            }
        }
    }
}

/// A connected migration stream. A TLS one is behind a lock (its session state changes on
/// reads and writes, which the stream makes through shared references on one thread).
#[derive(Debug)]
pub enum Link {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<Mutex<TlsStream>>),
}

fn locked(s: &Mutex<TlsStream>) -> std::sync::MutexGuard<'_, TlsStream> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

impl From<UnixStream> for Link {
    fn from(s: UnixStream) -> Self {
        Link::Unix(s)
    }
}

impl Link {
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Link::Unix(s) => s.set_read_timeout(t),
            Link::Tcp(s) => s.set_read_timeout(t),
            Link::Tls(s) => locked(s).socket().set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Link::Unix(s) => s.set_write_timeout(t),
            Link::Tcp(s) => s.set_write_timeout(t),
            Link::Tls(s) => locked(s).socket().set_write_timeout(t),
        }
    }
}

/// Waits at most `wait` for `fd` to be readable (or at its end, or in error).
pub(super) fn readable(fd: std::os::fd::RawFd, wait: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd that lives through the call; the result is checked.
    let n = unsafe { libc::poll(&raw mut p, 1, ms) };
    match n {
        0 => Ok(false),
        n if n > 0 => Ok(true),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

impl Link {
    /// Reads what has arrived, waiting at most `wait` for something: `None` if nothing came,
    /// `Some(0)` at the peer's end of stream.
    pub fn try_read(&self, buf: &mut [u8], wait: Duration) -> io::Result<Option<usize>> {
        use std::os::fd::AsRawFd;
        match self {
            Link::Unix(s) => match readable(s.as_raw_fd(), wait)? {
                true => (&*s).read(buf).map(Some),
                false => Ok(None),
            },
            Link::Tcp(s) => match readable(s.as_raw_fd(), wait)? {
                true => (&*s).read(buf).map(Some),
                false => Ok(None),
            },
            Link::Tls(s) => locked(s).try_read(buf, wait),
        }
    }
}

impl Read for &Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Unix(s) => (&*s).read(buf),
            Link::Tcp(s) => (&*s).read(buf),
            Link::Tls(s) => locked(s).read(buf),
        }
    }
}

impl Write for &Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Unix(s) => (&*s).write(buf),
            Link::Tcp(s) => (&*s).write(buf),
            Link::Tls(s) => locked(s).write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Link::Unix(s) => (&*s).flush(),
            Link::Tcp(s) => (&*s).flush(),
            Link::Tls(s) => locked(s).flush(),
        }
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_tcp_is_loopback_only() {
        assert_eq!(
            Endpoint::parse("/tmp/in.sock").unwrap(),
            Endpoint::Unix("/tmp/in.sock".into())
        );
        assert_eq!(
            Endpoint::parse("unix:rel.sock").unwrap(),
            Endpoint::Unix("rel.sock".into())
        );
        assert_eq!(
            Endpoint::parse("rel.sock").unwrap(),
            Endpoint::Unix("rel.sock".into())
        );
        assert_eq!(
            Endpoint::parse("tcp:127.0.0.1:4444").unwrap(),
            Endpoint::Tcp("127.0.0.1:4444".into())
        );
        assert_eq!(
            Endpoint::parse("tcp:[::1]:80").unwrap(),
            Endpoint::Tcp("[::1]:80".into())
        );
        for bad in [
            "",
            "unix:",
            "tcp:",
            "tcp:host",
            "tcp::80",
            "tcp:h:99999",
            "tcp:h:x",
            "host:80",
            "ftp:x",
        ] {
            assert!(
                matches!(Endpoint::parse(bad), Err(EndpointError::Syntax(_))),
                "{bad:?}"
            );
        }
        for not_lo in ["tcp:8.8.8.8:4444", "tcp:0.0.0.0:4444", "tcp:[::]:4444"] {
            let e = Endpoint::parse(not_lo).unwrap();
            assert!(
                matches!(e.bind(None), Err(EndpointError::NotLoopback { .. })),
                "{not_lo}"
            );
            assert!(
                matches!(e.connect(None), Err(EndpointError::NotLoopback { .. })),
                "{not_lo}"
            );
        }
        assert_eq!(Endpoint::parse("unix:/a").unwrap().to_string(), "unix:/a");
    }

    #[test]
    fn a_loopback_tcp_link_carries_bytes_both_ways() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let e = Endpoint::parse(&format!("tcp:localhost:{port}")).unwrap();
        let incoming = e.bind(None).unwrap();
        let t = std::thread::spawn(move || {
            let mut c = incoming.accept_one().unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).unwrap();
            c.write_all(b"ok\n").unwrap();
            b
        });
        let mut c = e.connect(None).unwrap();
        c.write_all(b"hello").unwrap();
        let mut a = [0u8; 3];
        c.read_exact(&mut a).unwrap();
        assert_eq!(&a, b"ok\n");
        assert_eq!(&t.join().unwrap(), b"hello");
    }
}
