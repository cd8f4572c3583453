//! Stop-and-copy migration over a unix socket: the snapshot sent as a stream instead of a
//! directory. The source (`ctl SOCKET migrate DEST`) pauses its VM and sends frames, each
//! `u32 kind, u64 length, payload`: the manifest (JSON), the state file, RAM runs (`u64`
//! offset in the RAM file's layout, then whole pages, at most 1 MiB), and an end frame with
//! the number of pages sent. The destination (`--incoming DEST`) reads them into an in-memory
//! RAM file (memfd), checks everything as `--restore` does, builds the VM and answers `ok`
//! once it is about to run (or `error: ...`); the source then exits, or resumes on failure.
//! Every frame is checked against fixed limits and the manifest before it is used.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap};

use super::format::MAX_STATE_BYTES;
use super::load::{self, LoadError, Loaded};
use super::manifest::{MAX_MANIFEST, Manifest, ManifestError};
use super::ram::{self, Backing, RamError, RamSaved};

const MANIFEST: u32 = 1;
const STATE: u32 = 2;
const RAM: u32 = 3;
const END: u32 = 4;
/// Largest RAM frame: an offset and 1 MiB of pages.
const MAX_RAM_FRAME: u64 = 8 + (1 << 20);
/// How long either side waits for the other.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Errors of a migration stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("migration stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("migration stream: {0}")]
    Protocol(String),
    #[error("migration stream: {0}")]
    Manifest(#[from] ManifestError),
    #[error("migration stream: {0}")]
    Load(#[from] LoadError),
    #[error("migration stream: {0}")]
    Ram(#[from] RamError),
    #[error("the destination refused the VM: {0}")]
    Refused(String),
}

fn bad(s: impl Into<String>) -> StreamError {
    StreamError::Protocol(s.into())
}

fn frame(out: &mut dyn Write, kind: u32, parts: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.write_all(&kind.to_le_bytes())?;
    out.write_all(&(len as u64).to_le_bytes())?;
    for p in parts {
        out.write_all(p)?;
    }
    Ok(())
}

/// Source side: sends the VM (paused, its state captured) and waits for the answer.
pub fn send(
    conn: &UnixStream,
    mut manifest: Manifest,
    state: &[u8],
    mem: &GuestMemoryMmap,
    backing: Backing,
) -> Result<RamSaved, StreamError> {
    conn.set_write_timeout(Some(PATIENCE))?;
    conn.set_read_timeout(Some(PATIENCE))?;
    manifest.state_bytes = state.len() as u64;
    manifest.state_crc32 = crc32fast::hash(state);
    manifest.ram_bytes = mem.iter().map(vm_memory::GuestMemoryRegion::len).sum();
    // The page count is not known before the walk: the end frame carries it.
    manifest.ram_pages = 0;
    let text = serde_json::to_vec(&manifest).map_err(|e| bad(e.to_string()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, conn);
    frame(&mut out, MANIFEST, &[&text])?;
    frame(&mut out, STATE, &[state])?;
    let saved = ram::for_each_run(mem, backing, &mut |off, bytes| {
        frame(&mut out, RAM, &[&off.to_le_bytes(), bytes]).map_err(|err| RamError::Io {
            what: "send RAM",
            err,
        })
    })?;
    frame(&mut out, END, &[&saved.pages.to_le_bytes()])?;
    out.flush()?;
    drop(out);
    let mut answer = Vec::new();
    BufReader::new(conn.take(4096)).read_until(b'\n', &mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    match answer.trim_end() {
        "ok" => Ok(saved),
        "" => Err(StreamError::Refused(
            "the destination closed the connection".into(),
        )),
        other => Err(StreamError::Refused(
            other.strip_prefix("error: ").unwrap_or(other).to_owned(),
        )),
    }
}

fn read_header(r: &mut dyn Read) -> Result<(u32, u64), StreamError> {
    let mut h = [0u8; 12];
    r.read_exact(&mut h)?;
    let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let len = u64::from_le_bytes(h[4..12].try_into().map_err(|_| bad("header"))?);
    Ok((kind, len))
}

fn read_payload(r: &mut dyn Read, len: u64, max: u64, what: &str) -> Result<Vec<u8>, StreamError> {
    if len > max {
        return Err(bad(format!(
            "{what} of {len} bytes, at most {max} accepted"
        )));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

fn memfd(len: u64) -> std::io::Result<File> {
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"vgpu-vmm-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new file descriptor that nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len)?;
    Ok(f)
}

/// Destination side: reads a VM from `conn` and checks it (as `--restore` checks a directory).
pub fn receive(conn: &UnixStream) -> Result<Loaded, StreamError> {
    conn.set_read_timeout(Some(PATIENCE))?;
    let mut r = BufReader::with_capacity(1 << 20, conn);
    let (kind, len) = read_header(&mut r)?;
    if kind != MANIFEST {
        return Err(bad(format!("frame {kind} where the manifest was due")));
    }
    let text = read_payload(&mut r, len, MAX_MANIFEST, "manifest")?;
    let manifest = Manifest::parse(&text)?;
    let (kind, len) = read_header(&mut r)?;
    if kind != STATE {
        return Err(bad(format!("frame {kind} where the state was due")));
    }
    let state = read_payload(&mut r, len, MAX_STATE_BYTES, "state")?;
    let ram_file = memfd(manifest.ram_bytes)?;
    let mut pages = 0u64;
    let mut buf = Vec::new();
    loop {
        let (kind, len) = read_header(&mut r)?;
        match kind {
            RAM => {
                if !(8 + 4096..=MAX_RAM_FRAME).contains(&len) || (len - 8) % 4096 != 0 {
                    return Err(bad(format!("RAM frame of {len} bytes")));
                }
                let mut off = [0u8; 8];
                r.read_exact(&mut off)?;
                let off = u64::from_le_bytes(off);
                let n = len - 8;
                if off % 4096 != 0 || off.checked_add(n).is_none_or(|e| e > manifest.ram_bytes) {
                    return Err(bad(format!(
                        "RAM frame at {off:#x} (+{n:#x}) outside the {} bytes of RAM",
                        manifest.ram_bytes
                    )));
                }
                buf.resize(n as usize, 0);
                r.read_exact(&mut buf)?;
                ram_file.write_all_at(&buf, off)?;
                pages += n / 4096;
            }
            END => {
                let p = read_payload(&mut r, len, 8, "end frame")?;
                let sent = u64::from_le_bytes(p.try_into().map_err(|_| bad("end frame"))?);
                if sent != pages {
                    return Err(bad(format!(
                        "{pages} pages received, the source sent {sent}"
                    )));
                }
                break;
            }
            other => return Err(bad(format!("frame {other} in the RAM"))),
        }
    }
    let mut manifest = manifest;
    manifest.ram_pages = pages;
    Ok(load::check(manifest, &state, ram_file)?)
}

/// Destination side: tells the source the VM is about to run, or why it will not.
pub fn answer(conn: &mut UnixStream, result: Result<(), String>) {
    let line = match result {
        Ok(()) => "ok\n".to_owned(),
        Err(e) => format!("error: {}\n", e.replace('\n', " ")),
    };
    if let Err(e) = conn.write_all(line.as_bytes()) {
        log::warn!("migration: answer the source: {e}");
    }
}
