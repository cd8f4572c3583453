//! Migration over a unix socket, loopback TCP or mutual TLS ([`super::transport`]; the frames
//! are the same on each): the snapshot sent as a stream instead of a directory. The source
//! (`ctl SOCKET migrate DEST`) sends frames, each `u32 kind, u64 length, payload`: the
//! manifest (JSON), RAM runs (`u64` offset in the RAM file's layout, then whole pages, at most
//! 1 MiB; a later run of a page overwrites an earlier one, which is how pre-copy rounds resend
//! pages the running guest dirtied), VRAM runs of a live migration's pre-copy rounds, the
//! state file (its vCPUs paused by then), the GPU image, and an end frame with the number of
//! RAM and VRAM pages sent. The destination (`--incoming DEST`, or a standby told `incoming
//! DEST`: [`Destination`]) reads them into an in-memory
//! RAM file (memfd), checks everything as `--restore` does, builds the VM and answers `ok`
//! once it is about to run (or `error: ...`); the source then exits, or resumes on failure.
//! Every frame is checked against fixed limits and the manifest before it is used.

use super::transport::Link;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap};

use super::format::MAX_STATE_BYTES;
use super::incoming::{Early, EarlyReady, EngineSource, IncomingReport};
use super::load::{self, LoadError, Loaded};
use super::manifest::{MAX_MANIFEST, Manifest, ManifestError};
use super::precopy::{Readiness, Sink};
use super::ram::{self, Backing, RamError};
use super::ready::DestMsg;

const MANIFEST: u32 = 1;
const STATE: u32 = 2;
const RAM: u32 = 3;
const END: u32 = 4;
const GPU: u32 = 5;
const VRAM: u32 = 6;
/// The source waits for the destination's ready line (no payload; sent only to a destination
/// that said `ready/1 hello`, [`super::ready`]).
const WAIT: u32 = 7;
/// Largest GPU frame: 1 MiB of the GPU image.
const MAX_GPU_FRAME: u64 = 1 << 20;
/// Largest RAM frame: an offset and 1 MiB of pages.
const MAX_RAM_FRAME: u64 = 8 + (1 << 20);
/// Largest VRAM frame: round, page and 1 MiB of pages.
const MAX_VRAM_FRAME: u64 = 12 + (1 << 20);
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
    #[error("migration stream: the virtual GPU: {0}")]
    Gpu(#[from] vgpu::snapshot::SnapshotError),
    #[error("the destination refused the VM: {0}")]
    Refused(String),
    #[error("{0}")]
    NotAdmitted(String),
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

/// Source side of a stream: frames in the order manifest, RAM runs (any number, later ones
/// overwrite earlier ones), state, end.
pub struct Sender<'a> {
    out: std::io::BufWriter<&'a Link>,
    conn: &'a Link,
    /// RAM pages sent so far (resends included).
    pub pages: u64,
    /// VRAM pages sent so far by pre-copy rounds (resends included).
    pub vram_pages: u64,
    /// The destination's lines ([`super::ready`]), when the manifest asked for them.
    ready: Option<ReadyState>,
}

/// What the source heard of the destination's readiness.
#[derive(Debug, Default)]
struct ReadyState {
    inbox: super::ready::Inbox,
    hello: bool,
    wait_sent: bool,
    ready: Option<(bool, u64)>,
}

