//! The device: init (identity, limits), register and aperture access, the runlist, fault
//! records and interrupt acknowledgement. Page tables are in `device/tables.rs`, the VRAM and
//! system-memory pools every buffer comes from in `device/pools.rs`.

mod pools;
mod share;
mod tables;

use share::Share;
pub use share::{Attach, unbind_channel};

use crate::error::Error;
use crate::fault::Fault;
use crate::mmu::{AddressSpace, PAGE_2M, PAGE_4K, TableBackend, TableLoc, Target};
use crate::para::{self, ParaIf};
use crate::platform::{DmaBuf, Platform};
use crate::range::RangeAllocator;
use crate::regs;
use alloc::vec::Vec;

/// Where page directory and page tables live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TablePlacement {
    /// In guest VRAM, written through BAR1 (one trap per entry).
    Vram,
    /// In system memory (no trap per entry; the GPU reads them at TLB_FLUSH).
    Sysmem,
}

/// Driver settings.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub tables: TablePlacement,
    /// Bytes of system memory mapped for the GPU (GPFIFOs, pushbuffers, semaphores, PTX,
    /// parameters, staging), rounded up to 2 MiB.
    pub sys_pool_bytes: u64,
    /// Bytes of VRAM mapped for buffers (rounded down to 2 MiB); 0: half of VRAM.
    pub vram_pool_bytes: u64,
    /// Longest wait for a fence before [`Error::Timeout`].
    pub wait_timeout_ns: u64,
    /// While polling a fence, how often to look at the channel's status for a fault.
    pub fault_poll_ns: u64,
    /// Sleep on the GPU's interrupt (if the platform has one) instead of polling.
    pub use_interrupts: bool,
    /// Use the para-virtual interface when the device offers it (CAPS bit 4 and BAR3): page
    /// tables become hypercalls; the driver's own record of its mappings stays in system memory
    /// (the device never reads it).
    pub para: bool,
    /// Para-virtual naive mode: one hypercall per page instead of batches (experiments).
    pub para_per_page: bool,
    /// Ring doorbells through the doorbell page when the device offers it (CAPS bit 5):
    /// submitting and watching a channel then trap only while the device sleeps.
    pub exitless: bool,
    /// Write every page of the system-memory pool once at init and keep the CPU buffers
    /// results are read back into across workloads, so that no workload pays the first touch
    /// of fresh memory (a fault per page under some hypervisors).
    pub warm_pool: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            tables: TablePlacement::Vram,
            sys_pool_bytes: 8 << 20,
            vram_pool_bytes: 0,
            wait_timeout_ns: 60_000_000_000,
            fault_poll_ns: 2_000_000,
            use_interrupts: false,
            para: true,
            para_per_page: false,
            exitless: true,
            warm_pool: true,
        }
    }
}

/// What the identity registers said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    pub version: u32,
    pub vram_size: u64,
    pub channels: u32,
    pub page_sizes: u32,
    pub va_base: u64,
    pub va_size: u64,
    pub caps: u32,
    pub max_push_words: u32,
}

/// A piece of the system-memory pool: CPU-visible, mapped at `va`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysAlloc {
    pub va: u64,
    pub gpa: u64,
    pub len: u64,
    off: u64,
}

/// A piece of the VRAM pool, mapped at `va`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VramAlloc {
    pub va: u64,
    /// Guest VRAM address.
    pub vram: u64,
    pub len: u64,
}

/// Where [`Gpu::new`]'s time went (the platform's clock, ns), and the channel's creation when
/// [`crate::suite_run::open`] made one: how init splits into its parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitParts {
    /// Reading the device's identity and limits (register reads: traps under a VMM), opening
    /// the para-virtual interface.
    pub probe_ns: u64,
    /// Building the (empty) address space: the page directory's allocation.
    pub tables_ns: u64,
    /// Allocating the system-memory pool from the platform (a bare-metal guest's
    /// `dma_alloc` zeroes it: the guest's first touch of every page).
    pub pool_alloc_ns: u64,
    /// Writing each page of the pool once (`Config::warm_pool`).
    pub pool_warm_ns: u64,
    /// Mapping the two pools, interrupt and doorbell-page set-up, TLB flushes, moving the
    /// directory into VRAM.
    pub map_ns: u64,
    /// Creating the channel (`suite_run::open`; 0 otherwise).
    pub channel_ns: u64,
}

