//! Where a migration stream travels (docs/snapshot.md, "Migration"): `unix:PATH` or a bare
//! path (a unix socket, bound like `--api-socket`), or `tcp:HOST:PORT` on **loopback only**.
//! The stream is neither encrypted nor authenticated (QEMU's and Cloud Hypervisor's plain
//! `tcp:` migration are not either): whoever can connect to the port can send a VM (refused
//! unless it checks out, as any stream) or, as the source, be sent one. So `tcp:` is limited to
//! addresses that resolve only to loopback; another host is reached through a tunnel that
//! encrypts and authenticates (e.g. `ssh -L PORT:127.0.0.1:PORT`), or a unix socket.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::server::{ApiError, ApiSocket};

/// Errors naming or opening an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("{0:?}: not a migration address (unix:PATH, a path, or tcp:HOST:PORT on loopback)")]
    Syntax(String),
    #[error("{0}: a unix socket path must be absolute here")]
    Relative(String),
    #[error("{spec:?}: resolve: {err}")]
    Resolve { spec: String, err: io::Error },
    #[error(
        "{spec:?} resolves to {addr}, which is not loopback: the migration stream is neither \
         encrypted nor authenticated, so tcp: is for loopback only (reach another host through \
         an SSH tunnel to its loopback port, or use a unix socket)"
    )]
    NotLoopback { spec: String, addr: SocketAddr },
    #[error("{spec}: {err}")]
    Io { spec: String, err: io::Error },
    #[error(transparent)]
    Unix(#[from] ApiError),
}

/// A parsed migration address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    /// `HOST:PORT` as given (resolved when used, to loopback addresses only).
    Tcp(String),
}

impl Endpoint {
    /// `unix:PATH`, `tcp:HOST:PORT` (HOST may be bracketed IPv6), or a bare path.
    pub fn parse(s: &str) -> Result<Self, EndpointError> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(EndpointError::Syntax(s.into()));
            }
            return Ok(Endpoint::Unix(p.into()));
        }
        if let Some(hp) = s.strip_prefix("tcp:") {
            let ok = hp
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(EndpointError::Syntax(s.into()));
            }
            return Ok(Endpoint::Tcp(hp.into()));
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

    /// The loopback socket addresses of a `tcp:` endpoint (every one HOST resolves to must be
    /// loopback).
    fn loopback(hp: &str) -> Result<Vec<SocketAddr>, EndpointError> {
        let spec = format!("tcp:{hp}");
        let addrs: Vec<SocketAddr> = hp
            .to_socket_addrs()
            .map_err(|err| EndpointError::Resolve {
                spec: spec.clone(),
                err,
            })?
            .collect();
        if let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback()) {
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

    /// Connects (the source side).
    pub fn connect(&self) -> Result<Link, EndpointError> {
        match self {
            Endpoint::Unix(p) => {
                UnixStream::connect(p)
                    .map(Link::Unix)
                    .map_err(|err| EndpointError::Io {
                        spec: self.to_string(),
                        err,
                    })
            }
            Endpoint::Tcp(hp) => {
                let addrs = Self::loopback(hp)?;
                let s = TcpStream::connect(&addrs[..]).map_err(|err| EndpointError::Io {
                    spec: self.to_string(),
                    err,
                })?;
                // Small answers go out at once (the bulk is written through a large buffer).
                let _ = s.set_nodelay(true);
                Ok(Link::Tcp(s))
            }
        }
    }

    /// Binds the destination side (`--incoming`): a unix socket is checked like
    /// `--api-socket`; a tcp address must be loopback.
    pub fn bind(&self) -> Result<Incoming, EndpointError> {
        match self {
            Endpoint::Unix(p) => Ok(Incoming::Unix(ApiSocket::bind(p)?)),
            Endpoint::Tcp(hp) => {
                let addrs = Self::loopback(hp)?;
                let l = TcpListener::bind(&addrs[..]).map_err(|err| EndpointError::Io {
                    spec: self.to_string(),
                    err,
                })?;
                Ok(Incoming::Tcp(l))
            }
        }
    }

    /// The unix socket path, if this is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Endpoint::Unix(p) => Some(p),
            Endpoint::Tcp(_) => None,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(hp) => write!(f, "tcp:{hp}"),
        }
    }
}

/// A bound `--incoming` endpoint.
pub enum Incoming {
    Unix(ApiSocket),
    Tcp(TcpListener),
}

impl Incoming {
    /// Waits for one connection (a unix socket's file is removed then).
    pub fn accept_one(self) -> io::Result<Link> {
        match self {
            Incoming::Unix(s) => s.accept_one().map(Link::Unix),
            Incoming::Tcp(l) => {
                let (s, peer) = l.accept()?;
                log::info!("migration: incoming connection from {peer}");
                let _ = s.set_nodelay(true);
                Ok(Link::Tcp(s))
            }
        }
    }
}

/// A connected migration stream.
#[derive(Debug)]
pub enum Link {
    Unix(UnixStream),
    Tcp(TcpStream),
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
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Link::Unix(s) => s.set_write_timeout(t),
            Link::Tcp(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for &Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Unix(s) => (&*s).read(buf),
            Link::Tcp(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Unix(s) => (&*s).write(buf),
            Link::Tcp(s) => (&*s).write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Link::Unix(s) => (&*s).flush(),
            Link::Tcp(s) => (&*s).flush(),
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
                matches!(e.bind(), Err(EndpointError::NotLoopback { .. })),
                "{not_lo}"
            );
            assert!(
                matches!(e.connect(), Err(EndpointError::NotLoopback { .. })),
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
        let incoming = e.bind().unwrap();
        let t = std::thread::spawn(move || {
            let mut c = incoming.accept_one().unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).unwrap();
            c.write_all(b"ok\n").unwrap();
            b
        });
        let mut c = e.connect().unwrap();
        c.write_all(b"hello").unwrap();
        let mut a = [0u8; 3];
        c.read_exact(&mut a).unwrap();
        assert_eq!(&a, b"ok\n");
        assert_eq!(&t.join().unwrap(), b"hello");
    }
}
