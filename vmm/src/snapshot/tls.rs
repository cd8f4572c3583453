//! Mutual TLS for `tls:HOST:PORT` migration streams (docs/snapshot.md, "Migration"): the
//! certificate files ([`TlsFiles`], read with a size bound and checked into a [`Identity`]),
//! the rustls configurations of both sides (TLS 1.3 only, the `ring` provider, no session
//! resumption, ALPN `vgpu-vmm-migration/1`), and the handshake under a deadline.
//!
//! Each side gives its certificate chain, its private key and the CA certificate(s) it trusts
//! for the peer. The source (client) checks the destination's certificate against its CA and
//! against HOST (a DNS name or an IP address in the certificate's subjectAltName); the
//! destination (server) requires a client certificate issued by its CA. Once its handshake is
//! done the destination sends [`ACCEPTED`]; the source reads it before it sends anything, so a
//! source whose certificate the destination refused (TLS 1.3 verifies the client's certificate
//! after the client's side of the handshake is over) learns it before any state goes out and
//! before its VM pauses. Above this layer the stream's frames are unchanged.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::RootCertStore;
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};
use serde::{Deserialize, Serialize};

/// The application protocol both sides name (and check) in the handshake.
pub const ALPN: &[u8] = b"vgpu-vmm-migration/1";
/// What the destination sends once it has accepted the source's certificate.
pub const ACCEPTED: &[u8; 8] = b"VGPUTLS1";
/// Longest certificate, key or CA file read.
pub const MAX_FILE: u64 = 1 << 20;
/// How long the destination gives a connection to finish its handshake.
pub const SERVER_HANDSHAKE: Duration = Duration::from_secs(10);
/// How long the source waits for the destination's handshake and [`ACCEPTED`] (longer than
/// [`SERVER_HANDSHAKE`]: the destination may be finishing another connection's first).
pub const CLIENT_HANDSHAKE: Duration = Duration::from_secs(30);

/// Errors reading the files, building a configuration or shaking hands.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {err}", path.display())]
    Read { path: PathBuf, err: io::Error },
    #[error("{}: more than {MAX_FILE} bytes", .0.display())]
    TooLarge(PathBuf),
    #[error("{}: not PEM: {err}", path.display())]
    Pem {
        path: PathBuf,
        err: rustls::pki_types::pem::Error,
    },
    #[error("{}: no {what} in it (PEM expected)", path.display())]
    Missing { path: PathBuf, what: &'static str },
    #[error("{}: a CA certificate rustls refuses: {err}", path.display())]
    Ca { path: PathBuf, err: rustls::Error },
    #[error("{0} must be an absolute path")]
    Relative(PathBuf),
    #[error("the certificate and key: {0}")]
    Config(rustls::Error),
    #[error("the CA: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("{0:?} is not a DNS name or IP address a certificate can name")]
    Name(String),
    #[error("TLS handshake with {peer}: {err}")]
    Handshake { peer: String, err: io::Error },
    #[error("TLS handshake with {peer}: no answer within {}s", .limit.as_secs())]
    Timeout { peer: String, limit: Duration },
    #[error(
        "TLS handshake with {peer}: the peer did not agree on {:?}",
        String::from_utf8_lossy(ALPN)
    )]
    Alpn { peer: String },
    #[error("TLS handshake with {peer}: the destination sent {got:?}, not its acceptance")]
    NotAccepted { peer: String, got: Vec<u8> },
    #[error("TLS handshake with {peer}: the destination refused this side's certificate: {err}")]
    Refused { peer: String, err: io::Error },
}

/// The three files of one side (absolute paths in API requests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// This side's certificate chain (PEM; the end-entity certificate first).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA certificate(s) (PEM) the peer's certificate must chain to.
    pub ca: PathBuf,
}

/// A side's certificate chain, key and trusted CAs, read and checked.
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, TlsError> {
    let err = |err| TlsError::Read {
        path: path.to_owned(),
        err,
    };
    let f = std::fs::File::open(path).map_err(err)?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE + 1).read_to_end(&mut bytes).map_err(err)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(TlsError::TooLarge(path.to_owned()));
    }
    Ok(bytes)
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_bounded(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| TlsError::Pem {
            path: path.to_owned(),
            err,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Missing {
            path: path.to_owned(),
            what: "CERTIFICATE",
        });
    }
    Ok(certs)
}