impl<'a> Sender<'a> {
    /// Starts a stream with `manifest` (its state and page fields are not used). With VRAM
    /// pre-copy (`gpu_live`) it asks the destination to say when its engine is ready.
    pub fn start(conn: &'a Link, manifest: &Manifest) -> Result<Self, StreamError> {
        conn.set_write_timeout(Some(PATIENCE))?;
        conn.set_read_timeout(Some(PATIENCE))?;
        let mut manifest = manifest.clone();
        let ready = manifest.gpu_live.then(|| {
            manifest.vmm_version = super::ready::asking(&manifest.vmm_version);
            ReadyState::default()
        });
        let text = serde_json::to_vec(&manifest).map_err(|e| bad(e.to_string()))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, conn);
        frame(&mut out, MANIFEST, &[&text])?;
        Ok(Sender {
            out,
            conn,
            pages: 0,
            vram_pages: 0,
            ready,
        })
    }

    fn run(&mut self, off: u64, bytes: &[u8]) -> Result<(), RamError> {
        self.pages += bytes.len() as u64 / 4096;
        frame(&mut self.out, RAM, &[&off.to_le_bytes(), bytes]).map_err(|err| RamError::Io {
            what: "send RAM",
            err,
        })
    }

    /// Sends every touched non-zero page (the vCPUs paused).
    pub fn all_ram(&mut self, mem: &GuestMemoryMmap, backing: Backing) -> Result<(), StreamError> {
        ram::for_each_run(mem, backing, &mut |off, bytes| self.run(off, bytes))?;
        Ok(())
    }

    /// Sends the state, the GPU's image (written by `gpu`, the device paused) and the end
    /// frame and waits for the destination's answer.
    pub fn finish(
        mut self,
        state: &[u8],
        gpu: Option<&mut GpuWriter<'_>>,
    ) -> Result<u64, StreamError> {
        frame(&mut self.out, STATE, &[state])?;
        if let Some(gpu) = gpu {
            let mut w = GpuFrames {
                out: &mut self.out,
                buf: Vec::with_capacity(MAX_GPU_FRAME as usize),
            };
            gpu(&mut w)?;
            w.emit()?;
        }
        frame(
            &mut self.out,
            END,
            &[&self.pages.to_le_bytes(), &self.vram_pages.to_le_bytes()],
        )?;
        self.out.flush()?;
        let conn = self.conn;
        drop(self.out);
        let mut answer = Vec::new();
        let early = self.ready.as_ref().map_or(&[][..], |r| r.inbox.rest());
        BufReader::new(early.chain(conn.take(4096))).read_until(b'\n', &mut answer)?;
        let answer = String::from_utf8_lossy(&answer);
        match answer.trim_end() {
            "ok" => Ok(self.pages),
            "" => Err(StreamError::Refused(
                "the destination closed the connection".into(),
            )),
            other => Err(StreamError::Refused(
                other.strip_prefix("error: ").unwrap_or(other).to_owned(),
            )),
        }
    }
}

/// Writes the GPU's image (e.g. `Vgpu::save`, or a live pre-copy's `save_delta`).
pub type GpuWriter<'a> =
    dyn FnMut(&mut dyn Write) -> Result<(), vgpu::snapshot::SnapshotError> + 'a;

impl Sink for Sender<'_> {
    fn ram(&mut self, off: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.pages += bytes.len() as u64 / 4096;
        frame(&mut self.out, RAM, &[&off.to_le_bytes(), bytes])
    }

    fn vram(&mut self, round: u32, page: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.vram_pages += bytes.len() as u64 / 4096;
        frame(
            &mut self.out,
            VRAM,
            &[&round.to_le_bytes(), &page.to_le_bytes(), bytes],
        )
    }

    /// The destination's lines so far (the rounds flushed to it first); once it said `hello`,
    /// one `WAIT` frame tells it the source waits (so that it answers without more frames).
    fn readiness(&mut self, wait: Duration) -> std::io::Result<Readiness> {
        use super::ready::DestMsg;
        let Some(r) = &mut self.ready else {
            return Ok(Readiness::NotAsked);
        };
        self.out.flush()?;
        let deadline = std::time::Instant::now() + wait;
        loop {
            if let Some((prepared, engine_us)) = r.ready {
                return Ok(Readiness::Ready {
                    prepared,
                    engine_us,
                });
            }
            if r.hello && !r.wait_sent {
                frame(&mut self.out, WAIT, &[])?;
                self.out.flush()?;
                r.wait_sent = true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match r.inbox.poll(self.conn, left) {
                Ok(None) => return Ok(Readiness::Waiting { hello: r.hello }),
                Ok(Some(DestMsg::Hello)) if !r.hello => r.hello = true,
                Ok(Some(DestMsg::Ready {
                    prepared,
                    engine_us,
                })) if r.hello => r.ready = Some((prepared, engine_us)),
                Ok(Some(DestMsg::Refused(e))) => {
                    return Err(std::io::Error::other(format!(
                        "the destination refused the VM: {e}"
                    )));
                }
                Ok(Some(m)) => {
                    return Err(std::io::Error::other(format!(
                        "destination's line {m:?} out of order"
                    )));
                }
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
    }
}

/// Cuts the GPU image into GPU frames of at most [`MAX_GPU_FRAME`] bytes.
struct GpuFrames<'a, W: Write> {
    out: &'a mut W,
    buf: Vec<u8>,
}

impl<W: Write> GpuFrames<'_, W> {
    fn emit(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            frame(self.out, GPU, &[&self.buf])?;
            self.buf.clear();
        }
        Ok(())
    }
}

