//! The REGS section: the register file and device bookkeeping (interrupts, channels, the fault
//! record, the flush epoch, watched VRAM pages, counters, TIMER), captured from and applied to
//! `state::Regs`, decoded with every value checked against the device's VRAM and channels.

use super::SnapshotError;
use super::format::{Dec, Enc};
use crate::regs::{self, Access, FaultKind};
use crate::state::{ChanRegs, FaultRecord, GpuCounters, Regs, Shared, Watched};

/// Per-channel registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChanRegsImage {
    pub inst: u32,
    pub state: u32,
    pub fault_kind: u8,
    pub gp_put: u32,
    pub gp_get: u32,
}

/// The doorbell page of exitless submission, while enabled (`bell`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BellImage {
    /// Guest-physical address (4 KiB aligned; checked against guest RAM at restore).
    pub addr: u64,
    /// `PUT[n]` as the worker last acted on it, per channel.
    pub seen: Vec<u32>,
    /// `WAKE` as the device last wrote it.
    pub wake: bool,
}

/// The register file and device bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegsImage {
    pub timer_ns: u64,
    pub intr_status: u32,
    pub intr_enable: u32,
    pub intr_channels: u32,
    pub pramin_base: u32,
    pub runlist_base: u32,
    pub runlist: Vec<u32>,
    pub chans: Vec<ChanRegsImage>,
    pub fault: Option<FaultRecord>,
    pub flush_epoch: u64,
    /// Guest VRAM pages holding GPU structures, ascending.
    pub watched: Vec<(u64, Watched)>,
    pub counters: [u64; COUNTERS],
    pub irq_line: bool,
    /// The doorbell page (`BELL_PAGE_LO/_HI`), when the guest enabled one.
    pub bell: Option<BellImage>,
}

/// How many counters a snapshot keeps (`GpuCounters`' numbers, in declaration order).
pub const COUNTERS: usize = 17;

/// The kept counters, in the snapshot's order (one list for saving and restoring).
fn counter_fields(c: &mut GpuCounters) -> [&mut u64; COUNTERS] {
    [
        &mut c.doorbells,
        &mut c.tlb_flushes,
        &mut c.shadow_rebuilds,
        &mut c.pages_shadowed,
        &mut c.pages_unshadowed,
        &mut c.table_writes_noticed,
        &mut c.instance_writes_noticed,
        &mut c.gpfifo_entries,
        &mut c.methods,
        &mut c.copies,
        &mut c.launches,
        &mut c.releases,
        &mut c.acquires,
        &mut c.interrupts,
        &mut c.faults,
        &mut c.faults_dropped,
        &mut c.gpu_ns,
    ]
}

fn counters_of(c: &GpuCounters) -> [u64; COUNTERS] {
    counter_fields(&mut c.clone()).map(|v| *v)
}

fn set_counters(c: &mut GpuCounters, v: &[u64; COUNTERS]) {
    for (field, value) in counter_fields(c).into_iter().zip(v) {
        *field = *value;
    }
}

impl RegsImage {
    /// The registers now (device paused).
    pub fn capture(r: &Regs, timer_ns: u64) -> Self {
        let mut watched: Vec<(u64, Watched)> = r.watched.iter().map(|(p, w)| (*p, *w)).collect();
        watched.sort_by_key(|(p, _)| *p);
        RegsImage {
            timer_ns,
            intr_status: r.intr_status,
            intr_enable: r.intr_enable,
            intr_channels: r.intr_channels,
            pramin_base: r.pramin_base,
            runlist_base: r.runlist_base,
            runlist: r.runlist.clone(),
            chans: r
                .chans
                .iter()
                .map(|c| ChanRegsImage {
                    inst: c.inst,
                    state: c.state,
                    fault_kind: c.fault_kind,
                    gp_put: c.gp_put,
                    gp_get: c.gp_get,
                })
                .collect(),
            fault: r.fault,
            flush_epoch: r.flush_epoch,
            watched,
            counters: counters_of(&r.counters),
            irq_line: Shared::irq_line(r),
            bell: r.bell.as_ref().map(|b| BellImage {
                addr: b.addr(),
                seen: b.seen[..r.chans.len()].to_vec(),
                wake: b.wake,
            }),
        }
    }

