//! The destination of a live migration made ready during the pre-copy rounds (issue 24,
//! docs/snapshot.md "What the destination does when"): as soon as the stream's manifest names
//! a GPU whose VRAM is pre-copied, a thread makes its engine (`vgpu::Vgpu::prepare_engine`:
//! the cuda context and VRAM, or the sim engine) and writes each VRAM frame into the partition
//! after the receiver has stored it in the in-memory VRAM file, so that neither waits for the
//! other (the frames' pages are queued, the bytes read back from the file: a page resent later
//! is queued again, so the partition ends with its last bytes). At the switch-over the VM is
//! built on that engine and only the paused round's delta is applied. On cuda, whose engine
//! allocates guest RAM (pinned host memory), the thread allocates it too and copies each RAM
//! frame into it the same way, so that the switch-over neither allocates nor copies guest RAM.
//! If the engine cannot be
//! made or written, the receiver falls back to the whole pre-copied file after the switch-over
//! (as before). A standby destination (`crate::standby::incoming`) gives the thread the engine
//! it made before the migration, and its guest RAM, instead ([`EngineSource::Given`]).
//! [`IncomingReport`] is the destination's side of the downtime.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError, TrySendError};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;
use vgpu::{GpuConfig, PreparedEngine};

/// Queued frames the thread has not written yet (page, pages): 16 bytes each, so at most 1 MiB
/// queued; a receiver that gets ahead of it by more waits (a GPU slower than the link).
const QUEUE: usize = 1 << 16;
/// Pages per write into the engine (1 MiB, a VRAM frame's most).
const MAX_WRITE_PAGES: u64 = 256;

/// What the destination of a migration did and when (milliseconds; `dest_*` so that they
/// sit beside the source's figures in `vgpu-bench migrate`). Written into `--stats` as
/// `incoming` and logged at `info`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct IncomingReport {
    /// The GPU's engine was made and written during the rounds (else after the switch-over).
    pub dest_prepared: bool,
    /// Making the engine (the cuda context and VRAM), during the rounds when prepared.
    pub dest_engine_ms: f64,
    /// VRAM pages written into the engine during the rounds (resends included).
    pub dest_vram_pages_early: u64,
    /// VRAM pages of the paused round's delta written after the switch-over (without a
    /// prepared engine the whole pre-copied VRAM is written then too, not counted here).
    pub dest_vram_pages_switch: u64,
    /// From the end frame to everything received being in the engine (the thread's last
    /// writes, or the engine still being made).
    pub dest_drain_ms: f64,
    /// Checking the state and the stream's parts (as `--restore` checks a directory).
    pub dest_check_ms: f64,
    /// Building the VM: KVM, guest RAM (copied into engine memory on cuda), vCPUs, devices.
    pub dest_build_ms: f64,
    /// Of which guest RAM (its mapping, or the copy into the cuda engine's memory).
    pub dest_ram_ms: f64,
    /// Restoring the GPU: its image (registers, channels, the VRAM delta; without a prepared
    /// engine the whole pre-copied VRAM too) and the guest's modules loaded (JIT on cuda).
    pub dest_gpu_restore_ms: f64,
    /// Devices, VM and vCPU state put back (besides the GPU).
    pub dest_state_ms: f64,
    /// From the end frame to the vCPUs started and the source told `ok`: the destination's
    /// part of the downtime.
    pub dest_switch_ms: f64,
    /// Migrated into a standby (`ctl SOCKET incoming URL`): how long preparing it took (KVM
    /// VM, RAM, the engine and its template), before the migration; its engine was given to
    /// the rounds, so `dest_engine_ms` is only the wait for the thread to start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dest_standby_prepared_ms: Option<f64>,
}

/// The engine a migration's destination made during the rounds, and what it did.
#[derive(Debug)]
pub struct Prepared {
    pub engine: PreparedEngine,
    /// Every received VRAM page is in the engine's partition.
    pub vram_applied: bool,
    /// Guest RAM allocated from the (cuda) engine, region by region in the layout's order
    /// (host region, address, bytes), holding every received RAM page.
    pub ram: Vec<(pgpu::HostRegionId, usize, u64)>,
}