impl<W: Write> Write for GpuFrames<'_, W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(MAX_GPU_FRAME as usize - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == MAX_GPU_FRAME as usize {
            self.emit()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The manifest a stream starts with: `manifest` with the RAM size of `mem`, state and page
/// fields zero (the state's length and CRC-32 are checked from its frame, the page count from
/// the end frame).
pub fn stream_manifest(mut manifest: Manifest, mem: &GuestMemoryMmap) -> Manifest {
    manifest.ram_bytes = mem.iter().map(vm_memory::GuestMemoryRegion::len).sum();
    manifest.ram_pages = 0;
    manifest.state_bytes = 0;
    manifest.state_crc32 = 0;
    manifest.gpu_bytes = 0;
    manifest.gpu_crc32 = 0;
    manifest
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

fn memfd(name: &std::ffi::CStr, len: u64) -> std::io::Result<File> {
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new file descriptor that nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len)?;
    Ok(f)
}

/// What takes a received VM: a VM made for it (`--incoming`, [`NewVm`]) or a standby's
/// prepared one (`crate::standby::incoming`).
pub trait Destination {
    /// Checks the manifest before anything else is received; an error refuses the VM (the
    /// source is answered `error: ...` and nothing of the destination has changed).
    fn admit(&mut self, manifest: &Manifest) -> Result<(), String>;
    /// The engine the pre-copied VRAM of a live GPU migration (`spec`: the manifest's GPU) is
    /// written into while the rounds arrive; `None`: it is made after the switch-over.
    fn engine(&mut self, spec: &str) -> Option<EngineSource>;
}

/// `--incoming`: a VM made for the stream, its GPU's engine made during the rounds from the
/// manifest's GPU and the destination's `--gpu` (its backend and daemon).
#[derive(Debug, Clone, Copy)]
pub struct NewVm<'a>(pub Option<&'a vgpu::GpuConfig>);

impl Destination for NewVm<'_> {
    fn admit(&mut self, _: &Manifest) -> Result<(), String> {
        Ok(())
    }

    /// A configuration the build would refuse is refused there, with its own error.
    fn engine(&mut self, spec: &str) -> Option<EngineSource> {
        super::gpu::restore_config(spec, self.0)
            .ok()
            .map(EngineSource::Make)
    }
}

/// Destination side: reads a VM from `conn` and checks it (as `--restore` checks a directory).
/// `given`: the destination's `--gpu` (its backend and daemon), with which the GPU's engine
/// of a live migration is made while the pre-copy rounds arrive ([`super::incoming`]).
pub fn receive(conn: &Link, given: Option<&vgpu::GpuConfig>) -> Result<Loaded, StreamError> {
    receive_into(conn, &mut NewVm(given))
}

