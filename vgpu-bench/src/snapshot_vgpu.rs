//! The device-level part of `vgpu-bench snapshot`: a whole virtual GPU (`vgpu::Vgpu`) on the
//! engine whose partition `snapshot_vram` filled, paused (drained: no job runs) and saved with
//! `Vgpu::save_report` to host memory and to a file (fsync included), then restored with
//! `Vgpu::restore` into a fresh device on the same engine from memory and from the file (the
//! snapshot framing, checksum and validation included: what `ctl snapshot` and `--restore`
//! pay for the GPU image).

use std::fs::File;
use std::io::{BufReader, BufWriter};
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
    pub restore_mem: Duration,
    pub restore_file: Duration,
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
    let s = Instant::now();
    let out = File::options()
        .write(true)
        .truncate(true)
        .open(file)
        .map_err(io(file))?;
    let mut w = BufWriter::with_capacity(8 << 20, out);
    a.save(&mut w)
        .map_err(|e| dev_err("save to a file")(e.to_string()))?;
    let out = w.into_inner().map_err(|e| io(file)(e.into_error()))?;
    out.sync_all().map_err(io(file))?;
    t.save_file_fsync = s.elapsed();
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
    let c = device(cfg, e, ram)?;
    let mut input = BufReader::with_capacity(8 << 20, File::open(file).map_err(io(file))?);
    let s = Instant::now();
    c.restore(&mut input)
        .map_err(|e| dev_err("restore from a file")(e.to_string()))?;
    t.restore_file = s.elapsed();
    drop(c);
    if check {
        verify(&**e, base, size, f, "device restore from a file")?;
    }
    Ok(t)
}