/// What the thread hands back.
struct Done {
    engine: PreparedEngine,
    pages: u64,
    engine_ms: f64,
    ram: Vec<HostRam>,
}

/// A guest RAM region allocated from the engine: its host region, address, length and offset
/// in the RAM file's layout.
#[derive(Debug, Clone, Copy)]
struct HostRam {
    id: pgpu::HostRegionId,
    addr: usize,
    len: u64,
    off: u64,
}

/// What the receiver queues for the thread.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// VRAM pages (first page, pages) of the partition.
    Vram(u64, u64),
    /// RAM bytes (offset in the RAM file's layout, bytes).
    Ram(u64, u64),
}

/// The thread making the engine and writing the VRAM frames into it.
pub struct Early {
    tx: Option<SyncSender<Work>>,
    thread: Option<JoinHandle<Result<Done, String>>>,
    /// The thread stopped early (its error comes with `finish`).
    stopped: bool,
    /// The engine's making time (µs), sent once it is made and its queue was empty.
    ready: Receiver<u64>,
}

/// Whether the thread's engine is ready ([`Early::ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyReady {
    /// Still being made, or writing what was queued before.
    Pending,
    /// Made (in this many µs), with every page queued until then written into it.
    Ready(u64),
    /// It failed: the engine is made after the switch-over.
    Failed,
}

/// The engine the pre-copy rounds are written into.
pub enum EngineSource {
    /// Made now, on the thread, for this configuration (the manifest's GPU with the
    /// destination's `--gpu` backend and daemon): `--incoming`. On cuda the thread allocates
    /// guest RAM from it too.
    Make(GpuConfig),
    /// Made before the migration (a standby's, `crate::standby`), for this configuration,
    /// with the guest RAM it backs already (cuda: host region, address, bytes, in the
    /// layout's order; empty on sim, whose RAM is the received file mapped after the
    /// switch-over).
    Given(
        GpuConfig,
        PreparedEngine,
        Vec<(pgpu::HostRegionId, usize, u64)>,
    ),
}

impl std::fmt::Debug for EngineSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineSource::Make(c) => write!(f, "Make({})", c.spec()),
            EngineSource::Given(c, e, _) => write!(f, "Given({}, {e:?})", c.spec()),
        }
    }
}