/// [`receive`] for `dest`: its [`Destination::admit`] checks the manifest first (a refusal is
/// [`StreamError::NotAdmitted`], answered to the source at once), its engine takes the rounds.
pub fn receive_into(conn: &Link, dest: &mut dyn Destination) -> Result<Loaded, StreamError> {
    conn.set_read_timeout(Some(PATIENCE))?;
    // The header and manifest within PATIENCE in all (`paced`), the rest per read.
    let paced = super::paced::Paced::new(conn, std::time::Instant::now() + PATIENCE);
    let mut r = BufReader::with_capacity(1 << 20, paced);
    let (kind, len) = read_header(&mut r)?;
    if kind != MANIFEST {
        return Err(bad(format!("frame {kind} where the manifest was due")));
    }
    let text = read_payload(&mut r, len, MAX_MANIFEST, "manifest")?;
    let manifest = Manifest::parse(&text)?;
    r.get_ref().lift();
    if let Err(why) = dest.admit(&manifest) {
        // Said now, before the source sends its RAM: a source that reads the destination's
        // lines during the rounds stops there, one that does not finds it after its writes
        // fail ([`super::ready::refusal`]).
        let mut w = conn;
        let _ = w.write_all(super::ready::line(&DestMsg::Refused(why.clone())).as_bytes());
        let _ = w.flush();
        return Err(StreamError::NotAdmitted(why));
    }
    let ram_file = memfd(c"vgpu-vmm-ram", manifest.ram_bytes)?;
    // The GPU image, if the manifest has a GPU: appended frame by frame, bounded by its VRAM.
    let gpu_max = match &manifest.gpu {
        Some(g) => vgpu::GpuConfig::parse(g)
            .map(|c| super::manifest::max_gpu_bytes(c.vram))
            .map_err(|e| bad(format!("gpu {g:?}: {e}")))?,
        None => 0,
    };
    let gpu_file = match &manifest.gpu {
        Some(_) => Some(memfd(c"vgpu-vmm-gpu", 0)?),
        None => None,
    };
    // The pre-copied VRAM of a live migration: frames written into it, as big as the VRAM.
    let vram_size = match &manifest.gpu {
        Some(g) if manifest.gpu_live => vgpu::GpuConfig::parse(g)
            .map(|c| c.vram)
            .map_err(|e| bad(format!("gpu {g:?}: {e}")))?,
        _ => 0,
    };
    let vram_file = match vram_size {
        0 => None,
        n => Some(memfd(c"vgpu-vmm-vram", n)?),
    };
    // The engine made now and the rounds written into it as they come (a configuration the
    // build would refuse is refused there, with its own error).
    let mut early = match (&vram_file, &manifest.gpu) {
        (Some(f), Some(g)) => dest
            .engine(g)
            .and_then(|src| Early::start(src, f, Some((&ram_file, manifest.ram_bytes)))),
        _ => None,
    };
    // A source that waits for the engine (and reads the lines) asked in the manifest.
    let mut tell = Tell {
        asked: manifest.gpu_live && super::ready::asked(&manifest.vmm_version),
        told: false,
    };
    if tell.asked {
        tell.say(conn, &DestMsg::Hello)?;
        if early.is_none() {
            tell.ready(conn, EarlyReady::Failed)?;
        }
    }
    let mut report = IncomingReport::default();
    let end;
    let (mut vram_pages, mut vram_round) = (0u64, 0u32);
    let mut gpu_bytes = 0u64;
    let mut gpu_crc = crc32fast::Hasher::new();
    let mut pages = 0u64;
    let mut buf = Vec::new();
    let mut state = None;
    loop {
        if let Some(e) = early.as_ref().filter(|_| tell.asked && !tell.told) {
            tell.ready(conn, e.ready(Duration::ZERO))?;
        }
        let (kind, len) = read_header(&mut r)?;
        match kind {
            WAIT if tell.asked && len == 0 => {
                // The source waits (its rounds converged): answer once the engine is ready,
                // or give up after READY_WAIT (the source pauses anyway by then).
                if let Some(e) = early.as_ref().filter(|_| !tell.told) {
                    let got = e.ready(super::ready::READY_WAIT);
                    if got == EarlyReady::Pending {
                        log::warn!(
                            "migration: the GPU engine is not ready after {:?}",
                            super::ready::READY_WAIT
                        );
                        tell.told = true;
                    } else {
                        tell.ready(conn, got)?;
                    }
                }
            }
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
                if let Some(e) = &mut early {
                    e.note_ram(off, n);
                }
                pages += n / 4096;
            }
            VRAM => {
                let Some(f) = &vram_file else {
                    return Err(bad("a VRAM frame for a VM without VRAM pre-copy"));
                };
                if state.is_some() {
                    return Err(bad("a VRAM frame after the state"));
                }
                if !(12 + 4096..=MAX_VRAM_FRAME).contains(&len) || (len - 12) % 4096 != 0 {
                    return Err(bad(format!("VRAM frame of {len} bytes")));
                }
                let mut h = [0u8; 12];
                r.read_exact(&mut h)?;
                let round = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                let page = u64::from_le_bytes(h[4..].try_into().map_err(|_| bad("VRAM frame"))?);
                if round < vram_round {
                    return Err(bad(format!(
                        "VRAM frame of round {round} after round {vram_round}: rounds out of order"
                    )));
                }
                vram_round = round;
                let n = (len - 12) / 4096;
                if page.checked_add(n).is_none_or(|e| e > vram_size / 4096) {
                    return Err(bad(format!(
                        "VRAM frame at page {page:#x} (+{n}) outside the {} pages of VRAM",
                        vram_size / 4096
                    )));
                }
                buf.resize((n * 4096) as usize, 0);
                r.read_exact(&mut buf)?;
                f.write_all_at(&buf, page * 4096)?;
                if let Some(e) = &mut early {
                    e.note(page, n);
                }
                vram_pages += n;
            }
            GPU => {
                let Some(f) = &gpu_file else {
                    return Err(bad("a GPU frame for a VM without a GPU"));
                };
                if len == 0 || gpu_bytes.saturating_add(len) > gpu_max {
                    return Err(bad(format!(
                        "GPU frame of {len} bytes after {gpu_bytes}: the image may have at most \
                         {gpu_max}"
                    )));
                }
                let chunk = read_payload(&mut r, len, MAX_GPU_FRAME, "GPU frame")?;
                f.write_all_at(&chunk, gpu_bytes)?;
                gpu_crc.update(&chunk);
                gpu_bytes += len;
            }
            STATE if state.is_none() => {
                state = Some(read_payload(&mut r, len, MAX_STATE_BYTES, "state")?);
            }
            END => {
                if len != 16 {
                    return Err(bad(format!("end frame of {len} bytes")));
                }
                let p = read_payload(&mut r, len, 16, "end frame")?;
                let word = |i: usize| {
                    p[i..i + 8]
                        .try_into()
                        .map(u64::from_le_bytes)
                        .map_err(|_| bad("end frame"))
                };
                let (sent, vram_sent) = (word(0)?, word(8)?);
                if sent != pages || vram_sent != vram_pages {
                    return Err(bad(format!(
                        "{pages} RAM and {vram_pages} VRAM pages received, the source sent \
                         {sent} and {vram_sent}"
                    )));
                }
                end = std::time::Instant::now();
                break;
            }
            other => return Err(bad(format!("unexpected frame {other}"))),
        }
    }
    let state = state.ok_or_else(|| bad("the stream ended without the state"))?;
    let prepared = early.take().and_then(|e| e.finish(&mut report));
    report.dest_drain_ms = end.elapsed().as_secs_f64() * 1e3;
    let mut manifest = manifest;
    manifest.state_bytes = state.len() as u64;
    manifest.state_crc32 = crc32fast::hash(&state);
    manifest.ram_pages = pages.min(manifest.ram_bytes / 4096);
    let gpu = match gpu_file {
        Some(file) if gpu_bytes > 0 => {
            manifest.gpu_bytes = gpu_bytes;
            manifest.gpu_crc32 = gpu_crc.finalize();
            Some(load::GpuImage {
                file,
                bytes: manifest.gpu_bytes,
                crc32: manifest.gpu_crc32,
                vram_base: vram_file,
                prepared,
            })
        }
        _ => None,
    };
    let t = std::time::Instant::now();
    let mut loaded = load::check(manifest, &state, ram_file, gpu)?;
    report.dest_check_ms = t.elapsed().as_secs_f64() * 1e3;
    loaded.incoming = Some((report, end));
    Ok(loaded)
}