/// The provider: `ring` (builds with a C compiler only: no cmake or nasm).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsFiles {
    /// Refuses relative paths (the VM reads them in its own directory).
    pub fn check_absolute(&self) -> Result<(), TlsError> {
        for p in [&self.cert, &self.key, &self.ca] {
            if !p.is_absolute() {
                return Err(TlsError::Relative(p.clone()));
            }
        }
        Ok(())
    }

    /// The same files with absolute paths (resolved in this process's directory).
    pub fn absolute(self) -> io::Result<Self> {
        Ok(TlsFiles {
            cert: std::path::absolute(self.cert)?,
            key: std::path::absolute(self.key)?,
            ca: std::path::absolute(self.ca)?,
        })
    }

    /// Reads and parses the three files (each at most [`MAX_FILE`] bytes).
    pub fn load(&self) -> Result<Identity, TlsError> {
        let chain = certificates(&self.cert)?;
        let key =
            PrivateKeyDer::from_pem_slice(&read_bounded(&self.key)?).map_err(|err| match err {
                rustls::pki_types::pem::Error::NoItemsFound => TlsError::Missing {
                    path: self.key.clone(),
                    what: "PRIVATE KEY",
                },
                err => TlsError::Pem {
                    path: self.key.clone(),
                    err,
                },
            })?;
        let mut roots = RootCertStore::empty();
        for c in certificates(&self.ca)? {
            roots.add(c).map_err(|err| TlsError::Ca {
                path: self.ca.clone(),
                err,
            })?;
        }
        Ok(Identity {
            chain,
            key,
            roots: Arc::new(roots),
        })
    }

    /// Reads the files and builds both sides' configurations: what the VM checks at start,
    /// so that a bad file is a usage error then rather than a failed migration later.
    pub fn check(&self) -> Result<(), TlsError> {
        let id = self.load()?;
        id.client()?;
        id.server()?;
        Ok(())
    }
}

impl Identity {
    /// The source's configuration: the destination must chain to the CA and name the host.
    pub fn client(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let mut c = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Config)?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(TlsError::Config)?;
        c.alpn_protocols = vec![ALPN.to_vec()];
        c.resumption = Resumption::disabled();
        Ok(Arc::new(c))
    }

    /// The destination's configuration: a client certificate that chains to the CA is
    /// required.
    pub fn server(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider()).build()?;
        let mut c = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Config)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(TlsError::Config)?;
        c.alpn_protocols = vec![ALPN.to_vec()];
        c.session_storage = Arc::new(NoServerSessionStorage {});
        c.send_tls13_tickets = 0;
        Ok(Arc::new(c))
    }
}

/// The name the source checks the destination's certificate against: HOST of
/// `tls:HOST:PORT`, brackets of an IPv6 address removed.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(bare.to_owned()).map_err(|_| TlsError::Name(host.into()))
}

/// Bytes read from the socket at a time (rustls asks for 4 KiB at most: a buffer in between
/// saves most read calls of a bulk transfer).
const READ_BUFFER: usize = 256 << 10;

/// A TLS connection over TCP, readable and writable like the socket. Bounded: rustls buffers
/// at most 64 KiB of unsent data and one record of received data, the socket's reads go
/// through a buffer of [`READ_BUFFER`] bytes, and each `write` is sent before it returns.
#[derive(Debug)]
pub struct TlsStream {
    conn: Connection,
    sock: io::BufReader<TcpStream>,
}

impl TlsStream {
    fn new(conn: Connection, sock: TcpStream) -> Self {
        TlsStream {
            conn,
            sock: io::BufReader::with_capacity(READ_BUFFER, sock),
        }
    }

    pub fn socket(&self) -> &TcpStream {
        self.sock.get_ref()
    }