    /// Puts the registers in place (device paused, fresh). Instance blocks are re-read and
    /// shadows rebuilt before each channel runs again; a channel caught running is pending.
    pub fn apply(&self, r: &mut Regs) {
        r.intr_status = self.intr_status;
        r.intr_enable = self.intr_enable;
        r.intr_channels = self.intr_channels;
        r.pramin_base = self.pramin_base;
        r.runlist_base = self.runlist_base;
        r.runlist = self.runlist.clone();
        for (c, s) in r.chans.iter_mut().zip(&self.chans) {
            *c = ChanRegs {
                inst: s.inst,
                state: if s.state == regs::CHAN_RUNNING {
                    regs::CHAN_PENDING
                } else {
                    s.state
                },
                fault_kind: s.fault_kind,
                gp_put: s.gp_put,
                gp_get: s.gp_get,
                inst_dirty: true,
                binding: c.binding,
                // Path timing of a doorbell rung before the snapshot is not carried over.
                rung_at: None,
            };
        }
        r.fault = self.fault;
        r.flush_epoch = self.flush_epoch;
        r.flushed_epoch = self.flush_epoch;
        r.watched = self.watched.iter().copied().collect();
        set_counters(&mut r.counters, &self.counters);
        Shared::set_irq_line(r, self.irq_line);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.timer_ns)
            .u32(self.intr_status)
            .u32(self.intr_enable)
            .u32(self.intr_channels)
            .u32(self.pramin_base)
            .u32(self.runlist_base);
        e.u32(self.runlist.len() as u32);
        for id in &self.runlist {
            e.u32(*id);
        }
        e.u32(self.chans.len() as u32);
        for c in &self.chans {
            e.u32(c.inst)
                .u32(c.state)
                .u8(c.fault_kind)
                .u32(c.gp_put)
                .u32(c.gp_get);
        }
        match &self.fault {
            None => {
                e.u8(0);
            }
            Some(f) => {
                e.u8(1)
                    .u8(f.kind.code())
                    .u8(f.access as u8)
                    .u32(f.channel)
                    .u64(f.addr)
                    .u32(f.info);
            }
        }
        e.u64(self.flush_epoch);
        e.u32(self.watched.len() as u32);
        for (page, w) in &self.watched {
            e.u64(*page);
            match w {
                Watched::Instance(mask) => e.u8(1).u32(*mask),
                Watched::Table => e.u8(2).u32(0),
            };
        }
        for v in self.counters {
            e.u64(v);
        }
        e.u8(u8::from(self.irq_line));
        match &self.bell {
            None => {
                e.u8(0);
            }
            Some(b) => {
                e.u8(1).u64(b.addr).u8(u8::from(b.wake));
                e.u32(b.seen.len() as u32);
                for v in &b.seen {
                    e.u32(*v);
                }
            }
        }
        e.0
    }

    /// Decodes and validates against a device of `vram` bytes and `channels` channels.
    pub fn decode(b: &[u8], vram: u64, channels: u32) -> Result<Self, SnapshotError> {
        let mut d = Dec::new(b, "REGS");
        let intr_known = regs::INTR_SEMAPHORE | regs::INTR_FAULT;
        let chan_bits = if channels >= 32 {
            u32::MAX
        } else {
            (1u32 << channels) - 1
        };
        let timer_ns = d.u64()?;
        let intr_status = d.u32()?;
        let intr_enable = d.u32()?;
        let intr_channels = d.u32()?;
        if (intr_status | intr_enable) & !intr_known != 0 || intr_channels & !chan_bits != 0 {
            return Err(d.bad("interrupt bits outside the defined ones"));
        }
        let pramin_base = d.u32()?;
        if (u64::from(pramin_base) << 16) + regs::PRAMIN_SIZE > vram {
            return Err(d.bad(format!("PRAMIN_BASE {pramin_base:#x} outside VRAM")));
        }
        let runlist_base = d.u32()?;
        let n = d.count(channels as usize, 4, "runlist entries")?;
        let runlist = (0..n).map(|_| d.u32()).collect::<Result<Vec<_>, _>>()?;
        let n = d.u32()?;
        if n != channels {
            return Err(d.bad(format!("{n} channels, the device has {channels}")));
        }
        let mut chans = Vec::with_capacity(channels as usize);
        for ch in 0..channels {
            let c = ChanRegsImage {
                inst: d.u32()?,
                state: d.u32()?,
                fault_kind: d.u8()?,
                gp_put: d.u32()?,
                gp_get: d.u32()?,
            };
            let valid = c.inst & regs::CHAN_INST_VALID != 0;
            let addr = u64::from(c.inst & regs::CHAN_INST_ADDR_MASK) << 12;
            if valid && addr + 4096 > vram {
                return Err(d.bad(format!(
                    "channel {ch}: instance block at {addr:#x} outside VRAM"
                )));
            }
            if c.state > regs::CHAN_FAULTED || (c.state == regs::CHAN_UNBOUND) == valid {
                return Err(d.bad(format!(
                    "channel {ch}: state {} with CHAN_INST {:#x}",
                    c.state, c.inst
                )));
            }
            if c.fault_kind != 0 && FaultKind::from_code(c.fault_kind).is_none() {
                return Err(d.bad(format!("channel {ch}: fault kind {}", c.fault_kind)));
            }
            chans.push(c);
        }
        if let Some(bad) = runlist.iter().find(|&&id| {
            chans
                .get(id as usize)
                .is_none_or(|c| c.state == regs::CHAN_UNBOUND)
        }) {
            return Err(d.bad(format!("runlist names channel {bad}, not bound")));
        }
        let fault = match d.bool()? {
            false => None,
            true => {
                let (kind, access) = (d.u8()?, d.u8()?);
                let rec = FaultRecord {
                    kind: FaultKind::from_code(kind)
                        .ok_or_else(|| d.bad(format!("fault kind {kind}")))?,
                    access: Access::from_code(access)
                        .ok_or_else(|| d.bad(format!("fault access {access}")))?,
                    channel: d.u32()?,
                    addr: d.u64()?,
                    info: d.u32()?,
                };
                if rec.channel >= channels && rec.channel != 0xffff {
                    return Err(d.bad(format!("fault on channel {}", rec.channel)));
                }
                Some(rec)
            }
        };
        let flush_epoch = d.u64()?;
        let pages = vram >> 12;
        let n = d.count(pages as usize, 13, "watched pages")?;
        let mut watched = Vec::with_capacity(n);
        for _ in 0..n {
            let page = d.u64()?;
            let (kind, mask) = (d.u8()?, d.u32()?);
            if page >= pages || watched.last().is_some_and(|(p, _)| *p >= page) {
                return Err(d.bad(format!("watched page {page:#x} (unsorted or outside VRAM)")));
            }
            let w = match kind {
                1 if mask != 0 && mask & !chan_bits == 0 => Watched::Instance(mask),
                2 if mask == 0 => Watched::Table,
                _ => {
                    return Err(d.bad(format!(
                        "watched page {page:#x}: kind {kind} mask {mask:#x}"
                    )));
                }
            };
            watched.push((page, w));
        }
        let mut counters = [0u64; COUNTERS];
        for c in &mut counters {
            *c = d.u64()?;
        }
        let irq_line = d.bool()?;
        let bell = if d.bool()? {
            let addr = d.u64()?;
            let wake = d.bool()?;
            if addr & 0xfff != 0 {
                return Err(d.bad(format!("doorbell page at {addr:#x} not 4 KiB aligned")));
            }
            let n = d.count(channels as usize, 4, "doorbell page channels")?;
            if n != channels as usize {
                return Err(d.bad(format!(
                    "doorbell page of {n} channels, the device has {channels}"
                )));
            }
            let seen = (0..n).map(|_| d.u32()).collect::<Result<Vec<_>, _>>()?;
            Some(BellImage { addr, seen, wake })
        } else {
            None
        };
        d.end()?;
        Ok(RegsImage {
            timer_ns,
            intr_status,
            intr_enable,
            intr_channels,
            pramin_base,
            runlist_base,
            runlist,
            chans,
            fault,
            flush_epoch,
            watched,
            counters,
            irq_line,
            bell,
        })
    }
}