/// The destination's lines before its answer ([`super::ready`]): whether the source asked,
/// and whether the ready line went.
struct Tell {
    asked: bool,
    told: bool,
}

impl Tell {
    fn say(&mut self, conn: &Link, msg: &DestMsg) -> Result<(), StreamError> {
        let mut w = conn;
        w.write_all(super::ready::line(msg).as_bytes())?;
        w.flush()?;
        Ok(())
    }

    /// Sends the ready line for `got` unless it is still pending.
    fn ready(&mut self, conn: &Link, got: EarlyReady) -> Result<(), StreamError> {
        let msg = match got {
            EarlyReady::Pending => return Ok(()),
            EarlyReady::Ready(engine_us) => DestMsg::Ready {
                prepared: true,
                engine_us,
            },
            EarlyReady::Failed => DestMsg::Ready {
                prepared: false,
                engine_us: 0,
            },
        };
        self.say(conn, &msg)?;
        self.told = true;
        Ok(())
    }
}

/// Destination side: tells the source the VM is about to run, or why it will not.
pub fn answer(conn: &mut Link, result: Result<(), String>) {
    let line = match result {
        Ok(()) => "ok\n".to_owned(),
        Err(e) => format!("error: {}\n", e.replace('\n', " ")),
    };
    if let Err(e) = conn.write_all(line.as_bytes()) {
        log::warn!("migration: answer the source: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(gpu: Option<&str>) -> Vec<u8> {
        manifest_live(gpu, false)
    }

    fn manifest_live(gpu: Option<&str>, gpu_live: bool) -> Vec<u8> {
        let m = Manifest {
            format: super::super::manifest::FORMAT.into(),
            version: super::super::format::VERSION,
            vmm_version: "0".into(),
            memory_mib: 2,
            cpus: 1,
            boot: super::super::manifest::BootKind::BareMetal,
            image: "t".into(),
            testdev: false,
            gpu: gpu.map(str::to_owned),
            tsc_khz: 0,
            msrs: 0,
            state_bytes: 0,
            state_crc32: 0,
            ram_bytes: 2 << 20,
            ram_pages: 0,
            gpu_bytes: 0,
            gpu_crc32: 0,
            gpu_live,
            disks: Vec::new(),
        };
        serde_json::to_vec(&m).unwrap()
    }

    /// Feeds `frames` to a receiver and returns its error.
    fn refused(frames: &[(u32, Vec<u8>)]) -> String {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let b = Link::from(b);
        let mut bytes = Vec::new();
        for (kind, payload) in frames {
            frame(&mut bytes, *kind, &[payload]).unwrap();
        }
        let writer = std::thread::spawn(move || {
            let mut a = a;
            let _ = a.write_all(&bytes);
            a
        });
        let e = receive(&b, None).unwrap_err().to_string();
        drop(b);
        drop(writer.join());
        e
    }

    #[test]
    fn gpu_frames_are_bounded_and_must_match_the_manifest() {
        let e = refused(&[(MANIFEST, manifest(None)), (GPU, vec![1; 16])]);
        assert!(e.contains("a GPU frame for a VM without a GPU"), "{e}");
        // vram=2M: an image of at most 2 MiB + 6 KiB + the state limit; frames of 1 MiB.
        let e = refused(&[
            (MANIFEST, manifest(Some("vram=2M"))),
            (GPU, vec![1; (MAX_GPU_FRAME + 1) as usize]),
        ]);
        assert!(e.contains("at most 1048576 accepted"), "{e}");
        let e = refused(&[
            (MANIFEST, manifest(Some("vram=2M"))),
            (STATE, vec![0; 16]),
            (END, vec![0; 16]),
        ]);
        assert!(e.contains("gpu.bin) is missing"), "{e}");
    }

    /// A VRAM frame: round, page, `pages` pages of `fill`.
    fn vram(round: u32, page: u64, pages: usize) -> Vec<u8> {
        let mut v = round.to_le_bytes().to_vec();
        v.extend_from_slice(&page.to_le_bytes());
        v.extend(std::iter::repeat_n(7u8, pages * 4096));
        v
    }

    #[test]
    fn vram_frames_are_checked() {
        let live = || (MANIFEST, manifest_live(Some("vram=2M"), true));
        // Only for a live GPU migration.
        let e = refused(&[(MANIFEST, manifest(Some("vram=2M"))), (VRAM, vram(0, 0, 1))]);
        assert!(e.contains("without VRAM pre-copy"), "{e}");
        let e = refused(&[
            (MANIFEST, manifest_live(None, false)),
            (VRAM, vram(0, 0, 1)),
        ]);
        assert!(e.contains("without VRAM pre-copy"), "{e}");
        // A page outside the partition (2 MiB: 512 pages), at the end or wrapping.
        let e = refused(&[live(), (VRAM, vram(0, 511, 2))]);
        assert!(e.contains("outside the 512 pages of VRAM"), "{e}");
        let e = refused(&[live(), (VRAM, vram(0, u64::MAX, 1))]);
        assert!(e.contains("outside the 512 pages"), "{e}");
        // Rounds out of order.
        let e = refused(&[live(), (VRAM, vram(2, 0, 1)), (VRAM, vram(1, 1, 1))]);
        assert!(e.contains("rounds out of order"), "{e}");
        // Not whole pages, empty, too long.
        let mut odd = vram(0, 0, 1);
        odd.pop();
        let e = refused(&[live(), (VRAM, odd)]);
        assert!(e.contains("VRAM frame of"), "{e}");
        let e = refused(&[live(), (VRAM, vram(0, 0, 0))]);
        assert!(e.contains("VRAM frame of 12 bytes"), "{e}");
        let e = refused(&[live(), (VRAM, vram(0, 0, 257))]);
        assert!(e.contains("VRAM frame of"), "{e}");
        // After the state.
        let e = refused(&[live(), (STATE, vec![0; 16]), (VRAM, vram(0, 0, 1))]);
        assert!(e.contains("after the state"), "{e}");
        // Page counts must match the end frame.
        let mut end = 0u64.to_le_bytes().to_vec();
        end.extend_from_slice(&2u64.to_le_bytes());
        let e = refused(&[
            live(),
            (VRAM, vram(0, 0, 1)),
            (STATE, vec![0; 16]),
            (END, end),
        ]);
        assert!(e.contains("1 VRAM pages received"), "{e}");
        // A stream cut short inside a VRAM frame.
        let mut cut = Vec::new();
        frame(&mut cut, MANIFEST, &[&manifest_live(Some("vram=2M"), true)]).unwrap();
        frame(&mut cut, VRAM, &[&vram(0, 0, 2)]).unwrap();
        cut.truncate(cut.len() - 100);
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let b = Link::from(b);
        let w = std::thread::spawn(move || {
            let mut a = a;
            let _ = a.write_all(&cut);
        });
        let e = receive(&b, None).unwrap_err().to_string();
        drop(w.join());
        assert!(e.contains("failed to fill whole buffer"), "{e}");
    }
}

#[cfg(test)]
#[path = "stream_ready_tests.rs"]
mod ready_tests;
