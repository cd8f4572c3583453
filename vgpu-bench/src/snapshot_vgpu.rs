//! The device-level part of `vgpu-bench snapshot`: a whole virtual GPU (`vgpu::Vgpu`) on the
//! engine whose partition `snapshot_vram` filled, paused (drained: no job runs) and saved with
//! `Vgpu::save_report` to host memory, with `Vgpu::save_file` to a file (lanes writing at
//! offsets, fsync included) and, for comparison, through a `BufWriter` of the file (one
//! writer); then restored into a fresh device on the same engine with `Vgpu::restore` from
//! memory, `Vgpu::restore_file` (lanes reading at offsets) and `Vgpu::restore` through a
//! `BufReader` (the snapshot framing, checksum and validation included: what `ctl snapshot`
//! and `--restore` pay for the GPU image). The file's own ceiling: the same bytes written from
//! memory by as many threads at offsets plus fsync, and read back (`file_*`).

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmio::pci::MsiMessage;
use pgpu::{Engine, EngineSnapshot};
use vgpu::{GpuConfig, IrqSink, Vgpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::error::BenchError;
use crate::snapshot_vram::{Filled, verify};

struct NoIrq;

impl IrqSink for NoIrq {
    fn msi(&self, _: MsiMessage) {}
    fn intx(&self, _: bool) {}
}

fn dev_err(what: &str) -> impl Fn(String) -> BenchError + '_ {
    move |e| BenchError::Invalid(format!("{what}: {e}"))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Guest RAM for the devices (no guest runs: only its registration matters): 16 MiB the engine
/// allocates (`alloc_host_region`, the form a cuda engine can map, as the VMM does), kept for
/// the life of the engine.
pub struct Ram {
    ram: GuestMemoryMmap,
    regions: Vec<pgpu::HostRegionId>,
}

impl Ram {
    pub fn new(e: &dyn Engine) -> Result<Ram, BenchError> {
        use vm_memory::mmap::{GuestRegionMmap, MmapRegion};
        const LEN: usize = 16 << 20;
        let bad = |m: String| BenchError::Invalid(format!("guest RAM: {m}"));
        let (id, ptr) = e.alloc_host_region(LEN as u64)?;
        // SAFETY: `ptr` is a readable and writable mapping of LEN bytes that the engine keeps
        // until the region is unregistered (never, before the engine goes); a raw region is
        // never unmapped by vm-memory.
        let region = unsafe {
            MmapRegion::build_raw(
                ptr.as_ptr(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .map_err(|e| bad(e.to_string()))?;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or_else(|| bad("region overflows".into()))?;
        let ram = GuestMemoryMmap::from_regions(vec![region]).map_err(|e| bad(e.to_string()))?;
        Ok(Ram {
            ram,
            regions: vec![id],
        })
    }
}

/// The timings of one repetition.
#[derive(Debug, Clone, Default)]
pub struct Times {
    pub save_mem: Duration,
    pub save_file_fsync: Duration,
    pub save_stream_fsync: Duration,
    pub restore_mem: Duration,
    pub restore_file: Duration,
    pub restore_stream: Duration,
    /// The same bytes written from memory at offsets by several threads, fsync included.
    pub file_write_fsync: Duration,
    /// And read back into memory by several threads (page cache warm).
    pub file_read: Duration,
    /// Bytes of the image.
    pub image_bytes: u64,
    /// Bytes of VRAM in it.
    pub vram_bytes: u64,
}

fn device(cfg: &GpuConfig, e: &Arc<dyn EngineSnapshot>, ram: &Ram) -> Result<Vgpu, BenchError> {
    Vgpu::with_engine(
        cfg.clone(),
        e.clone(),
        ram.ram.clone(),
        ram.regions.clone(),
        Arc::new(NoIrq),
        None,
    )
    .map_err(|e| dev_err("device")(e.to_string()))
}

/// One repetition; `snap` is reused between repetitions (its pages stay touched), `file` is a
/// path in the out directory this run created.
pub fn repetition(
    cfg: &GpuConfig,
    e: &Arc<dyn EngineSnapshot>,
    ram: &Ram,
    f: &Filled,
    snap: &mut Vec<u8>,
    file: &Path,
    check: bool,
) -> Result<Times, BenchError> {
    let mut t = Times::default();
    let (base, size) = (cfg.guard, cfg.vram);
    let a = device(cfg, e, ram)?;
    snap.clear();
    let s = Instant::now();
    a.pause_drained()
        .map_err(|e| dev_err("pause")(e.to_string()))?;
    let r = a
        .save_report(snap)
        .map_err(|e| dev_err("save")(e.to_string()))?;
    t.save_mem = s.elapsed();
    (t.image_bytes, t.vram_bytes) = (r.bytes, r.vram_bytes);
    if r.vram_bytes != f.bytes {
        return Err(BenchError::Check {
            workload: "snapshot".into(),
            msg: format!(
                "the image holds {} bytes of VRAM, {} written",
                r.vram_bytes, f.bytes
            ),
        });
    }
    // The new way: lanes writing at offsets, one fsync.
    let out = open_new(file)?;
    let s = Instant::now();
    let r = a
        .save_file(&out)
        .map_err(|e| dev_err("save to a file")(e.to_string()))?;
    out.sync_all().map_err(io(file))?;
    t.save_file_fsync = s.elapsed();
    drop(out);
    if r.bytes != t.image_bytes || r.crc32 != snapfmt::Crc::par_of(snap).value {
        return Err(BenchError::Check {
            workload: "snapshot".into(),
            msg: "the image saved to a file differs from the one saved to memory".into(),
        });
    }
    // The stream way (one writer), into another file (new: never someone else's).
    let stream_file = file.with_extension("stream");
    let out = File::options()
        .write(true)
        .create_new(true)
        .open(&stream_file)
        .map_err(io(&stream_file))?;
    let s = Instant::now();
    let mut w = BufWriter::with_capacity(8 << 20, out);
    let saved = a.save(&mut w);
    let synced = w
        .into_inner()
        .map_err(|e| io(&stream_file)(e.into_error()))
        .and_then(|f| f.sync_all().map_err(io(&stream_file)));
    t.save_stream_fsync = s.elapsed();
    let _ = std::fs::remove_file(&stream_file);
    saved.map_err(|e| dev_err("save through a stream")(e.to_string()))?;
    synced?;
    drop(a);

    let b = device(cfg, e, ram)?;
    let s = Instant::now();
    b.restore(&mut &snap[..])
        .map_err(|e| dev_err("restore")(e.to_string()))?;
    t.restore_mem = s.elapsed();
    drop(b);
    if check {
        verify(&**e, base, size, f, "device restore from memory")?;
    }
    let input = File::open(file).map_err(io(file))?;
    let c = device(cfg, e, ram)?;
    let s = Instant::now();
    c.restore_file(&input, Some((r.bytes, r.crc32)))
        .map_err(|e| dev_err("restore from a file")(e.to_string()))?;
    t.restore_file = s.elapsed();
    drop(c);
    if check {
        verify(&**e, base, size, f, "device restore from a file")?;
    }
    let d = device(cfg, e, ram)?;
    let mut input = BufReader::with_capacity(8 << 20, File::open(file).map_err(io(file))?);
    let s = Instant::now();
    d.restore(&mut input)
        .map_err(|e| dev_err("restore through a stream")(e.to_string()))?;
    t.restore_stream = s.elapsed();
    drop(d);
    if check {
        verify(&**e, base, size, f, "device restore through a stream")?;
    }
    (t.file_write_fsync, t.file_read) = file_ceiling(file, snap)?;
    Ok(t)
}

/// Opens `path` (made by this run) for writing, cut to zero.
fn open_new(path: &Path) -> Result<File, BenchError> {
    File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io(path))
}

/// What the file alone allows: `bytes` written at offsets by as many threads as the snapshot's
/// lanes use (4 MiB pieces) plus one fsync, then read back the same way (page cache warm).
fn file_ceiling(path: &Path, bytes: &[u8]) -> Result<(Duration, Duration), BenchError> {
    const PIECE: usize = 4 << 20;
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let out = open_new(path)?;
    let run = |f: &(dyn Fn(usize, &[u8]) -> std::io::Result<()> + Sync)| {
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| -> std::io::Result<()> {
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(p) = bytes.chunks(PIECE).nth(i) else {
                                return Ok(());
                            };
                            f(i * PIECE, p)?;
                        }
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("panic")))
            })
        })
        .map_err(io(path))
    };
    let s = Instant::now();
    run(&|at, p| out.write_all_at(p, at as u64))?;
    out.sync_all().map_err(io(path))?;
    let write = s.elapsed();
    let back: Vec<std::sync::Mutex<Vec<u8>>> = (0..threads)
        .map(|_| std::sync::Mutex::new(vec![0u8; PIECE]))
        .collect();
    let s = Instant::now();
    run(&|at, p| {
        let mut b = back[(at / PIECE) % threads]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        out.read_exact_at(&mut b[..p.len()], at as u64)
    })?;
    Ok((write, s.elapsed()))
}