impl InitParts {
    /// The parts with their names, in order (for result lines and reports).
    pub fn named(&self) -> [(&'static str, u64); 6] {
        [
            ("probe", self.probe_ns),
            ("tables", self.tables_ns),
            ("pool_alloc", self.pool_alloc_ns),
            ("pool_warm", self.pool_warm_ns),
            ("map", self.map_ns),
            ("channel", self.channel_ns),
        ]
    }
}

/// Smallest sub-allocation (keeps buffers 256-byte aligned).
const POOL_ALIGN: u64 = 256;

/// The GPU, as the driver owns it.
pub struct Gpu<P: Platform> {
    pub(crate) p: P,
    info: Info,
    pub(crate) cfg: Config,
    mmio: u64,
    vram: RangeAllocator,
    va: RangeAllocator,
    space: AddressSpace,
    tables: Vec<DmaBuf>,
    sys: DmaBuf,
    sys_va: u64,
    sys_pool: RangeAllocator,
    vpool_vram: u64,
    vpool_va: u64,
    vpool: RangeAllocator,
    vpool_len: u64,
    tlb_dirty: bool,
    runlist_vram: u64,
    runlist: Vec<u32>,
    pub(crate) channels_in_use: u32,
    /// The para-virtual interface, when in use.
    para: Option<ParaIf>,
    /// The doorbell page, when in use (exitless submission).
    pub(crate) bell: Option<DmaBuf>,
    /// CPU-side buffers results are read back into, kept across workloads (see
    /// [`Gpu::take_readback`]).
    readback: Vec<Vec<u8>>,
    /// Where initialisation's time went.
    pub(crate) init_parts: InitParts,
    /// Set when this driver shares the device with others ([`Gpu::attach`]).
    pub(crate) share: Option<Share>,
}

/// Table storage for [`AddressSpace`], borrowing the parts of [`Gpu`] it needs.
struct Backend<'a, P: Platform> {
    p: &'a mut P,
    mmio: &'a mut u64,
    vram: &'a mut RangeAllocator,
    tables: &'a mut Vec<DmaBuf>,
    placement: TablePlacement,
    aperture: u64,
}

impl<P: Platform> TableBackend for Backend<'_, P> {
    fn alloc_table(&mut self, bytes: u64) -> Result<(TableLoc, bool), Error> {
        match self.placement {
            TablePlacement::Vram => {
                let addr = self
                    .vram
                    .alloc(bytes, PAGE_4K)
                    .ok_or(Error::NoVram(bytes))?;
                Ok((
                    TableLoc {
                        target: Target::Vram,
                        addr,
                        handle: 0,
                    },
                    false,
                ))
            }
            TablePlacement::Sysmem => {
                let len = usize::try_from(bytes).map_err(|_| Error::NoSysmem(bytes))?;
                let buf = self
                    .p
                    .dma_alloc(len, PAGE_4K as usize)
                    .ok_or(Error::NoSysmem(bytes))?;
                if !buf.gpa().is_multiple_of(PAGE_4K) || buf.len() < len {
                    return Err(Error::Unaligned(buf.gpa()));
                }
                let loc = TableLoc {
                    target: Target::Sysmem,
                    addr: buf.gpa(),
                    handle: self.tables.len(),
                };
                self.tables.push(buf);
                Ok((loc, true))
            }
        }
    }

    fn write_entry(&mut self, t: TableLoc, index: usize, value: u64) -> Result<(), Error> {
        let off = (index as u64)
            .checked_mul(8)
            .ok_or(Error::OutOfRange(t.addr))?;
        match t.target {
            Target::Vram => {
                let a = t.addr.checked_add(off).ok_or(Error::OutOfRange(t.addr))?;
                if a + 8 > self.aperture {
                    return Err(Error::OutOfRange(a));
                }
                *self.mmio += 1;
                self.p.vram_write64(a, value);
                Ok(())
            }
            Target::Sysmem => self
                .tables
                .get(t.handle)
                .and_then(|b| b.write_u64(off as usize, value))
                .ok_or(Error::OutOfRange(t.addr + off)),
        }
    }
}

