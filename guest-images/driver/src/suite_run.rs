//! Runs the workload suite through the driver, phase by phase: the one loop shared by the
//! bare-metal `workloads` guest and host-side baselines (vgpu-bench's native platform), so that
//! every configuration of the overhead experiment runs the same driver calls.
//!
//! Per instance: **upload** (PTX and buffers allocated, inputs written to system memory and,
//! unless buffers stay in system memory, copied into VRAM by the copy engine, waited for),
//! **kernel** (every launch in order in one submission between two timestamped semaphore
//! releases, waited for), **download** (outputs copied back and read, into CPU buffers the
//! driver keeps across workloads), the suite's check (not timed), then **free** (every
//! allocation released). Each phase gets its wall time (the platform's clock) and the driver's
//! MMIO accesses (traps, under a VMM) during it. [`open`] times the driver's initialisation
//! and the channel's creation the same way ([`Gpu::init_parts`] splits it).
//!
//! The download phase splits into [`Outcome::download_copy`] (the copy engine's copies from
//! VRAM into system memory, submitted and waited for: the device's work as the driver sees it)
//! and [`Outcome::download_read`] (the CPU reading the results out of system memory into its
//! buffers: on a guest, its own memory accesses).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use suite::Instance;

use crate::{Channel, Config, Error, Gpu, LaunchDesc, Platform, PushBuf, SysAlloc, VramAlloc};

/// Semaphore slots of the start and end timestamps around the launches.
const SLOT_START: u64 = 1;
const SLOT_END: u64 = 2;

/// Where things go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// PTX text copied into VRAM (else read by the GPU from system memory).
    pub ptx_in_vram: bool,
    /// Buffers left in system memory for the kernels to use directly (else VRAM + copies).
    pub buffers_in_sysmem: bool,
}

/// Wall time and driver MMIO accesses of one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phase {
    pub ns: u64,
    pub mmio: u64,
}

/// What one run of an instance gave.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Whether `check` accepted the outputs.
    pub ok: bool,
    /// GPU time of the launches (device TIMER between the two releases), ns.
    pub gpu_ns: u64,
    /// Driver MMIO accesses (VM exits) during the whole run, check included.
    pub exits: u64,
    pub upload: Phase,
    pub kernel: Phase,
    pub download: Phase,
    pub free: Phase,
    /// Of `download`: the copies into system memory, submitted and waited for (zero when
    /// buffers stay in system memory).
    pub download_copy: Phase,
    /// Of `download`: reading the results out of system memory (into buffers resized, i.e.
    /// zero-filled, first).
    pub download_read: Phase,
    /// Not part of any phase: the same reads once more into the same buffers, right after the
    /// download phase (no first touch of the destination left).
    pub download_reread: Phase,
    /// Why it failed, if it did.
    pub detail: String,
}

impl Outcome {
    /// Sum of the four timed phases, ns.
    pub fn total_ns(&self) -> u64 {
        self.upload.ns + self.kernel.ns + self.download.ns + self.free.ns
    }
}

/// Measures phases: clock and MMIO count at the last mark.
struct Marker {
    ns: u64,
    mmio: u64,
}

impl Marker {
    fn new<P: Platform>(gpu: &mut Gpu<P>) -> Self {
        Self {
            ns: gpu.platform().now_ns(),
            mmio: gpu.mmio_count(),
        }
    }

    /// The phase since the last mark; marks now.
    fn lap<P: Platform>(&mut self, gpu: &mut Gpu<P>) -> Phase {
        let now = Self::new(gpu);
        let p = Phase {
            ns: now.ns.saturating_sub(self.ns),
            mmio: now.mmio.saturating_sub(self.mmio),
        };
        *self = now;
        p
    }
}

/// Initialises the driver on `p` and creates channel 0; the phase covers both.
pub fn open<P: Platform>(mut p: P, cfg: Config) -> Result<(Gpu<P>, Channel, Phase), Error> {
    let t0 = p.now_ns();
    let mut gpu = Gpu::new(p, cfg)?;
    let t1 = gpu.platform().now_ns();
    let ch = gpu.create_channel(0)?;
    let t2 = gpu.platform().now_ns();
    gpu.init_parts.channel_ns = t2.saturating_sub(t1);
    let ns = t2.saturating_sub(t0);
    let mmio = gpu.mmio_count();
    Ok((gpu, ch, Phase { ns, mmio }))
}

struct Allocs {
    sys: Vec<SysAlloc>,
    vram: Vec<VramAlloc>,
}

impl Allocs {
    fn free<P: Platform>(self, gpu: &mut Gpu<P>) {
        self.sys.into_iter().for_each(|a| gpu.sys_free(a));
        self.vram.into_iter().for_each(|a| gpu.vram_free(a));
    }
}

