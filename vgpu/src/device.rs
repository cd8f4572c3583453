//! The PCI front end of the virtual GPU: configuration space (identity, BARs, MSI), BAR0
//! registers and the PRAMIN window, and the BAR1 VRAM aperture. Runs on vCPU threads; work
//! goes to the GPU worker through the shared state. Every register value is validated here.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use mmio::pci::{BarKind, BarSpec, PciConfig, PciDevice, PciError};
use pgpu::Engine;

use crate::config::GpuConfig;
use crate::regs::{self, Access, ChanReg, FaultKind};
use crate::remap::Remap;
use crate::state::{FaultRecord, Shared, Watched};

/// The device as the PCI root sees it.
pub struct VgpuDevice {
    config: PciConfig,
    msi_cap: usize,
    cfg: GpuConfig,
    engine: Arc<dyn Engine>,
    /// Physical VRAM address of guest VRAM address 0.
    vram_base: u64,
    shared: Arc<Shared>,
    /// What guest addresses are valid (for validating instance blocks at bind time).
    layout: shadow::GpuLayout,
    timer_hi_latch: u32,
    /// The para-virtual BAR3 (`mode=para`).
    para: Option<crate::para_bar::Para>,
    /// BAR remap of the aperture (`opt=remap|all`).
    remap: Option<Arc<Mutex<Remap>>>,
    /// Guest RAM, when the doorbell page is offered (`doorbell=poll`): CAPS bit 5.
    bell_ram: Option<vm_memory::GuestMemoryMmap>,
    /// `BELL_PAGE_HI` as written (takes effect with the next `BELL_PAGE_LO` write).
    bell_hi: u32,
    /// `ALLOC_VA` and `ALLOC_LEN` as written (for `ALLOC_DECLARE`).
    alloc_va: u64,
    alloc_len: u64,
    /// Where declared allocations go (live write sets).
    write_log: Option<Arc<crate::snapshot::writes::WriteSetLog>>,
}

impl VgpuDevice {
    pub fn new(
        cfg: GpuConfig,
        engine: Arc<dyn Engine>,
        vram_base: u64,
        shared: Arc<Shared>,
        layout: shadow::GpuLayout,
    ) -> Result<Self, PciError> {
        let mut config = PciConfig::new(regs::VENDOR_ID, regs::DEVICE_ID, 0x03, 0x02, 0x00);
        config.set_raw(0x08, &[1]);
        // INTA, routed to IRQ 11 (vmm's layout.rs GPU_INTX_IRQ).
        config.set_interrupt(1, 11);
        config.add_bar(
            0,
            BarSpec {
                kind: BarKind::Mmio32,
                size: regs::BAR0_SIZE,
                prefetchable: false,
            },
        )?;
        config.add_bar(
            1,
            BarSpec {
                kind: BarKind::Mmio64,
                size: cfg.vram,
                prefetchable: true,
            },
        )?;
        let msi_cap = config.add_msi().ok_or(PciError::BarSlot(0))?;
        Ok(VgpuDevice {
            config,
            msi_cap,
            cfg,
            engine,
            vram_base,
            shared,
            layout,
            timer_hi_latch: 0,
            para: None,
            remap: None,
            bell_ram: None,
            bell_hi: 0,
            alloc_va: 0,
            alloc_len: 0,
            write_log: None,
        })
    }

    /// Takes the guest's declared allocations (`ALLOC_DECLARE`) into `log`.
    pub fn attach_write_log(&mut self, log: Arc<crate::snapshot::writes::WriteSetLog>) {
        self.write_log = Some(log);
    }

    /// Maps the VRAM aperture into the guest where it can (BAR remap; before the device is on
    /// a bus, which reports where BAR1 decodes through `bar_moved`).
    pub fn attach_remap(&mut self, remap: Arc<Mutex<Remap>>) {
        self.remap = Some(remap);
    }