impl<P: Platform> Gpu<P> {
    /// Checks the device, reads its limits, builds the address space and the pools: the
    /// driver owns the whole device.
    pub fn new(p: P, cfg: Config) -> Result<Self, Error> {
        Self::build(p, cfg, None)
    }

    /// Like [`Gpu::new`], for one of several drivers sharing the device (docs/architecture.md,
    /// "CUDA programs in the guest"): its own address space, channels, VRAM range and (through
    /// the platform's `dma_alloc`) system memory; device-wide set-up only when
    /// [`Attach::first`]. The caller holds the platform's device lock around it.
    pub fn attach(p: P, cfg: Config, a: Attach) -> Result<Self, Error> {
        Self::build(p, cfg, Some(a))
    }

    fn build(mut p: P, mut cfg: Config, attach: Option<Attach>) -> Result<Self, Error> {
        let mut parts = InitParts::default();
        let mut mark = p.now_ns();
        let mut lap = |p: &mut P| {
            let now = p.now_ns();
            let ns = now.saturating_sub(mark);
            mark = now;
            ns
        };
        let mut mmio = 0u64;
        let mut rd = |p: &mut P, off: u32| {
            mmio += 1;
            p.reg_read(off)
        };
        let id = rd(&mut p, regs::ID);
        if id != regs::ID_VALUE {
            return Err(Error::BadId(id));
        }
        let version = rd(&mut p, regs::VERSION);
        if version >> 16 != regs::VERSION_MAJOR {
            return Err(Error::BadVersion(version));
        }
        let wide = |p: &mut P, lo: u32, hi: u32, rd: &mut dyn FnMut(&mut P, u32) -> u32| {
            u64::from(rd(p, lo)) | u64::from(rd(p, hi)) << 32
        };
        let vram_size = wide(&mut p, regs::VRAM_SIZE_LO, regs::VRAM_SIZE_HI, &mut rd);
        let channels = rd(&mut p, regs::CHANNELS).min(regs::MAX_CHANNELS);
        let page_sizes = rd(&mut p, regs::PAGE_SIZES);
        let va_base = wide(&mut p, regs::VA_BASE_LO, regs::VA_BASE_HI, &mut rd);
        let va_size = wide(&mut p, regs::VA_SIZE_LO, regs::VA_SIZE_HI, &mut rd);
        let caps = rd(&mut p, regs::CAPS);
        let max_push_words = rd(&mut p, regs::MAX_PUSH_WORDS);
        let info = Info {
            version,
            vram_size,
            channels,
            page_sizes,
            va_base,
            va_size,
            caps,
            max_push_words,
        };
        if channels == 0 {
            return Err(Error::BadInfo("CHANNELS is 0"));
        }
        if page_sizes & (regs::PAGE_4K | regs::PAGE_2M) == 0 {
            return Err(Error::BadInfo("PAGE_SIZES has no known size"));
        }
        if max_push_words < 32 {
            return Err(Error::BadInfo("MAX_PUSH_WORDS below 32"));
        }
        if caps & regs::CAP_SYSMEM == 0 {
            return Err(Error::MissingCap("system-memory targets"));
        }
        if va_base.checked_add(va_size).is_none() || va_size < 8 * PAGE_2M {
            return Err(Error::BadInfo("VA window"));
        }
        let para = if cfg.para && caps & regs::CAP_PARA != 0 {
            mmio += 4;
            ParaIf::open(&mut p)?.map(|mut pi| {
                pi.set_per_page(cfg.para_per_page);
                pi
            })
        } else {
            None
        };
        if para.is_some() || attach.is_some() {
            // Para: the tables are only the driver's record: keep them in RAM, never in VRAM.
            // Shared: in the driver's own RAM (no bootstrap channel, no VRAM outside its range).
            cfg.tables = TablePlacement::Sysmem;
        }
        parts.probe_ns = lap(&mut p);
        let aperture = p.vram_aperture().min(vram_size);
        let (vram_base, vram_len) = match &attach {
            Some(a) => {
                let end = a.vram_base.checked_add(a.vram_len);
                if a.vram_len == 0 || end.is_none_or(|e| e > aperture) {
                    return Err(Error::OutOfRange(a.vram_base));
                }
                (a.vram_base, a.vram_len)
            }
            None => (0, aperture),
        };
        let mut vram = RangeAllocator::new(vram_base, vram_len);
        let mut va = RangeAllocator::new(va_base, va_size);
        // The first 2 MiB of the window stay unmapped: a guard against null-ish pointers.
        va.reserve(va_base, PAGE_2M);
        let big = page_sizes & regs::PAGE_2M != 0;
        let mut tables = Vec::new();
        // A VRAM directory is built in system memory first and moved once the copy engine can
        // clear its VRAM (one copy instead of a trap per entry).
        let bootstrap = cfg.tables == TablePlacement::Vram && caps & regs::CAP_COPY != 0;
        let space = AddressSpace::new(
            &mut Backend {
                p: &mut p,
                mmio: &mut mmio,
                vram: &mut vram,
                tables: &mut tables,
                placement: if bootstrap {
                    TablePlacement::Sysmem
                } else {
                    cfg.tables
                },
                aperture,
            },
            va_base,
            va_size,
            big,
        )?;
        parts.tables_ns = lap(&mut p);
        let sys_bytes = cfg.sys_pool_bytes.max(PAGE_2M).next_multiple_of(PAGE_2M);
        let sys_len = usize::try_from(sys_bytes).map_err(|_| Error::NoSysmem(sys_bytes))?;
        let sys = p
            .dma_alloc(sys_len, PAGE_2M as usize)
            .ok_or(Error::NoSysmem(sys_bytes))?;
        if sys.len() < sys_len || !sys.gpa().is_multiple_of(PAGE_4K) {
            return Err(Error::NoSysmem(sys_bytes));
        }
        parts.pool_alloc_ns = lap(&mut p);
        let sys_va = va.alloc(sys_bytes, PAGE_2M).ok_or(Error::NoVa(sys_bytes))?;
        let runlist_vram = match &attach {
            Some(a) => a.runlist_vram,
            None => vram.alloc(PAGE_4K, PAGE_4K).ok_or(Error::NoVram(PAGE_4K))?,
        };
        let want = if cfg.vram_pool_bytes == 0 {
            vram_len / 2
        } else {
            cfg.vram_pool_bytes
        };
        let vpool_bytes = (want / PAGE_2M * PAGE_2M).max(PAGE_2M);
        let vpool_vram = vram
            .alloc(vpool_bytes, PAGE_2M)
            .ok_or(Error::NoVram(vpool_bytes))?;
        let vpool_va = va
            .alloc(vpool_bytes, PAGE_2M)
            .ok_or(Error::NoVa(vpool_bytes))?;
        let mut gpu = Self {
            p,
            info,
            cfg,
            mmio,
            vram,
            va,
            space,
            tables,
            sys,
            sys_va,
            sys_pool: RangeAllocator::new(0, sys_bytes),
            vpool_vram,
            vpool_va,
            vpool: RangeAllocator::new(0, vpool_bytes),
            vpool_len: vpool_bytes,
            tlb_dirty: true,
            runlist_vram,
            runlist: Vec::new(),
            channels_in_use: 0,
            para,
            bell: None,
            readback: Vec::new(),
            init_parts: parts,
            share: None,
        };
        let (first, bell) = match attach {
            Some(a) => {
                gpu.share = Some(Share::new(a.channels));
                (a.first, a.bell)
            }
            None => (true, None),
        };
        if gpu.cfg.warm_pool {
            gpu.warm_sys_pool();
        }
        gpu.init_parts.pool_warm_ns = lap(&mut gpu.p);
        if gpu.para.is_some() {
            let pdb = gpu.pdb();
            gpu.para_call(para::OP_SET_PD, pdb)?;
            if gpu.share.is_some() {
                // A directory at this address may have been another (dead) driver's: its
                // space on the device keeps that driver's mappings until they are removed.
                gpu.para_unmap_window()?;
            }
        }
        let sys_gpa = gpu.sys.gpa();
        gpu.map(sys_va, sys_bytes, Target::Sysmem, sys_gpa, false)?;
        gpu.map(vpool_va, vpool_bytes, Target::Vram, vpool_vram, false)?;
        if first {
            gpu.reg_write(regs::FAULT_CLEAR, 1);
            gpu.reg_write(regs::INTR_STATUS, u32::MAX);
            gpu.reg_write(regs::INTR_CHANNELS, u32::MAX);
            let enable = if gpu.interrupts_on() {
                regs::INTR_SEMAPHORE | regs::INTR_FAULT
            } else {
                0
            };
            gpu.reg_write(regs::INTR_ENABLE, enable);
        }
        if gpu.cfg.exitless && caps & regs::CAP_BELL != 0 {
            match bell {
                Some(b) => gpu.use_shared_bell(b, first)?,
                None if gpu.share.is_none() => gpu.open_bell()?,
                None => {}
            }
        }
        gpu.flush_tlb();
        if bootstrap {
            gpu.directory_to_vram()?;
            gpu.flush_tlb();
        }
        gpu.init_parts.map_ns = lap(&mut gpu.p);
        Ok(gpu)
    }