    /// Reads what has arrived, waiting at most `wait` for a whole record: `None` if no
    /// plaintext came in time (a record cut short stays buffered for the next read).
    pub fn try_read(&mut self, buf: &mut [u8], wait: Duration) -> io::Result<Option<usize>> {
        use std::os::fd::AsRawFd;
        let deadline = Instant::now() + wait;
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if self.sock.buffer().is_empty()
                && !super::transport::readable(self.socket().as_raw_fd(), left)?
            {
                return Ok(None);
            }
            // Readable (or buffered): one read of the socket at most, which does not block.
            self.send()?;
            self.receive()?;
        }
    }

    /// Writes out what rustls has queued (records, alerts).
    fn send(&mut self) -> io::Result<()> {
        let mut out: &TcpStream = self.sock.get_ref();
        while self.conn.wants_write() {
            if self.conn.write_tls(&mut out)? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// Reads what the socket has and processes it; 0 at the peer's end of stream. A record
    /// rustls refuses (or an alert from the peer) is an error, after rustls's own alert is
    /// sent.
    fn receive(&mut self) -> io::Result<usize> {
        let n = self.conn.read_tls(&mut self.sock)?;
        if let Err(e) = self.conn.process_new_packets() {
            let _ = self.send();
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        Ok(n)
    }

    /// Completes the handshake by `deadline`, then checks the protocol name both sides gave.
    fn handshake(&mut self, peer: &str, limit: Duration) -> Result<(), TlsError> {
        let deadline = Instant::now() + limit;
        let err = |err: io::Error| match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => TlsError::Timeout {
                peer: peer.into(),
                limit,
            },
            _ => TlsError::Handshake {
                peer: peer.into(),
                err,
            },
        };
        while self.conn.is_handshaking() {
            self.until(deadline).map_err(err)?;
            self.send().map_err(err)?;
            if !self.conn.is_handshaking() {
                break;
            }
            if !self.conn.wants_read() || self.receive().map_err(err)? == 0 {
                return Err(err(io::ErrorKind::UnexpectedEof.into()));
            }
        }
        self.send().map_err(err)?;
        if self.conn.alpn_protocol() != Some(ALPN) {
            return Err(TlsError::Alpn { peer: peer.into() });
        }
        Ok(())
    }

    /// Sets the socket's timeouts to what is left until `deadline` (an error once past it).
    fn until(&self, deadline: Instant) -> io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.socket().set_read_timeout(Some(left))?;
        self.socket().set_write_timeout(Some(left))
    }

    /// The source's side: handshake, then the destination's [`ACCEPTED`], within
    /// [`CLIENT_HANDSHAKE`]. `peer` names the destination in errors.
    pub fn connect(
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
        sock: TcpStream,
        peer: &str,
    ) -> Result<Self, TlsError> {
        let conn = ClientConnection::new(config, name).map_err(|e| TlsError::Handshake {
            peer: peer.into(),
            err: io::Error::other(e),
        })?;
        let mut s = TlsStream::new(conn.into(), sock);
        let deadline = Instant::now() + CLIENT_HANDSHAKE;
        s.handshake(peer, CLIENT_HANDSHAKE)?;
        let mut got = [0u8; ACCEPTED.len()];
        let read = s.until(deadline).and_then(|()| s.read_exact(&mut got));
        match read {
            Ok(()) if &got == ACCEPTED => Ok(s),
            Ok(()) => Err(TlsError::NotAccepted {
                peer: peer.into(),
                got: got.to_vec(),
            }),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(TlsError::Timeout {
                    peer: peer.into(),
                    limit: CLIENT_HANDSHAKE,
                })
            }
            Err(err) => Err(TlsError::Refused {
                peer: peer.into(),
                err,
            }),
        }
    }

    /// The destination's side: handshake within `limit` (the source's certificate checked in
    /// it), then [`ACCEPTED`].
    pub fn accept(
        config: Arc<ServerConfig>,
        sock: TcpStream,
        peer: &str,
        limit: Duration,
    ) -> Result<Self, TlsError> {
        let conn = ServerConnection::new(config).map_err(|e| TlsError::Handshake {
            peer: peer.into(),
            err: io::Error::other(e),
        })?;
        let mut s = TlsStream::new(conn.into(), sock);
        s.handshake(peer, limit)?;
        s.write_all(ACCEPTED)
            .and_then(|()| s.flush())
            .map_err(|err| TlsError::Handshake {
                peer: peer.into(),
                err,
            })?;
        Ok(s)
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(buf) {
                // Ok(0): the peer's close_notify.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // Nothing decrypted yet: read more records (an end of stream without close_notify
            // makes the reader's next answer UnexpectedEof).
            self.send()?;
            self.receive()?;
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send()?;
        let n = self.conn.writer().write(buf)?;
        self.send()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.conn.writer().flush()?;
        self.send()
    }
}

impl Drop for TlsStream {
    /// Ends the session with close_notify (best effort, at most a second).
    fn drop(&mut self) {
        self.conn.send_close_notify();
        let _ = self
            .socket()
            .set_write_timeout(Some(Duration::from_secs(1)));
        let _ = self.send();
    }
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
