//! The API socket's server: the path is checked and bound before the VM is built (a stale
//! socket is replaced; a live socket, a file, a directory or a symbolic link is refused), then
//! a thread serves one connection at a time, one request per line, until the VM ends; the
//! socket file is removed at exit.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::protocol::{MAX_LINE, Request, Response};
use crate::control::Controller;

/// How long a connection may sit idle between requests.
const IDLE: Duration = Duration::from_secs(30);

/// Errors binding the API socket (usage errors: the path is the user's to fix).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "{0}: exists and is not a socket (a file, directory or symbolic link is never replaced)"
    )]
    NotASocket(PathBuf),
    #[error("{0}: a live socket (another process accepts connections on it)")]
    InUse(PathBuf),
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

/// A bound API socket, not served yet.
#[derive(Debug)]
pub struct ApiSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ApiSocket {
    /// Checks `path` and binds it.
    pub fn bind(path: &Path) -> Result<Self, ApiError> {
        let io = |err| ApiError::Io {
            path: path.into(),
            err,
        };
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
            Ok(m) if !m.file_type().is_socket() => return Err(ApiError::NotASocket(path.into())),
            Ok(_) => {
                let stale = matches!(UnixStream::connect(path),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
                if !stale {
                    return Err(ApiError::InUse(path.into()));
                }
                std::fs::remove_file(path).map_err(io)?;
            }
        }
        let listener = UnixListener::bind(path).map_err(io)?;
        Ok(ApiSocket {
            listener,
            path: path.into(),
        })
    }

    /// Waits for one connection (a migration source on `--incoming`), then removes the socket
    /// file.
    pub fn accept_one(self) -> std::io::Result<UnixStream> {
        let r = self.listener.accept().map(|(c, _)| c);
        let _ = std::fs::remove_file(&self.path);
        r
    }

    /// Stops listening: the socket file is removed (a migration that did not come).
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// Waits for the next connection (a standby's requests, `crate::standby::serve`).
    pub fn accept(&self) -> std::io::Result<UnixStream> {
        self.listener.accept().map(|(c, _)| c)
    }

    /// Starts serving requests on `controller`.
    pub fn serve(self, controller: Arc<Controller>) -> std::io::Result<ApiServer> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            let listener = self.listener.try_clone()?;
            std::thread::Builder::new()
                .name("api".into())
                .spawn(move || accept_loop(&listener, &controller, &stop))?
        };
        Ok(ApiServer {
            socket: self,
            stop,
            thread: Some(thread),
        })
    }
}

impl std::os::fd::AsRawFd for ApiSocket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.listener.as_raw_fd()
    }
}

/// The serving thread; dropping it stops the thread and removes the socket file.
#[derive(Debug)]
pub struct ApiServer {
    socket: ApiSocket,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept. A client holding an idle connection would keep the thread
        // up to its idle limit: the VM does not wait for it (the process is ending).
        let _ = UnixStream::connect(&self.socket.path);
        let _ = std::fs::remove_file(&self.socket.path);
        if let Some(t) = self.thread.take() {
            let start = std::time::Instant::now();
            while !t.is_finished() && start.elapsed() < Duration::from_millis(200) {
                std::thread::sleep(Duration::from_millis(2));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

fn accept_loop(listener: &UnixListener, controller: &Controller, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        match conn {
            Ok(c) => {
                if let Err(e) = serve_conn(c, controller, stop) {
                    log::debug!("api: connection: {e}");
                }
            }
            Err(e) => log::warn!("api: accept: {e}"),
        }
    }
}

fn serve_conn(conn: UnixStream, controller: &Controller, stop: &AtomicBool) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IDLE))?;
    conn.set_write_timeout(Some(IDLE))?;
    let mut out = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    loop {
        let Some(line) = read_request(&mut reader, &mut out)? else {
            return Ok(());
        };
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let response = handle(&line, controller);
        write_line(&mut out, &response)?;
    }
}

/// The next request line of a connection (at most [`MAX_LINE`] bytes); `None` when the client
/// closed it, or after answering a longer line with an error (the connection is then done).
pub(crate) fn read_request(
    reader: &mut BufReader<UnixStream>,
    out: &mut UnixStream,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = reader
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() > MAX_LINE {
        let r = Response::err(format!("request longer than {MAX_LINE} bytes"));
        write_line(out, &r)?;
        return Ok(None);
    }
    Ok(Some(line))
}

/// Writes one response line.
pub(crate) fn write_line(out: &mut UnixStream, r: &Response) -> std::io::Result<()> {
    let mut text = serde_json::to_vec(r).map_err(std::io::Error::other)?;
    text.push(b'\n');
    out.write_all(&text)
}

/// Answers one request line.
pub fn handle(line: &[u8], controller: &Controller) -> Response {
    let req: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => return Response::err(format!("bad request: {e}")),
    };
    log::debug!("api: {req:?}");
    let json = |v: Result<serde_json::Value, serde_json::Error>| match v {
        Ok(v) => Response::ok(v),
        Err(e) => Response::err(e),
    };
    match req {
        Request::Pause {} => match controller.pause() {
            Ok(()) => Response::ok(serde_json::json!({"state": "paused"})),
            Err(e) => Response::err(e),
        },
        Request::Resume {} => match controller.resume() {
            Ok(()) => Response::ok(serde_json::json!({"state": "running"})),
            Err(e) => Response::err(e),
        },
        Request::Stats {} => json(serde_json::to_value(controller.stats())),
        Request::Restore { .. } => Response::err(
            "restore: this VM runs already; a snapshot is restored on request only into a VM \
             started with --standby",
        ),
        Request::Incoming { .. } => Response::err(
            "incoming: this VM runs already; a migration is taken on request only by a VM \
             started with --standby (or start one with --incoming URL)",
        ),
        Request::MoveGpu { gpu } => match controller.move_gpu(gpu) {
            Ok(done) => json(serde_json::to_value(done)),
            Err(e) => Response::err(e),
        },
        Request::Migrate { to, live, tls } => {
            use crate::snapshot::transport::{Endpoint, EndpointError};
            let to = match Endpoint::parse(&to) {
                Ok(Endpoint::Unix(p)) if !p.is_absolute() => {
                    return Response::err(format!(
                        "migrate: {}",
                        EndpointError::Relative(p.display().to_string())
                    ));
                }
                Ok(e) => e,
                Err(e) => return Response::err(format!("migrate: {e}")),
            };
            if let Some(f) = &tls
                && let Err(e) = f.check_absolute()
            {
                return Response::err(format!("migrate: tls: {e}"));
            }
            match controller.migrate(&to, live, tls.as_ref()) {
                Ok(done) => json(serde_json::to_value(done)),
                Err(e) => Response::err(e),
            }
        }
        Request::Snapshot {
            dir,
            resume,
            drain,
            live,
        } => {
            if !dir.is_absolute() {
                return Response::err("snapshot: dir must be an absolute path");
            }
            let done = if live {
                controller.snapshot_live_op(&dir, resume, drain)
            } else {
                controller.snapshot(&dir, resume, drain)
            };
            match done {
                Ok(done) => json(serde_json::to_value(done)),
                Err(e) => Response::err(e),
            }
        }
    }
}