    /// Where initialisation's time went (with the channel's creation after
    /// [`crate::suite_run::open`]).
    pub fn init_parts(&self) -> InitParts {
        self.init_parts
    }

    /// Moves the page directory from system memory into VRAM: clears the VRAM with one
    /// copy-engine copy (or, if that fails, through BAR1), then writes the valid entries.
    fn directory_to_vram(&mut self) -> Result<(), Error> {
        let len = self.space.directory_bytes();
        let span = len.next_multiple_of(PAGE_2M);
        let dir = self.vram.alloc(len, PAGE_2M).ok_or(Error::NoVram(len))?;
        if self.zero_vram_by_copy(dir, span, len).is_err() {
            let _ = self.take_fault();
            for off in (0..len).step_by(8) {
                self.vram_write64(dir + off, 0)?;
            }
        }
        let loc = TableLoc {
            target: Target::Vram,
            addr: dir,
            handle: 0,
        };
        let (mut b, space) = self.backend();
        space.move_directory(&mut b, loc)?;
        self.tlb_dirty = true;
        Ok(())
    }

    /// Clears VRAM [addr, addr + len) with the copy engine on a temporary channel 0, through a
    /// temporary mapping of [addr, addr + span) (2 MiB pages).
    fn zero_vram_by_copy(&mut self, addr: u64, span: u64, len: u64) -> Result<(), Error> {
        let va = self.va_alloc(span, PAGE_2M)?;
        let zero = match self.sys_alloc(len) {
            Ok(z) => z,
            Err(e) => {
                self.va_free(va, span);
                return Err(e);
            }
        };
        let r = self
            .map(va, span, Target::Vram, addr, false)
            .and_then(|()| {
                let mut ch = self.create_channel(0)?;
                let mut pb = crate::push::PushBuf::new();
                pb.copy(zero.va, va, len);
                let r = ch
                    .submit(self, &mut pb)
                    .and_then(|f| ch.wait_timeout(self, f, 5_000_000_000));
                self.destroy_channel(ch)?;
                r
            });
        let u = self.unmap(va, span);
        self.va_free(va, span);
        self.sys_free(zero);
        r.and(u)
    }

