//! Escape attempts for the `attack` guest: each one programs the virtual GPU to reach outside
//! the guest's partition (or feeds it malformed work) and reports which faults came back.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use gpu_driver::mmu::{self, Target};
use gpu_driver::push::{self, PushBuf};
use gpu_driver::{Channel, Error, Fault, FaultKind, Gpu, LaunchDesc, Platform, regs};

/// PTX with a kernel that stores through a pointer parameter and one that never ends.
pub const PTX: &str = r#".version 7.8
.target sm_80
.address_size 64

.visible .entry poke(
    .param .u64 poke_param_0
)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [poke_param_0];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 42;
    st.global.u32 [%rd2], %r1;
    ret;
}

.visible .entry forever()
{
$L__spin:
    bra.uni $L__spin;
}
"#;

/// What one attempt produced.
pub struct Attempt {
    /// Faults the guest saw (records, or a channel's status kind).
    pub faults: Vec<FaultKind>,
    /// Where it aimed ("vram:0x..", "gpa:0x..", "va:0x..", "reg:0x..").
    pub aim: String,
    /// Extra observation that makes the attempt fail regardless of faults (e.g. data leaked).
    pub breach: Option<String>,
}

impl Attempt {
    fn new(aim: String) -> Self {
        Self {
            faults: Vec::new(),
            aim,
            breach: None,
        }
    }

    fn note(&mut self, r: Result<(), Error>) {
        match r {
            Err(Error::Fault(f)) => self.faults.push(f.kind),
            Err(Error::ChannelFaulted { kind, .. }) => self.faults.push(FaultKind::from_raw(kind)),
            Err(e) => self.breach.get_or_insert(format!("{e}")).push(' '),
            Ok(()) => {}
        }
    }

    fn drain<P: Platform>(&mut self, gpu: &mut Gpu<P>) {
        for _ in 0..4 {
            match gpu.take_fault() {
                Some(Fault { kind, .. }) => self.faults.push(kind),
                None => break,
            }
        }
    }
}

/// Resources the attacks share.
pub struct Ctx {
    /// A 2 MiB VA region with a page table (4 KiB PTE attacks).
    pub pte_va: u64,
    /// A 2 MiB VA region for PDE attacks.
    pub pde_va: u64,
    /// System-memory scratch (4 KiB) filled with a sentinel.
    pub scratch: gpu_driver::SysAlloc,
    /// PTX module in system memory.
    pub code: gpu_driver::SysAlloc,
    /// Guest RAM end (first guest-physical address that is not RAM below 4 GiB).
    pub ram_end: u64,
}

const SENTINEL: u8 = 0xa5;

impl Ctx {
    /// Allocates the shared resources.
    pub fn new<P: Platform>(gpu: &mut Gpu<P>, ram_end: u64) -> Result<Self, Error> {
        let pte_va = gpu.va_alloc(mmu::PAGE_2M, mmu::PAGE_2M)?;
        let pde_va = gpu.va_alloc(mmu::PAGE_2M, mmu::PAGE_2M)?;
        let scratch = gpu.sys_alloc_aligned(4096, 4096)?;
        let code = gpu.sys_alloc(PTX.len() as u64)?;
        gpu.sys_write(&code, 0, PTX.as_bytes())?;
        // Create the page table once (a VRAM table costs 512 writes to clear).
        gpu.set_pte_raw(pte_va, 0)?;
        gpu.flush_tlb();
        Ok(Self {
            pte_va,
            pde_va,
            scratch,
            code,
            ram_end,
        })
    }

    fn fill_scratch<P: Platform>(&self, gpu: &mut Gpu<P>) -> Result<(), Error> {
        gpu.sys_write(&self.scratch, 0, &[SENTINEL; 4096])
    }

    fn scratch_intact<P: Platform>(&self, gpu: &mut Gpu<P>) -> bool {
        let mut b = [0u8; 4096];
        gpu.sys_read(&self.scratch, 0, &mut b).is_ok() && b.iter().all(|&x| x == SENTINEL)
    }
}

/// Short limit for work that must fault quickly.
const QUICK_NS: u64 = 5_000_000_000;