    /// Offers the doorbell page (CAPS bit 5, `BELL_PAGE_LO/_HI`) over guest RAM `ram`.
    pub fn attach_bell(&mut self, ram: vm_memory::GuestMemoryMmap) {
        self.bell_ram = Some(ram);
    }

    /// A write of `BELL_PAGE_LO` (`v`) with `BELL_PAGE_HI` as last written: enables the page
    /// at that address (bits 11:1 zero, the page inside one RAM region), or disables it (bit 0
    /// clear). A refused address is a BAD_REGISTER fault; the page in use stays as it was.
    fn set_bell(&mut self, r: &mut crate::state::Regs, v: u32) {
        let Some(ram) = &self.bell_ram else { return };
        let shared = self.shared.clone();
        if v & regs::BELL_ENABLE == 0 {
            r.bell = None;
            return;
        }
        let addr = u64::from(self.bell_hi) << 32 | u64::from(v & !0xfff);
        let ok = v & 0xffe == 0
            && self
                .layout
                .check_range(shadow::Aperture::Sysmem, addr, vgpu_hw::bell::PAGE_BYTES)
                .is_ok();
        if !ok {
            r.counters.bell.refused += 1;
            shared.device_fault(r, FaultKind::BadRegister, addr, regs::BELL_PAGE_LO);
            return;
        }
        r.bell = Some(crate::bell::BellPage::new(ram.clone(), addr));
        for n in 0..r.chans.len() as u32 {
            crate::state::Shared::mirror(r, n);
        }
        shared.wake.notify_all();
    }

    /// Whether a doorbell page at `addr` would be accepted (`set_bell`'s checks), for a
    /// snapshot's page before anything of the snapshot is applied.
    pub(crate) fn bell_allowed(&self, addr: u64) -> bool {
        self.bell_ram.is_some()
            && addr & 0xfff == 0
            && self
                .layout
                .check_range(shadow::Aperture::Sysmem, addr, vgpu_hw::bell::PAGE_BYTES)
                .is_ok()
    }

    /// Puts a snapshot's doorbell page in place (checked by `bell_allowed` first) with the
    /// `PUT` values the worker had acted on and its `WAKE`; `BELL_PAGE_HI` reads back its
    /// high half.
    pub(crate) fn restore_bell(&mut self, b: &crate::snapshot::regs_image::BellImage) {
        let Some(ram) = &self.bell_ram else { return };
        let mut page = crate::bell::BellPage::new(ram.clone(), b.addr);
        for (seen, v) in page.seen.iter_mut().zip(&b.seen) {
            *seen = *v;
        }
        page.set_wake(b.wake);
        self.bell_hi = (b.addr >> 32) as u32;
        let mut r = self.shared.lock();
        r.bell = Some(page);
        for n in 0..r.chans.len() as u32 {
            crate::state::Shared::mirror(&r, n);
        }
    }

    /// Keeps the page holding guest VRAM `addr` trapping (it holds a GPU structure now);
    /// not in `mode=pt`, where the device watches no guest structure.
    fn retrap(&self, addr: u64) {
        if self.cfg.mode == crate::config::Mode::Pt {
            return;
        }
        if let Some(r) = &self.remap {
            r.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .trap([addr]);
        }
    }

    /// Adds the para-virtual interface: BAR3 and CAPS bit 4 (before the device is on a bus).
    pub fn attach_para(&mut self, para: crate::para_bar::Para) -> Result<(), PciError> {
        self.config.add_bar(
            3,
            BarSpec {
                kind: BarKind::Mmio32,
                size: crate::para::BAR_SIZE,
                prefetchable: false,
            },
        )?;
        self.para = Some(para);
        Ok(())
    }

    /// The para-virtual front end, if attached (snapshot).
    pub(crate) fn para_front(&mut self) -> Option<&mut crate::para_bar::Para> {
        self.para.as_mut()
    }