    /// Enables the doorbell page (a zeroed page of system memory); without one, or if the
    /// device refuses it, doorbells stay trapped register writes.
    fn open_bell(&mut self) -> Result<(), Error> {
        let page = regs::bell::PAGE_BYTES as usize;
        let Some(b) = self.p.dma_alloc(page, page) else {
            return Ok(());
        };
        if b.len() < page || !b.gpa().is_multiple_of(regs::bell::PAGE_BYTES) {
            return Ok(());
        }
        self.reg_write(regs::BELL_PAGE_HI, (b.gpa() >> 32) as u32);
        self.reg_write(regs::BELL_PAGE_LO, b.gpa() as u32 | regs::BELL_ENABLE);
        if self.reg_read(regs::BELL_PAGE_LO) & regs::BELL_ENABLE != 0 {
            self.bell = Some(b);
            Ok(())
        } else {
            // Refused (the device recorded why): trapped doorbells still work.
            self.check_device_fault()
        }
    }

    /// `n` CPU-side buffers for reading results back, reused from earlier workloads (give
    /// them back with [`Gpu::give_readback`]): memory touched once, not fresh pages per
    /// workload (whose first touch is a fault each under some hypervisors).
    pub fn take_readback(&mut self, n: usize) -> Vec<Vec<u8>> {
        if !self.cfg.warm_pool {
            // Cold: fresh buffers every time (what the driver did before it kept them).
            return (0..n).map(|_| Vec::new()).collect();
        }
        let mut v = core::mem::take(&mut self.readback);
        v.resize_with(n, Vec::new);
        v
    }