impl Early {
    /// Starts a thread that makes (or takes, [`EngineSource`]) the engine and writes queued
    /// pages of `vram` (the in-memory file of the pre-copied partition) into it. `None` where
    /// the engine cannot come first. With `ram` (the in-memory RAM file and its size) on cuda,
    /// queued RAM runs are copied into the engine's guest RAM as well (allocated by the
    /// thread when it makes the engine).
    pub fn start(source: EngineSource, vram: &File, ram: Option<(&File, u64)>) -> Option<Early> {
        let cfg = match &source {
            EngineSource::Make(cfg) | EngineSource::Given(cfg, ..) => cfg,
        };
        if let EngineSource::Make(cfg) = &source
            && (cfg.mode == vgpu::config::Mode::Pt
                || (cfg.backend == vgpu::config::Backend::Sim && cfg.host.is_some()))
        {
            return None;
        }
        let ram = ram.filter(|_| cfg.backend == vgpu::config::Backend::Cuda);
        let files = vram.try_clone().and_then(|v| {
            let r = ram
                .map(|(f, n)| f.try_clone().map(|f| (f, n)))
                .transpose()?;
            Ok((v, r))
        });
        let (file, ram) = match files {
            Ok(f) => f,
            Err(e) => {
                log::warn!("migration: prepare the GPU: {e}");
                return None;
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("incoming-gpu".into())
            .spawn(move || run(source, &file, ram.as_ref(), &rx, ready_tx));
        match thread {
            Ok(t) => Some(Early {
                tx: Some(tx),
                thread: Some(t),
                stopped: false,
                ready,
            }),
            Err(e) => {
                log::warn!("migration: prepare the GPU: {e}");
                None
            }
        }
    }

    /// Whether the engine is made and has written everything queued so far, waiting at most
    /// `wait` for it.
    pub fn ready(&self, wait: std::time::Duration) -> EarlyReady {
        let got = if wait.is_zero() {
            self.ready
                .try_recv()
                .map_err(|e| e == TryRecvError::Disconnected)
        } else {
            self.ready
                .recv_timeout(wait)
                .map_err(|e| e == RecvTimeoutError::Disconnected)
        };
        match got {
            Ok(us) => EarlyReady::Ready(us),
            Err(true) => EarlyReady::Failed,
            Err(false) => EarlyReady::Pending,
        }
    }

    /// Queues `pages` pages from partition page `page` (stored in the VRAM file already).
    pub fn note(&mut self, page: u64, pages: u64) {
        self.queue(Work::Vram(page, pages));
    }

    /// Queues `len` bytes of RAM at `off` (stored in the RAM file already).
    pub fn note_ram(&mut self, off: u64, len: u64) {
        self.queue(Work::Ram(off, len));
    }

    fn queue(&mut self, w: Work) {
        if self.stopped {
            return;
        }
        let Some(tx) = &self.tx else { return };
        let sent = match tx.try_send(w) {
            Err(TrySendError::Full(v)) => tx.send(v).map_err(|_| ()),
            Err(TrySendError::Disconnected(_)) => Err(()),
            Ok(()) => Ok(()),
        };
        if sent.is_err() {
            // The thread ended with an error: `finish` reports it, the fallback takes over.
            self.stopped = true;
        }
    }

    /// Waits for the thread's last writes: the engine with every queued page in it, into
    /// `report`; `None` (logged) if it could not be made or written.
    pub fn finish(mut self, report: &mut IncomingReport) -> Option<Prepared> {
        self.tx = None;
        let done = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Ok(d))) => d,
            Some(Ok(Err(e))) => {
                log::warn!(
                    "migration: the GPU engine made during the rounds failed ({e}); it is made \
                     again after the switch-over"
                );
                return None;
            }
            Some(Err(_)) | None => {
                log::warn!("migration: the thread preparing the GPU panicked");
                return None;
            }
        };
        report.dest_prepared = true;
        report.dest_engine_ms = done.engine_ms;
        report.dest_vram_pages_early = done.pages;
        Some(Prepared {
            engine: done.engine,
            vram_applied: true,
            ram: done.ram.iter().map(|r| (r.id, r.addr, r.len)).collect(),
        })
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: makes the engine (and guest RAM from it, with `ram`) or takes the one given,
/// then writes each queued run read back from `file` (or the RAM file).
fn run(
    source: EngineSource,
    file: &File,
    ram: Option<&(File, u64)>,
    rx: &Receiver<Work>,
    ready: Sender<u64>,
) -> Result<Done, String> {
    let t = Instant::now();
    let (cfg, engine, host) = match source {
        EngineSource::Make(cfg) => {
            let engine = vgpu::Vgpu::prepare_engine(&cfg)
                .map_err(|e| e.to_string())?
                .ok_or("this GPU's engine is made with its device")?;
            let host = match ram {
                Some((_, bytes)) => alloc_ram(&engine, *bytes)?,
                None => Vec::new(),
            };
            (cfg, engine, host)
        }
        EngineSource::Given(cfg, engine, regions) => {
            let mut off = 0;
            let host = regions
                .into_iter()
                .map(|(id, addr, len)| {
                    let r = HostRam { id, addr, len, off };
                    off += len;
                    r
                })
                .collect();
            (cfg, engine, host)
        }
    };
    let cfg = &cfg;
    let engine_ms = t.elapsed().as_secs_f64() * 1e3;
    log::debug!("migration: GPU engine ready for the rounds in {engine_ms:.1} ms");
    let mut buf = vec![0u8; (MAX_WRITE_PAGES * 4096) as usize];
    let mut pages = 0u64;
    let mut ready = Some(ready);
    loop {
        let w = match rx.try_recv() {
            Ok(w) => w,
            Err(TryRecvError::Empty) => {
                // Everything queued so far is written: ready (said once).
                if let Some(r) = ready.take() {
                    let _ = r.send((engine_ms * 1e3) as u64);
                }
                match rx.recv() {
                    Ok(w) => w,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match (w, ram) {
            (Work::Vram(page, n), _) => {
                write_run(&engine, cfg, file, &mut buf, page, n)?;
                pages += n;
            }
            (Work::Ram(off, len), Some((f, _))) => copy_ram(&host, f, off, len)?,
            (Work::Ram(..), None) => {}
        }
    }
    Ok(Done {
        engine,
        pages,
        engine_ms,
        ram: host,
    })
}

/// Guest RAM of `bytes` allocated from `engine`, region by region in the layout's order.
fn alloc_ram(engine: &PreparedEngine, bytes: u64) -> Result<Vec<HostRam>, String> {
    let mut host = Vec::new();
    let mut off = 0;
    for (_, len) in crate::layout::ram_regions(bytes) {
        let (id, ptr) = engine
            .engine()
            .alloc_host_region(len)
            .map_err(|e| format!("guest RAM from the engine: {e}"))?;
        host.push(HostRam {
            id,
            addr: ptr.as_ptr() as usize,
            len,
            off,
        });
        off += len;
    }
    Ok(host)
}

/// Copies `len` bytes at `off` of the RAM file into the engine's guest RAM regions `host`.
fn copy_ram(host: &[HostRam], f: &File, off: u64, len: u64) -> Result<(), String> {
    let end = off.checked_add(len).ok_or("RAM run wraps")?;
    for r in host {
        let (s, e) = (off.max(r.off), end.min(r.off + r.len));
        if s >= e {
            continue;
        }
        // SAFETY: `r` is a host region of `r.len` bytes the engine allocated for guest RAM and
        // keeps alive with itself (owned by this thread until it hands both over; a standby's
        // are its guest RAM, registered with KVM but with no vCPU thread, device or other
        // writer until the switch-over, after this thread ended); this thread's writes are the
        // only access; the range is inside.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                (r.addr as *mut u8).add((s - r.off) as usize),
                (e - s) as usize,
            )
        };
        f.read_exact_at(dst, s)
            .map_err(|e| format!("read the received RAM: {e}"))?;
    }
    Ok(())
}

/// Writes pages `page..page + n` of `file` into the partition (checked against it).
fn write_run(
    engine: &PreparedEngine,
    cfg: &GpuConfig,
    file: &File,
    buf: &mut [u8],
    page: u64,
    n: u64,
) -> Result<(), String> {
    let mut p = page;
    let end = page.checked_add(n).ok_or("page range wraps")?;
    while p < end {
        let k = (end - p).min(MAX_WRITE_PAGES);
        let bytes = &mut buf[..(k * 4096) as usize];
        file.read_exact_at(bytes, p * 4096)
            .map_err(|e| format!("read the pre-copied VRAM: {e}"))?;
        engine
            .write_partition(cfg, p * 4096, bytes)
            .map_err(|e| e.to_string())?;
        p += k;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn memfd(len: u64) -> File {
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor nobody else owns.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn queued_pages_reach_the_engine_with_their_last_bytes() {
        let cfg = GpuConfig::parse("vram=4M").unwrap();
        let file = memfd(cfg.vram);
        let mut early =
            Early::start(EngineSource::Make(cfg.clone()), &file, None).expect("a sim engine");
        file.write_all_at(&[1; 8192], 3 * 4096).unwrap();
        early.note(3, 2);
        // Page 4 sent again by a later round.
        file.write_all_at(&[2; 4096], 4 * 4096).unwrap();
        early.note(4, 1);
        let mut report = IncomingReport::default();
        let p = early.finish(&mut report).expect("prepared");
        assert!(p.vram_applied && report.dest_prepared);
        assert_eq!(report.dest_vram_pages_early, 3);
        let mut b = vec![0u8; 8192];
        p.engine
            .engine()
            .vram_read(cfg.partition_base() + 3 * 4096, &mut b)
            .unwrap();
        assert_eq!(&b[..4096], &[1; 4096][..]);
        assert_eq!(&b[4096..], &[2; 4096][..]);
    }

    /// A standby's engine, given: the pages land in it, and the same engine comes back.
    #[test]
    fn a_given_engine_takes_the_pages_and_comes_back() {
        let cfg = GpuConfig::parse("vram=4M").unwrap();
        let file = memfd(cfg.vram);
        let engine = vgpu::Vgpu::prepare_engine(&cfg).unwrap().unwrap();
        let PreparedEngine::Sim(sim) = &engine else {
            panic!("{engine:?}")
        };
        let sim = sim.clone();
        let source = EngineSource::Given(cfg.clone(), engine, Vec::new());
        let mut early = Early::start(source, &file, None).expect("started");
        assert!(matches!(
            early.ready(std::time::Duration::from_secs(5)),
            EarlyReady::Ready(_)
        ));
        file.write_all_at(&[5; 4096], 7 * 4096).unwrap();
        early.note(7, 1);
        let mut report = IncomingReport::default();
        let p = early.finish(&mut report).expect("prepared");
        assert_eq!(report.dest_vram_pages_early, 1);
        let PreparedEngine::Sim(back) = &p.engine else {
            panic!()
        };
        assert!(Arc::ptr_eq(back, &sim), "another engine came back");
        let mut b = vec![0u8; 4096];
        p.engine
            .engine()
            .vram_read(cfg.partition_base() + 7 * 4096, &mut b)
            .unwrap();
        assert_eq!(b, vec![5; 4096]);
    }

    /// The cuda path's RAM copy (the engine's host regions stood in for by two buffers): a run
    /// across the two regions lands in both, at the layout's offsets; a wrapping run is refused.
    #[test]
    fn ram_runs_land_in_the_regions_at_their_offsets() {
        let mut low = vec![0u8; 8192];
        let mut high = vec![0u8; 8192];
        let host = [
            HostRam {
                id: pgpu::HostRegionId(1),
                addr: low.as_mut_ptr() as usize,
                len: 8192,
                off: 0,
            },
            HostRam {
                id: pgpu::HostRegionId(2),
                addr: high.as_mut_ptr() as usize,
                len: 8192,
                off: 8192,
            },
        ];
        let file = memfd(16384);
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8 + 1).collect();
        file.write_all_at(&data, 4096).unwrap();
        copy_ram(&host, &file, 4096, 8192).unwrap();
        assert_eq!(&low[..4096], &[0; 4096][..]);
        assert_eq!(&low[4096..], &data[..4096]);
        assert_eq!(&high[..4096], &data[4096..]);
        assert_eq!(&high[4096..], &[0; 4096][..]);
        assert!(copy_ram(&host, &file, u64::MAX - 10, 4096).is_err());
    }

    #[test]
    fn a_page_outside_the_partition_stops_the_thread_and_falls_back() {
        // The receiver checks frames against the partition first; the thread checks again.
        let cfg = GpuConfig::parse("vram=4M").unwrap();
        let file = memfd(cfg.vram);
        let mut early = Early::start(EngineSource::Make(cfg.clone()), &file, None).unwrap();
        early.note(1023, 2);
        early.note(u64::MAX, 2);
        let mut report = IncomingReport::default();
        assert!(early.finish(&mut report).is_none());
        assert!(!report.dest_prepared);
        // Shared sim GPUs (the daemon's VRAM) are not prepared.
        let shared = GpuConfig::parse("vram=4M,host=/x.sock").unwrap();
        assert!(Early::start(EngineSource::Make(shared), &file, None).is_none());
    }
}
