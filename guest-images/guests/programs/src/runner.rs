//! Runs one suite instance through gpu-driver: PTX and staging buffers in system memory,
//! buffers in VRAM (copy engine in and out; or, by [`RunOpts`], PTX in VRAM and buffers used
//! in place in system memory), every launch in order in one submission between
//! two timestamped semaphore releases, then the suite's check in the guest.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use gpu_driver::{Channel, Error, Gpu, LaunchDesc, Platform, PushBuf, SysAlloc, VramAlloc};
use suite::Instance;

/// Semaphore slots of the start and end timestamps.
const SLOT_START: u64 = 1;
const SLOT_END: u64 = 2;

/// Where things go.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOpts {
    /// PTX text copied into VRAM (else read by the GPU from system memory).
    pub ptx_in_vram: bool,
    /// Buffers left in system memory for the kernels to use directly (else VRAM + copies).
    pub buffers_in_sysmem: bool,
}

impl RunOpts {
    /// From the command line: `ptx=vram`, `buffers=sysmem`.
    pub fn from_args() -> Self {
        Self {
            ptx_in_vram: guest_rt::arg("ptx") == Some("vram"),
            buffers_in_sysmem: guest_rt::arg("buffers") == Some("sysmem"),
        }
    }
}

/// What one run gave.
#[derive(Debug)]
pub struct Outcome {
    /// Whether `check` accepted the outputs.
    pub ok: bool,
    /// GPU time of the launches (device TIMER between the two releases), ns.
    pub gpu_ns: u64,
    /// Driver MMIO accesses (VM exits) during the run.
    pub exits: u64,
    /// Why it failed, if it did.
    pub detail: String,
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

/// Runs `inst` on channel `ch` and checks it.
pub fn run_instance<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    inst: &Instance,
    opts: RunOpts,
) -> Outcome {
    let before = gpu.mmio_count();
    let mut allocs = Allocs {
        sys: Vec::new(),
        vram: Vec::new(),
    };
    let r = run(gpu, ch, inst, opts, &mut allocs);
    allocs.free(gpu);
    let exits = gpu.mmio_count() - before;
    match r {
        Ok((ok, gpu_ns, detail)) => Outcome {
            ok,
            gpu_ns,
            exits,
            detail,
        },
        Err(e) => {
            if matches!(
                e,
                Error::Fault(_) | Error::ChannelFaulted { .. } | Error::Timeout { .. }
            ) {
                let _ = ch.recover(gpu);
            }
            Outcome {
                ok: false,
                gpu_ns: 0,
                exits,
                detail: format!("{e}"),
            }
        }
    }
}

fn run<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    inst: &Instance,
    opts: RunOpts,
    allocs: &mut Allocs,
) -> Result<(bool, u64, String), Error> {
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
    for i in inst.read_back() {
        let len = inst.buffers[i].init.len() as u64;
        if len > 0 && !opts.buffers_in_sysmem {
            pb.copy(addrs[i], staging[i].va, len);
        }
    }
    let fence = ch.submit(gpu, &mut pb)?;
    ch.wait(gpu, fence)?;
    let t0 = ch.slot_time(gpu, SLOT_START)?;
    let t1 = ch.slot_time(gpu, SLOT_END)?;
    let mut outputs: Vec<Vec<u8>> = Vec::with_capacity(inst.buffers.len());
    for (i, b) in inst.buffers.iter().enumerate() {
        let mut out = alloc::vec![0u8; if b.read_back() { b.init.len() } else { 0 }];
        gpu.sys_read(&staging[i], 0, &mut out)?;
        outputs.push(out);
    }
    let refs: Vec<&[u8]> = outputs.iter().map(|o| o.as_slice()).collect();
    let gpu_ns = t1.saturating_sub(t0);
    Ok(match inst.check(&refs) {
        Ok(_) => (true, gpu_ns, String::new()),
        Err(m) => (false, gpu_ns, format!("{m}")),
    })
}