    /// Reads or writes guest VRAM `[addr, addr + len)` through the aperture; out-of-range
    /// accesses read all-ones and are dropped.
    fn vram_access(&self, addr: u64, read: Option<&mut [u8]>, write: Option<&[u8]>) {
        let len = read
            .as_ref()
            .map(|b| b.len())
            .or(write.map(|b| b.len()))
            .unwrap_or(0) as u64;
        let inside = addr
            .checked_add(len)
            .is_some_and(|end| end <= self.cfg.vram);
        match (read, write) {
            (Some(buf), _) => {
                if !inside || self.engine.vram_read(self.vram_base + addr, buf).is_err() {
                    buf.fill(0xff);
                }
            }
            (None, Some(data)) => {
                if !inside {
                    log::debug!("vgpu: aperture write past VRAM at {addr:#x} dropped");
                    return;
                }
                if let Err(e) = self.engine.vram_write(self.vram_base + addr, data) {
                    log::warn!("vgpu: VRAM write at {addr:#x}: {e}");
                }
                self.notice_write(addr, len);
            }
            (None, None) => {}
        }
    }

    /// Marks what a guest write to VRAM touched: instance blocks to re-read, table writes.
    fn notice_write(&self, addr: u64, len: u64) {
        let mut r = self.shared.lock();
        if r.watched.is_empty() {
            return;
        }
        let (first, last) = (addr >> 12, (addr + len.max(1) - 1) >> 12);
        for page in first..=last {
            match r.watched.get(&page).copied() {
                Some(Watched::Instance(mask)) => {
                    r.counters.instance_writes_noticed += 1;
                    for (i, c) in r.chans.iter_mut().enumerate() {
                        if mask & (1 << i) != 0 {
                            c.inst_dirty = true;
                        }
                    }
                }
                Some(Watched::Table) => r.counters.table_writes_noticed += 1,
                None => {}
            }
        }
    }

    fn read_reg(&mut self, off: u32) -> u32 {
        let c = &self.cfg;
        let r = self.shared.lock();
        let chans = r.chans.len() as u32;
        match off {
            regs::ID => regs::ID_VALUE,
            regs::VERSION => regs::VERSION_VALUE,
            regs::VRAM_SIZE_LO => c.vram as u32,
            regs::VRAM_SIZE_HI => (c.vram >> 32) as u32,
            regs::CHANNELS => c.channels,
            regs::PAGE_SIZES => self.page_sizes(),
            regs::VA_BASE_LO => c.va_base as u32,
            regs::VA_BASE_HI => (c.va_base >> 32) as u32,
            regs::VA_SIZE_LO => c.va_size as u32,
            regs::VA_SIZE_HI => (c.va_size >> 32) as u32,
            regs::CAPS => {
                let para = if self.para.is_some() {
                    regs::CAP_PARA
                } else {
                    0
                };
                let bell = if self.bell_ram.is_some() {
                    regs::CAP_BELL
                } else {
                    0
                };
                regs::CAP_COPY | regs::CAP_COMPUTE | regs::CAP_SYSMEM | regs::CAP_MSI | para | bell
            }
            regs::BELL_PAGE_LO if self.bell_ram.is_some() => r
                .bell
                .as_ref()
                .map_or(0, |b| b.addr() as u32 | regs::BELL_ENABLE),
            regs::BELL_PAGE_HI if self.bell_ram.is_some() => {
                r.bell.as_ref().map_or(0, |b| (b.addr() >> 32) as u32)
            }
            regs::MAX_PUSH_WORDS => regs::MAX_PUSH,
            regs::TIMER_LO => {
                let t = self.shared.timer_ns();
                self.timer_hi_latch = (t >> 32) as u32;
                t as u32
            }
            regs::TIMER_HI => self.timer_hi_latch,
            regs::INTR_STATUS => r.intr_status,
            regs::INTR_ENABLE => r.intr_enable,
            regs::INTR_CHANNELS => r.intr_channels,
            regs::PRAMIN_BASE => r.pramin_base,
            regs::RUNLIST_BASE => r.runlist_base,
            regs::FAULT_STATUS => r.fault.map_or(0, |f| {
                1 << 31 | (f.access as u32) << 16 | u32::from(f.kind.code())
            }),
            regs::FAULT_CHANNEL => r.fault.map_or(0, |f| f.channel),
            regs::FAULT_ADDR_LO => r.fault.map_or(0, |f| f.addr as u32),
            regs::FAULT_ADDR_HI => r.fault.map_or(0, |f| (f.addr >> 32) as u32),
            regs::FAULT_INFO => r.fault.map_or(0, |f| f.info),
            regs::ALLOC_VA_LO
            | regs::ALLOC_VA_HI
            | regs::ALLOC_LEN_LO
            | regs::ALLOC_LEN_HI
            | regs::ALLOC_DECLARE => 0,
            o => match regs::chan_reg(o) {
                Some((reg, n)) if n < chans => {
                    let ch = &r.chans[n as usize];
                    match reg {
                        ChanReg::Inst => ch.inst,
                        ChanReg::Status => ch.state | u32::from(ch.fault_kind) << 8,
                        ChanReg::GpPut => ch.gp_put,
                        ChanReg::GpGet => ch.gp_get,
                    }
                }
                _ => 0xffff_ffff,
            },
        }
    }