    /// Returns the buffers of [`Gpu::take_readback`] for the next workload.
    pub fn give_readback(&mut self, v: Vec<Vec<u8>>) {
        self.readback = v;
    }

    /// Whether doorbells go through the doorbell page.
    pub fn exitless(&self) -> bool {
        self.bell.is_some()
    }

    /// Rings channel `id`'s doorbell with GP_PUT `put`: into the doorbell page, plus the
    /// trapped register only while the device says it does not poll (`WAKE`); else the register.
    pub(crate) fn ring(&mut self, id: u32, put: u32) {
        if let Some(b) = &self.bell {
            let ok = b.write_u32(regs::bell::put(id) as usize, put).is_some();
            // The store of PUT[n] before the load of WAKE (the device orders the other way).
            core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
            let wake = b.read_u32(regs::bell::WAKE as usize).unwrap_or(1);
            if ok && wake == 0 {
                return;
            }
        }
        self.reg_write(regs::gp_put(id), put);
    }

    /// Writes `PUT[id]` of the doorbell page without ringing anything (tests and attacks);
    /// false without a page.
    pub fn bell_put_raw(&mut self, id: u32, put: u32) -> bool {
        self.bell
            .as_ref()
            .and_then(|b| b.write_u32(regs::bell::put(id) as usize, put))
            .is_some()
    }

    /// Channel `id`'s CHAN_STATUS: from the doorbell page when in use (no trap), else the
    /// register.
    pub(crate) fn chan_status(&mut self, id: u32) -> u32 {
        match self
            .bell
            .as_ref()
            .and_then(|b| b.read_u32(regs::bell::status(id) as usize))
        {
            Some(s) => s,
            None => self.reg_read(regs::chan_status(id)),
        }
    }

    /// Whether waits sleep on the interrupt.
    pub fn interrupts_on(&self) -> bool {
        self.cfg.use_interrupts && self.p.has_interrupts() && self.info.caps & regs::CAP_MSI != 0
    }

    /// What the device reported at init.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// The platform.
    pub fn platform(&mut self) -> &mut P {
        &mut self.p
    }

    /// MMIO accesses (register and BAR1) made so far: each is a VM exit in a guest.
    pub fn mmio_count(&self) -> u64 {
        self.mmio
    }

    /// Reads a BAR0 register (counted).
    pub fn reg_read(&mut self, off: u32) -> u32 {
        self.mmio += 1;
        self.p.reg_read(off)
    }

    /// Writes a BAR0 register (counted).
    pub fn reg_write(&mut self, off: u32, v: u32) {
        self.mmio += 1;
        self.p.reg_write(off, v);
    }

    /// Writes `data` to guest VRAM at `addr` through BAR1, 8 bytes at a time (the tail
    /// read-modify-written). For small things only: bulk data goes through the copy engine.
    pub fn vram_write(&mut self, addr: u64, data: &[u8]) -> Result<(), Error> {
        let aperture = self.p.vram_aperture().min(self.info.vram_size);
        let end = addr
            .checked_add((data.len() as u64).next_multiple_of(8))
            .filter(|e| *e <= aperture)
            .ok_or(Error::OutOfRange(addr))?;
        if !addr.is_multiple_of(8) || end < addr {
            return Err(Error::Unaligned(addr));
        }
        for (k, chunk) in data.chunks(8).enumerate() {
            let a = addr + 8 * k as u64;
            let mut w = [0u8; 8];
            if chunk.len() < 8 {
                self.mmio += 1;
                w = self.p.vram_read64(a).to_le_bytes();
            }
            w[..chunk.len()].copy_from_slice(chunk);
            self.mmio += 1;
            self.p.vram_write64(a, u64::from_le_bytes(w));
        }
        Ok(())
    }

    /// Writes one u64 of guest VRAM through BAR1.
    pub fn vram_write64(&mut self, addr: u64, v: u64) -> Result<(), Error> {
        self.vram_write(addr, &v.to_le_bytes())
    }