fn run_push<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    pb: &mut PushBuf,
    limit: u64,
) -> Result<(), Error> {
    let f = ch.submit(gpu, pb)?;
    ch.wait_timeout(gpu, f, limit)
}

/// A PTE (write then read through it) or PDE aimed at `target:addr`.
pub fn bad_mapping<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    ctx: &Ctx,
    big: bool,
    entry: u64,
    aim: String,
) -> Result<Attempt, Error> {
    let mut a = Attempt::new(aim);
    let va = if big { ctx.pde_va } else { ctx.pte_va };
    ctx.fill_scratch(gpu)?;
    if big {
        gpu.set_pde_raw(va, entry)?;
    } else {
        gpu.set_pte_raw(va, entry)?;
    }
    gpu.flush_tlb();
    a.drain(gpu);
    // Write our sentinel there, then try to read it back into scratch.
    let mut pb = PushBuf::new();
    pb.copy(ctx.scratch.va, va, 4096);
    a.note(run_push(gpu, ch, &mut pb, QUICK_NS));
    a.drain(gpu);
    let _ = ch.recover(gpu);
    gpu.sys_write(&ctx.scratch, 0, &[0u8; 4096])?;
    let mut pb = PushBuf::new();
    pb.copy(va, ctx.scratch.va, 4096);
    a.note(run_push(gpu, ch, &mut pb, QUICK_NS));
    a.drain(gpu);
    let _ = ch.recover(gpu);
    let mut b = [0u8; 8];
    gpu.sys_read(&ctx.scratch, 0, &mut b)?;
    if b != [0u8; 8] {
        a.breach = Some(format!("read back {b:02x?} through the bad entry"));
    }
    if big {
        gpu.set_pde_raw(va, 0)?;
    } else {
        gpu.set_pte_raw(va, 0)?;
    }
    gpu.flush_tlb();
    a.drain(gpu);
    Ok(a)
}

/// A register write the device must refuse.
pub fn bad_register<P: Platform>(gpu: &mut Gpu<P>, reg: u32, value: u32, aim: String) -> Attempt {
    let mut a = Attempt::new(aim);
    let before = gpu.reg_read(reg);
    gpu.reg_write(reg, value);
    a.drain(gpu);
    let after = gpu.reg_read(reg);
    if after == value && before != value {
        a.breach = Some(format!("register {reg:#x} took {value:#x}"));
    }
    a
}

/// A doorbell through the doorbell page for channel `id`, which is not bound: `PUT[id]` is
/// written, then a correct submission on `ch` makes sure the device looks at the page.
pub fn bell_put_unbound<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    id: u32,
) -> Result<Attempt, Error> {
    let mut a = Attempt::new(format!("channel:{id}"));
    if !gpu.bell_put_raw(id, 3) {
        a.breach = Some(String::from("no doorbell page"));
        return Ok(a);
    }
    let mut pb = PushBuf::new();
    let f = ch.submit(gpu, &mut pb)?;
    a.note(ch.wait(gpu, f));
    a.drain(gpu);
    // PUT[id] stays 3: setting it back would be another doorbell (another fault) later.
    Ok(a)
}

/// A runlist naming a channel id beyond the quota.
pub fn bad_runlist<P: Platform>(gpu: &mut Gpu<P>, channels: u32) -> Result<Attempt, Error> {
    let mut a = Attempt::new(format!("channel:{channels}"));
    let rl = gpu.vram_alloc_raw(4096, 4096)?;
    gpu.vram_write64(rl, u64::from(channels) << 32)?;
    gpu.reg_write(regs::RUNLIST_BASE, (rl >> 12) as u32);
    gpu.reg_write(regs::RUNLIST_SUBMIT, 2);
    a.drain(gpu);
    gpu.vram_free_raw(rl, 4096);
    a.note(gpu.runlist_refresh());
    Ok(a)
}

/// The channel's GPFIFO moved to an unmapped VA (or a bad size), then the doorbell.
pub fn bad_gpfifo<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    va: u64,
    entries: u32,
) -> Result<Attempt, Error> {
    let mut a = Attempt::new(format!("va:{va:#x} entries:{entries}"));
    ch.set_gpfifo_raw(gpu, va, entries)?;
    a.drain(gpu);
    // One entry past where the GPU stands, so there is work to fetch.
    let get = gpu.reg_read(regs::gp_get(ch.id()));
    ch.doorbell_raw(gpu, get.wrapping_add(1));
    a.note(wait_fault(gpu, ch));
    a.drain(gpu);
    ch.recover(gpu)?;
    Ok(a)
}

