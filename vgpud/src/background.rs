//! The daemon on a thread of the calling process: for tests and for tools that embed it (the
//! VM processes are still separate processes that connect to its socket).

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::{Daemon, DaemonConfig, DaemonError, Report};

/// A running daemon; `stop` ends it and returns its report.
pub struct Background {
    stop: UnixStream,
    thread: JoinHandle<Result<Report, DaemonError>>,
    socket: PathBuf,
}

impl Background {
    /// Binds the socket (so clients can connect as soon as this returns) and runs the loop on
    /// a new thread.
    pub fn start(cfg: DaemonConfig) -> Result<Self, DaemonError> {
        let socket = cfg.socket.clone();
        let mut daemon = Daemon::new(cfg)?;
        let (rx, stop) = UnixStream::pair().map_err(DaemonError::Poll)?;
        let thread = std::thread::Builder::new()
            .name("vgpud".into())
            .spawn(move || daemon.run(rx.as_fd()))
            .map_err(DaemonError::Poll)?;
        Ok(Background {
            stop,
            thread,
            socket,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops the loop (messages already received are handled first) and returns the report.
    pub fn stop(self) -> Result<Report, DaemonError> {
        drop(self.stop);
        self.thread.join().unwrap_or_else(|_| {
            Err(DaemonError::Poll(std::io::Error::other(
                "daemon thread panicked",
            )))
        })
    }
}