    fn page_sizes(&self) -> u32 {
        self.engine
            .info()
            .page_sizes
            .iter()
            .fold(0, |m, p| match p {
                pgpu::PageSize::Size4K => m | 1,
                pgpu::PageSize::Size2M => m | 2,
            })
    }

    fn write_reg(&mut self, off: u32, v: u32) {
        let shared = self.shared.clone();
        let mut r = shared.lock();
        let chans = r.chans.len() as u32;
        let vram = self.cfg.vram;
        match off {
            regs::INTR_STATUS => {
                r.intr_status &= !v;
                shared.update_irq(&mut r);
            }
            regs::INTR_ENABLE => {
                r.intr_enable = v & (regs::INTR_SEMAPHORE | regs::INTR_FAULT);
                shared.update_irq(&mut r);
            }
            regs::INTR_CHANNELS => r.intr_channels &= !v,
            regs::PRAMIN_BASE => {
                if (u64::from(v) << 16) + regs::PRAMIN_SIZE <= vram {
                    r.pramin_base = v;
                } else {
                    shared.device_fault(&mut r, FaultKind::BadRegister, u64::from(v) << 16, off);
                }
            }
            regs::TLB_FLUSH => {
                r.flush_epoch += 1;
                r.counters.tlb_flushes += 1;
                shared.wake.notify_all();
                if !self.cfg.lazy_shadowing {
                    // Naive full virtualization: the flush write returns once every shadow has
                    // been rebuilt (bounded by the job limit plus a second).
                    let target = r.flush_epoch;
                    let deadline = std::time::Instant::now()
                        + self.cfg.job_timeout
                        + std::time::Duration::from_secs(1);
                    while r.flushed_epoch < target && !r.shutdown {
                        let left = deadline.saturating_duration_since(std::time::Instant::now());
                        if left.is_zero() {
                            log::warn!(
                                "vgpu: TLB flush {target} not done within the limit; not waiting longer"
                            );
                            break;
                        }
                        r = shared
                            .flushed
                            .wait_timeout(r, left)
                            .map(|(g, _)| g)
                            .unwrap_or_else(|e| e.into_inner().0);
                    }
                }
            }
            regs::RUNLIST_BASE => r.runlist_base = v,
            regs::ALLOC_VA_LO => self.alloc_va = self.alloc_va & !0xffff_ffff | u64::from(v),
            regs::ALLOC_VA_HI => {
                self.alloc_va = self.alloc_va & 0xffff_ffff | u64::from(v) << 32;
            }
            regs::ALLOC_LEN_LO => self.alloc_len = self.alloc_len & !0xffff_ffff | u64::from(v),
            regs::ALLOC_LEN_HI => {
                self.alloc_len = self.alloc_len & 0xffff_ffff | u64::from(v) << 32;
            }
            regs::ALLOC_DECLARE => {
                if let Some(l) = &self.write_log {
                    let window = (self.cfg.va_base, self.cfg.va_size);
                    l.declare(v, self.alloc_va, self.alloc_len, window);
                }
            }
            regs::BELL_PAGE_HI if self.bell_ram.is_some() => self.bell_hi = v,
            regs::BELL_PAGE_LO if self.bell_ram.is_some() => self.set_bell(&mut r, v),
            regs::RUNLIST_SUBMIT => {
                drop(r);
                self.submit_runlist(v);
            }
            regs::FAULT_CLEAR => {
                if v & 1 != 0 {
                    r.fault = None;
                    r.intr_status &= !regs::INTR_FAULT;
                    shared.update_irq(&mut r);
                }
            }
            o if matches!(regs::chan_reg(o), Some((ChanReg::Inst, _))) => {
                let n = (o - regs::CHAN_BASE) / regs::CHAN_STRIDE;
                if n >= chans {
                    let rec = FaultRecord {
                        kind: FaultKind::BadChannel,
                        access: Access::None,
                        channel: 0xffff,
                        addr: u64::from(n),
                        info: v,
                    };
                    shared.fault(&mut r, rec);
                    return;
                }
                let addr = u64::from(v & 0x0fff_ffff) << 12;
                if v & regs::CHAN_INST_VALID != 0 && addr + 4096 > vram {
                    shared.device_fault(&mut r, FaultKind::BadRegister, addr, off);
                    return;
                }
                let ch = &mut r.chans[n as usize];
                ch.inst = v;
                ch.binding = ch.binding.wrapping_add(1);
                ch.gp_put = 0;
                ch.gp_get = 0;
                ch.fault_kind = 0;
                ch.inst_dirty = true;
                ch.rung_at = None;
                ch.state = if v & regs::CHAN_INST_VALID != 0 {
                    regs::CHAN_IDLE
                } else {
                    regs::CHAN_UNBOUND
                };
                if let Some(b) = r.bell.as_mut() {
                    b.reset_put(n);
                }
                crate::state::Shared::mirror(&r, n);
                if v & regs::CHAN_INST_VALID != 0 {
                    // The page becomes an instance block now: it traps from this write on.
                    self.retrap(addr);
                    // The spec: the instance block is read when CHAN_INST is written.
                    let mut bytes = [0u8; shadow::INSTANCE_BYTES];
                    let parsed = self
                        .engine
                        .vram_read(self.vram_base + addr, &mut bytes)
                        .map_err(|_| {
                            shadow::GuestFault::new(
                                FaultKind::BadInstance,
                                shadow::Rule::InstanceOutsideVram,
                                addr,
                                0,
                            )
                        })
                        .and_then(|()| shadow::Instance::parse(&self.layout, addr, &bytes));
                    if let Err(f) = parsed {
                        let rec = FaultRecord {
                            kind: f.kind,
                            access: Access::None,
                            channel: n,
                            addr: f.addr,
                            info: f.info,
                        };
                        shared.fault(&mut r, rec);
                    }
                }
            }
            o if matches!(regs::chan_reg(o), Some((ChanReg::GpPut, _))) => {
                let n = (o - regs::DOORBELL_BASE) / regs::CHAN_STRIDE;
                if !shared.ring(&mut r, n, v) {
                    return;
                }
                shared.wake.notify_all();
            }
            _ => {
                log::debug!("vgpu: write {v:#x} to read-only or unknown register {off:#x} ignored")
            }
        }
    }