    /// Reads one u64 of guest VRAM through BAR1.
    pub fn vram_read64(&mut self, addr: u64) -> Result<u64, Error> {
        let aperture = self.p.vram_aperture().min(self.info.vram_size);
        if !addr.is_multiple_of(8) {
            return Err(Error::Unaligned(addr));
        }
        if addr.checked_add(8).is_none_or(|e| e > aperture) {
            return Err(Error::OutOfRange(addr));
        }
        self.mmio += 1;
        Ok(self.p.vram_read64(addr))
    }

    /// Writes the runlist (the channels in use) and submits it.
    pub(crate) fn runlist_set(&mut self, id: u32, on: bool) -> Result<(), Error> {
        self.runlist.retain(|&c| c != id);
        if on {
            self.runlist.push(id);
        }
        self.runlist_submit()
    }

    /// Writes and submits the runlist: this driver's channels and, when the device is shared,
    /// the other drivers' ([`Gpu::set_peers`]), under the platform's device lock.
    pub fn runlist_submit(&mut self) -> Result<(), Error> {
        let mut ids = self.runlist.clone();
        if let Some(s) = &self.share {
            ids.extend(s.peers.iter().filter(|p| !self.runlist.contains(p)));
        }
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        ids.iter()
            .for_each(|i| bytes.extend_from_slice(&i.to_le_bytes()));
        self.p.lock_device();
        let r = self.vram_write(self.runlist_vram, &bytes).map(|()| {
            self.reg_write(regs::RUNLIST_BASE, (self.runlist_vram >> 12) as u32);
            self.reg_write(regs::RUNLIST_SUBMIT, ids.len() as u32);
        });
        self.p.unlock_device();
        r?;
        self.check_device_fault()
    }

    /// Writes and submits the driver's runlist again (after a test submitted another one).
    pub fn runlist_refresh(&mut self) -> Result<(), Error> {
        match self.runlist.first().copied() {
            Some(id) => self.runlist_set(id, true),
            None => Ok(()),
        }
    }

    /// Guest VRAM address of the runlist.
    pub fn runlist_addr(&self) -> u64 {
        self.runlist_vram
    }

    /// Reads and clears the pending fault record, if any (one register read when none).
    /// A shared driver ([`Gpu::attach`]) takes only records of its own channels and
    /// device-level ones: another driver's stays for that driver.
    pub fn take_fault(&mut self) -> Option<Fault> {
        let status = self.reg_read(regs::FAULT_STATUS);
        if status & regs::FAULT_VALID == 0 {
            return None;
        }
        let channel = self.reg_read(regs::FAULT_CHANNEL);
        if let Some(s) = &self.share
            && channel != regs::FAULT_CHANNEL_DEVICE
            && !s.owns(channel)
        {
            return None;
        }
        let lo = self.reg_read(regs::FAULT_ADDR_LO);
        let hi = self.reg_read(regs::FAULT_ADDR_HI);
        let info = self.reg_read(regs::FAULT_INFO);
        self.reg_write(regs::FAULT_CLEAR, 1);
        Fault::decode(status, channel, u64::from(lo) | u64::from(hi) << 32, info)
    }

    /// `Err(Fault)` if the device holds a fault record (which is then cleared).
    pub fn check_device_fault(&mut self) -> Result<(), Error> {
        match self.take_fault() {
            Some(f) => Err(Error::Fault(f)),
            None => Ok(()),
        }
    }

    /// Acknowledges interrupts: returns INTR_STATUS and clears it and INTR_CHANNELS.
    pub fn ack_interrupts(&mut self) -> u32 {
        let s = self.reg_read(regs::INTR_STATUS);
        if s & regs::INTR_SEMAPHORE != 0 {
            let ch = self.reg_read(regs::INTR_CHANNELS);
            self.reg_write(regs::INTR_CHANNELS, ch);
        }
        if s != 0 {
            self.reg_write(regs::INTR_STATUS, s & regs::INTR_SEMAPHORE);
        }
        s
    }

    /// The device TIMER in ns (two register reads).
    pub fn timer_ns(&mut self) -> u64 {
        let lo = self.reg_read(regs::TIMER_LO);
        let hi = self.reg_read(regs::TIMER_HI);
        u64::from(lo) | u64::from(hi) << 32
    }
}