/// A GPFIFO entry with raw contents (pushbuffer at `va`, `words` long).
pub fn raw_entry<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    va: u64,
    words: u64,
) -> Result<Attempt, Error> {
    let mut a = Attempt::new(format!("va:{va:#x}"));
    ch.submit_raw_entry(gpu, (va & 0xffff_ffff_ffff) | words << 48)?;
    a.note(wait_fault(gpu, ch));
    a.drain(gpu);
    ch.recover(gpu)?;
    Ok(a)
}

/// A pushbuffer segment made of raw words (staged in the channel's stream).
pub fn raw_words<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    words: &[u32],
    aim: String,
) -> Result<Attempt, Error> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let va = ch.stage(gpu, &bytes, 8)?;
    let mut a = raw_entry(gpu, ch, va, words.len() as u64)?;
    a.aim = aim;
    Ok(a)
}

/// A launch of `entry` from `code` with an optional u64 parameter.
pub fn launch<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    code: (u64, u32),
    entry: &str,
    param: Option<u64>,
    limit: u64,
    aim: String,
) -> Result<Attempt, Error> {
    let mut a = Attempt::new(aim);
    let entry_va = ch.stage(gpu, entry.as_bytes(), 8)?;
    let (param_va, param_len) = match param {
        Some(p) => (ch.stage(gpu, &p.to_le_bytes(), 8)?, 8),
        None => (0, 0),
    };
    let mut pb = PushBuf::new();
    pb.launch(&LaunchDesc {
        code_va: code.0,
        code_len: code.1,
        entry_va,
        entry_len: entry.len() as u32,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        param_va,
        param_len,
    });
    a.note(run_push(gpu, ch, &mut pb, limit));
    a.drain(gpu);
    let _ = ch.recover(gpu);
    Ok(a)
}

/// Waits (up to QUICK_NS) for the channel to fault; Ok if it never did.
fn wait_fault<P: Platform>(gpu: &mut Gpu<P>, ch: &mut Channel) -> Result<(), Error> {
    let t0 = gpu.platform().now_ns();
    loop {
        ch.check_faulted(gpu)?;
        if let Some(f) = gpu.take_fault() {
            return Err(Error::Fault(f));
        }
        let now = gpu.platform().now_ns();
        if now.saturating_sub(t0) > QUICK_NS {
            return Ok(());
        }
        // Look again in about a millisecond (every look is a trap).
        while gpu.platform().now_ns().saturating_sub(now) < 1_000_000 {
            gpu.platform().wait_for_interrupt(1_000_000);
        }
    }
}

/// The entries an attack uses.
pub fn pte_vram(addr: u64) -> u64 {
    mmu::pte(Target::Vram, addr, false)
}
/// A PTE into system memory.
pub fn pte_sys(addr: u64) -> u64 {
    mmu::pte(Target::Sysmem, addr, false)
}
/// A method header with a raw opcode.
pub fn header(op: u32, count: u32, method: u32) -> u32 {
    push::header(op, count, method)
}

/// Copies the sentinel-free pattern into `va` (which must refuse writes) and checks scratch,
/// which `va` maps, kept its sentinel.
pub fn copy_attempt<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    ctx: &Ctx,
    va: u64,
) -> Result<Attempt, Error> {
    let mut a = Attempt::new(format!("va:{va:#x}"));
    ctx.fill_scratch(gpu)?;
    let src = ch.stage(gpu, &[0x11u8; 4096], 4096)?;
    let mut pb = PushBuf::new();
    pb.copy(src, va, 4096);
    a.note(run_push(gpu, ch, &mut pb, QUICK_NS));
    a.drain(gpu);
    let _ = ch.recover(gpu);
    if !ctx.scratch_intact(gpu) {
        a.breach = Some(String::from("read-only page was written"));
    }
    Ok(a)
}