    fn submit_runlist(&mut self, n: u32) {
        let shared = self.shared.clone();
        let base = u64::from(shared.lock().runlist_base) << 12;
        let chans = self.cfg.channels;
        let mut ids = vec![0u8; 4 * n.min(chans) as usize];
        let read_ok = n <= chans
            && base + ids.len() as u64 <= self.cfg.vram
            && self
                .engine
                .vram_read(self.vram_base + base, &mut ids)
                .is_ok();
        let mut r = shared.lock();
        if !read_ok {
            shared.device_fault(&mut r, FaultKind::BadRunlist, base, n);
            return;
        }
        let list: Vec<u32> = ids
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(bad) = list.iter().find(|&&id| {
            r.chans
                .get(id as usize)
                .is_none_or(|c| c.state == regs::CHAN_UNBOUND)
        }) {
            shared.device_fault(&mut r, FaultKind::BadRunlist, base, *bad);
            return;
        }
        r.runlist = list;
        shared.wake.notify_all();
    }
}

fn le(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b[..data.len().min(4)].copy_from_slice(&data[..data.len().min(4)]);
    u32::from_le_bytes(b)
}

impl PciDevice for VgpuDevice {
    fn config(&self) -> &PciConfig {
        &self.config
    }
    fn config_mut(&mut self) -> &mut PciConfig {
        &mut self.config
    }

