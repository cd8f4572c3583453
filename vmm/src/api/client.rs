//! `vgpu-vmm ctl SOCKET OPERATION`: sends one request to a running VM's API socket and prints
//! the answer's result as JSON on stdout (an error on stderr).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{MAX_LINE, Request, Response};

/// How long the client waits for an answer (a snapshot of a large VM takes a while).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);

/// Exit code: the VM refused or failed the operation.
pub const CODE_REFUSED: u8 = 1;
/// Exit code: no VM answers on the socket, or its answer is not the protocol's.
pub const CODE_NO_VM: u8 = 3;

/// Errors talking to the VM.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{path}: {err}")]
    Connect { path: String, err: std::io::Error },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("bad answer from the VM: {0}")]
    Protocol(String),
}

/// Sends `req` to the socket at `path` and returns the answer.
pub fn call(path: &Path, req: &Request) -> Result<Response, ClientError> {
    let conn = UnixStream::connect(path).map_err(|err| ClientError::Connect {
        path: path.display().to_string(),
        err,
    })?;
    conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
    line.push(b'\n');
    (&conn).write_all(&line)?;
    let mut answer = Vec::new();
    BufReader::new(std::io::Read::take(&conn, MAX_LINE as u64)).read_until(b'\n', &mut answer)?;
    serde_json::from_slice(&answer).map_err(|e| ClientError::Protocol(e.to_string()))
}