/// Runs `inst` on channel `ch`, checks it, and frees what it allocated. Never panics: a
/// failure is `ok: false` with `detail` (after a fault the channel is recovered).
pub fn run_instance<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    inst: &Instance,
    opts: Options,
) -> Outcome {
    let start = gpu.mmio_count();
    let mut out = Outcome::default();
    let mut allocs = Allocs {
        sys: Vec::new(),
        vram: Vec::new(),
    };
    let mut mark = Marker::new(gpu);
    let r = run(gpu, ch, inst, opts, &mut allocs, &mut mark, &mut out);
    if let Err(e) = &r
        && matches!(
            e,
            Error::Fault(_) | Error::ChannelFaulted { .. } | Error::Timeout { .. }
        )
    {
        let _ = ch.recover(gpu);
    }
    let mut mark = Marker::new(gpu);
    allocs.free(gpu);
    out.free = mark.lap(gpu);
    out.exits = gpu.mmio_count().saturating_sub(start);
    match r {
        Ok(Ok(())) => out.ok = true,
        Ok(Err(msg)) => out.detail = msg,
        Err(e) => out.detail = format!("{e}"),
    }
    out
}

/// The phases; `Ok(Err(msg))` when the check refused the outputs.
fn run<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    inst: &Instance,
    opts: Options,
    allocs: &mut Allocs,
    mark: &mut Marker,
    out: &mut Outcome,
) -> Result<Result<(), String>, Error> {
    // Upload.
    let code_va = if opts.ptx_in_vram {
        let v = ch.upload_vram(gpu, inst.ptx.as_bytes())?;
        allocs.vram.push(v);
        v.va
    } else {
        let code = gpu.sys_alloc(inst.ptx.len() as u64)?;
        allocs.sys.push(code);
        gpu.sys_write(&code, 0, inst.ptx.as_bytes())?;
        code.va
    };
    let mut pb = PushBuf::new();
    let mut addrs = Vec::with_capacity(inst.buffers.len());
    let mut staging = Vec::with_capacity(inst.buffers.len());
    for b in &inst.buffers {
        let len = b.init.len() as u64;
        let s = gpu.sys_alloc(len)?;
        allocs.sys.push(s);
        if len > 0 {
            gpu.sys_write(&s, 0, &b.init)?;
        }
        if opts.buffers_in_sysmem {
            addrs.push(s.va);
        } else {
            let v = gpu.vram_alloc(len)?;
            allocs.vram.push(v);
            if len > 0 {
                pb.copy(s.va, v.va, len);
            }
            addrs.push(v.va);
        }
        staging.push(s);
    }
    submit_and_wait(gpu, ch, &mut pb)?;
    out.upload = mark.lap(gpu);

    // Kernels.
    pb.release(ch.slot_va(SLOT_START), 1, false, true);
    for l in &inst.launches {
        let entry_va = ch.stage(gpu, l.entry.as_bytes(), 8)?;
        let params = suite::layout_params(&l.params, &addrs)
            .map_err(|_| Error::BadInfo("launch parameters name a missing buffer"))?;
        let param_va = if params.is_empty() {
            0
        } else {
            ch.stage(gpu, &params, 16)?
        };
        pb.launch(&LaunchDesc {
            code_va,
            code_len: inst.ptx.len() as u32,
            entry_va,
            entry_len: l.entry.len() as u32,
            grid: l.grid,
            block: l.block,
            shared_bytes: l.shared_bytes,
            param_va,
            param_len: params.len() as u32,
        });
    }
    pb.release(ch.slot_va(SLOT_END), 1, false, true);
    submit_and_wait(gpu, ch, &mut pb)?;
    out.kernel = mark.lap(gpu);
    let t0 = ch.slot_time(gpu, SLOT_START)?;
    let t1 = ch.slot_time(gpu, SLOT_END)?;
    out.gpu_ns = t1.saturating_sub(t0);

    // Download: the copies, then the reads.
    let mut sub = Marker::new(gpu);
    if !opts.buffers_in_sysmem {
        for i in inst.read_back() {
            let len = inst.buffers[i].init.len() as u64;
            if len > 0 {
                pb.copy(addrs[i], staging[i].va, len);
            }
        }
        submit_and_wait(gpu, ch, &mut pb)?;
    }
    out.download_copy = sub.lap(gpu);
    // Into buffers kept across workloads (warm memory, as native code's reused heap).
    let mut outputs = gpu.take_readback(inst.buffers.len());
    let mut read = Ok(());
    for (i, b) in inst.buffers.iter().enumerate() {
        let o = &mut outputs[i];
        o.clear();
        o.resize(if b.read_back() { b.init.len() } else { 0 }, 0);
        if read.is_ok() {
            read = gpu.sys_read(&staging[i], 0, o);
        }
    }
    out.download_read = sub.lap(gpu);
    out.download = mark.lap(gpu);
    // Outside the phases: the same reads again into the same, now touched, buffers (tells the
    // first touch of the destination from the reading itself).
    if read.is_ok() {
        for (i, b) in inst.buffers.iter().enumerate() {
            if b.read_back() {
                let _ = gpu.sys_read(&staging[i], 0, &mut outputs[i]);
            }
        }
    }
    out.download_reread = sub.lap(gpu);
    let checked = read.map(|()| {
        let refs: Vec<&[u8]> = outputs.iter().map(|o| o.as_slice()).collect();
        inst.check(&refs).map(|_| ()).map_err(|m| format!("{m}"))
    });
    gpu.give_readback(outputs);
    checked
}

/// Submits `pb` (if it holds anything) and waits for it; leaves `pb` empty.
fn submit_and_wait<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    pb: &mut PushBuf,
) -> Result<(), Error> {
    if pb.is_empty() {
        return Ok(());
    }
    let f = ch.submit(gpu, pb);
    pb.clear();
    ch.wait(gpu, f?)
}