    fn bar_moved(&mut self, bar: usize, addr: Option<u64>) {
        if bar == 0 && addr.is_some() {
            // The registers decode again (memory decode back on, or BAR0 moved). A trapped
            // GP_PUT written meanwhile reached no device, but with exitless submission the
            // doorbell page still says PUT[n] changed: the sleeping worker looks at it now
            // (under the lock it sleeps with, so the wake-up is not lost) instead of leaving
            // that work until some other doorbell (issue 25: a job hung until the time limit).
            let _regs = self.shared.lock();
            self.shared.wake.notify_all();
        }
        if bar == 1
            && let Some(r) = &self.remap
        {
            r.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .bar_moved(addr);
        }
    }

    fn config_written(&mut self, _offset: usize, _len: usize) {
        let msg = self.config.msi_message(self.msi_cap);
        *self
            .shared
            .msi
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = msg;
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        self.shared.traps.fetch_add(1, Ordering::Relaxed);
        match bar {
            0 if offset >= u64::from(regs::REGS_END) => {
                let base = u64::from(self.shared.lock().pramin_base) << 16;
                let off = offset - u64::from(regs::PRAMIN_WINDOW);
                self.vram_access(base + off, Some(data), None);
            }
            0 if data.len() == 4 && offset.is_multiple_of(4) => {
                data.copy_from_slice(&self.read_reg(offset as u32).to_le_bytes())
            }
            1 => self.vram_access(offset, Some(data), None),
            3 if data.len() == 4 && offset.is_multiple_of(4) && self.para.is_some() => {
                let v = self.para.as_ref().map_or(u32::MAX, |p| p.read(offset));
                data.copy_from_slice(&v.to_le_bytes());
            }
            _ => data.fill(0xff),
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        self.shared.traps.fetch_add(1, Ordering::Relaxed);
        match bar {
            0 if offset >= u64::from(regs::REGS_END) => {
                let base = u64::from(self.shared.lock().pramin_base) << 16;
                let off = offset - u64::from(regs::PRAMIN_WINDOW);
                self.vram_access(base + off, None, Some(data));
            }
            0 if data.len() == 4 && offset.is_multiple_of(4) => {
                self.write_reg(offset as u32, le(data))
            }
            1 => self.vram_access(offset, None, Some(data)),
            3 if data.len() == 4 && offset.is_multiple_of(4) && self.para.is_some() => {
                if let Some(p) = self.para.as_mut() {
                    p.write(offset, le(data));
                }
            }
            _ => log::debug!(
                "vgpu: {}-byte write to BAR{bar} at {offset:#x} ignored",
                data.len()
            ),
        }
    }
}
