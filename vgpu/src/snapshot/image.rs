//! What a snapshot holds besides VRAM, in memory: the configuration it was taken under, the
//! register file (`RegsImage`), and the worker's state (`WorkerImage`); their section
//! encodings, and decoding that validates every field against this device's configuration
//! before anything is applied (docs/snapshot.md, "Virtual GPU").

use std::sync::Arc;

use pgpu::{ModuleId, SavedContext};

use super::SnapshotError;
use super::format::{Dec, Enc};
use crate::methods::MethodState;
use crate::pushbuf::{DecodeError, MethodCall};
use crate::regs::{self, Access, FaultKind};
use crate::state::{ChanRegs, FaultRecord, GpuCounters, Regs, Shared, Watched};

/// Pause control, in the register lock: set by `Vgpu::pause`, acknowledged by the worker.
#[derive(Debug, Default)]
pub struct PauseCtl {
    /// A pause is requested: the worker parks before its next turn.
    pub requested: bool,
    /// The worker is parked (its state is in `image`).
    pub parked: bool,
    /// `image` was replaced by a restore: the worker takes it back when it unparks.
    pub restored: bool,
    pub image: Option<Box<WorkerImage>>,
}

/// The worker's state.
#[derive(Debug, Clone)]
pub struct WorkerImage {
    /// The last TLB-flush epoch handled eagerly.
    pub seen_epoch: u64,
    /// Where the round-robin continues.
    pub next: u32,
    /// Per channel: pushbuffer and method state of the current binding.
    pub chans: Vec<Option<ChanImage>>,
    /// Cached modules, least recently used first.
    pub modules: Vec<ModuleImage>,
    /// Jobs preempted by pauses (at most one per channel: a channel whose job a pause
    /// preempted keeps it until its next turn, while other channels may run and be paused).
    pub suspended: Vec<SuspendedImage>,
}

/// A cached module: its text; `id` and `host_bytes` of the engine module (on export the old
/// engine's, after a restore the reloaded one's).
#[derive(Debug, Clone)]
pub struct ModuleImage {
    pub text: Arc<str>,
    pub id: ModuleId,
    pub host_bytes: u64,
}

/// A channel's pushbuffer position and method registers.
#[derive(Debug, Clone)]
pub struct ChanImage {
    pub methods: MethodState,
    pub calls: Vec<MethodCall>,
    pub pos: u32,
    pub in_segment: bool,
    pub decode_error: Option<DecodeError>,
}

/// A job preempted by the pause.
#[derive(Debug, Clone)]
pub struct SuspendedImage {
    pub channel: u32,
    /// The engine (`EngineInfo::name`) whose context this is.
    pub backend: String,
    pub gpu_ns: u64,
    /// Index of its module in `WorkerImage::modules` (launches).
    pub module: Option<u32>,
    pub context: SavedContext,
}

/// The configuration a snapshot was taken under (what the guest saw).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfImage {
    pub vram: u64,
    pub channels: u32,
    pub va_base: u64,
    pub va_size: u64,
    /// The PAGE_SIZES register.
    pub page_sizes: u32,
    /// The engine's name.
    pub backend: String,
}

impl ConfImage {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.vram)
            .u32(self.channels)
            .u64(self.va_base)
            .u64(self.va_size)
            .u32(self.page_sizes)
            .bytes(self.backend.as_bytes());
        e.0
    }

    pub fn decode(b: &[u8]) -> Result<Self, SnapshotError> {
        let mut d = Dec::new(b, "CONF");
        let c = ConfImage {
            vram: d.u64()?,
            channels: d.u32()?,
            va_base: d.u64()?,
            va_size: d.u64()?,
            page_sizes: d.u32()?,
            backend: d.string(64, "backend name")?,
        };
        d.end()?;
        Ok(c)
    }

    /// Refuses a snapshot the guest could tell apart from this device.
    pub fn check(&self, here: &ConfImage) -> Result<(), SnapshotError> {
        let same = |what: &'static str, saved: u64, here: u64| {
            if saved == here {
                Ok(())
            } else {
                Err(SnapshotError::Config { what, saved, here })
            }
        };
        same("VRAM size", self.vram, here.vram)?;
        same(
            "channels",
            u64::from(self.channels),
            u64::from(here.channels),
        )?;
        same("VA base", self.va_base, here.va_base)?;
        same("VA size", self.va_size, here.va_size)?;
        // The guest may use any page size it was offered.
        if self.page_sizes & !here.page_sizes != 0 {
            return Err(SnapshotError::Config {
                what: "page sizes (PAGE_SIZES bits)",
                saved: u64::from(self.page_sizes),
                here: u64::from(here.page_sizes),
            });
        }
        Ok(())
    }
}

impl Dec<'_> {
    fn clone_bytes(&mut self, max: usize, what: &str) -> Result<Vec<u8>, SnapshotError> {
        Ok(self.bytes(max, what)?.to_vec())
    }
    fn string(&mut self, max: usize, what: &str) -> Result<String, SnapshotError> {
        let b = self.bytes(max, what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(self.bad(format!("{what} is not UTF-8"))),
        }
    }
}

/// Per-channel registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChanRegsImage {
    pub inst: u32,
    pub state: u32,
    pub fault_kind: u8,
    pub gp_put: u32,
    pub gp_get: u32,
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
}

/// How many counters a snapshot keeps (`GpuCounters`' numbers, in declaration order).
pub const COUNTERS: usize = 17;

fn counters_of(c: &GpuCounters) -> [u64; COUNTERS] {
    [
        c.doorbells,
        c.tlb_flushes,
        c.shadow_rebuilds,
        c.pages_shadowed,
        c.pages_unshadowed,
        c.table_writes_noticed,
        c.instance_writes_noticed,
        c.gpfifo_entries,
        c.methods,
        c.copies,
        c.launches,
        c.releases,
        c.acquires,
        c.interrupts,
        c.faults,
        c.faults_dropped,
        c.gpu_ns,
    ]
}

fn set_counters(c: &mut GpuCounters, v: &[u64; COUNTERS]) {
    [
        c.doorbells,
        c.tlb_flushes,
        c.shadow_rebuilds,
        c.pages_shadowed,
        c.pages_unshadowed,
        c.table_writes_noticed,
        c.instance_writes_noticed,
        c.gpfifo_entries,
        c.methods,
        c.copies,
        c.launches,
        c.releases,
        c.acquires,
        c.interrupts,
        c.faults,
        c.faults_dropped,
        c.gpu_ns,
    ] = *v;
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
        })
    }
}

/// Decode errors in the snapshot: (tag, index, header, extra).
fn decode_error_fields(e: &DecodeError) -> (u8, u32, u32, u32) {
    match *e {
        DecodeError::Opcode {
            index,
            opcode,
            header,
        } => (1, index as u32, header, opcode),
        DecodeError::Reserved { index, header } => (2, index as u32, header, 0),
        DecodeError::Truncated {
            index,
            header,
            count,
        } => (3, index as u32, header, count),
    }
}

impl WorkerImage {
    /// The CHAN section (channels, round-robin position, flush epoch).
    pub fn encode_chans(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.seen_epoch).u32(self.next);
        e.u32(self.chans.len() as u32);
        for c in &self.chans {
            let Some(c) = c else {
                e.u8(0);
                continue;
            };
            e.u8(1);
            e.u32(MethodState::WORDS as u32);
            for w in c.methods.words() {
                e.u32(*w);
            }
            e.u32(c.calls.len() as u32);
            for call in &c.calls {
                e.u32(call.addr).u32(call.data);
            }
            e.u32(c.pos).u8(u8::from(c.in_segment));
            match &c.decode_error {
                None => {
                    e.u8(0);
                }
                Some(err) => {
                    let (tag, index, header, extra) = decode_error_fields(err);
                    e.u8(tag).u32(index).u32(header).u32(extra);
                }
            }
        }
        e.0
    }

    /// The MODS section.
    pub fn encode_modules(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u32(self.modules.len() as u32);
        for m in &self.modules {
            e.bytes(m.text.as_bytes());
        }
        e.0
    }

    /// The CTXT section.
    pub fn encode_suspended(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u32(self.suspended.len() as u32);
        for s in &self.suspended {
            e.u32(s.channel)
                .bytes(s.backend.as_bytes())
                .u64(s.gpu_ns)
                .u32(s.module.unwrap_or(u32::MAX))
                .bytes(&s.context.to_bytes());
        }
        e.0
    }

    /// Decodes the CHAN section against the registers it goes with.
    pub fn decode_chans(
        b: &[u8],
        regs: &RegsImage,
        lazy_shadowing: bool,
    ) -> Result<(u64, u32, Vec<Option<ChanImage>>), SnapshotError> {
        let mut d = Dec::new(b, "CHAN");
        let channels = regs.chans.len();
        let seen_epoch = d.u64()?;
        if !lazy_shadowing && seen_epoch > regs.flush_epoch {
            return Err(d.bad("flush epoch handled beyond the last flush"));
        }
        let next = d.u32()?;
        if next as usize >= channels.max(1) {
            return Err(d.bad(format!("next channel {next}")));
        }
        let n = d.u32()? as usize;
        if n != channels {
            return Err(d.bad(format!("{n} channels, the device has {channels}")));
        }
        let mut chans = Vec::with_capacity(n);
        for ch in 0..n {
            if !d.bool()? {
                chans.push(None);
                continue;
            }
            let words = d.u32()? as usize;
            if words != MethodState::WORDS {
                return Err(d.bad(format!("channel {ch}: {words} method registers")));
            }
            let w = (0..words).map(|_| d.u32()).collect::<Result<Vec<_>, _>>()?;
            let methods = MethodState::from_words(&w)
                .ok_or_else(|| d.bad(format!("channel {ch}: method registers")))?;
            let ncalls = d.count(regs::MAX_PUSH as usize, 8, "method calls")?;
            let mut calls = Vec::with_capacity(ncalls);
            for _ in 0..ncalls {
                calls.push(MethodCall {
                    addr: d.u32()?,
                    data: d.u32()?,
                });
            }
            let pos = d.u32()?;
            let in_segment = d.bool()?;
            if pos as usize > calls.len() {
                return Err(d.bad(format!("channel {ch}: position {pos} past its calls")));
            }
            if in_segment && regs.chans[ch].state == regs::CHAN_UNBOUND {
                return Err(d.bad(format!("channel {ch}: in a segment but unbound")));
            }
            let decode_error = match d.u8()? {
                0 => None,
                tag => {
                    let (index, header, extra) = (d.u32()? as usize, d.u32()?, d.u32()?);
                    if index >= regs::MAX_PUSH as usize {
                        return Err(d.bad(format!("channel {ch}: decode error at word {index}")));
                    }
                    Some(match tag {
                        1 => DecodeError::Opcode {
                            index,
                            opcode: extra,
                            header,
                        },
                        2 => DecodeError::Reserved { index, header },
                        3 => DecodeError::Truncated {
                            index,
                            header,
                            count: extra,
                        },
                        t => return Err(d.bad(format!("channel {ch}: decode error kind {t}"))),
                    })
                }
            };
            chans.push(Some(ChanImage {
                methods,
                calls,
                pos,
                in_segment,
                decode_error,
            }));
        }
        d.end()?;
        Ok((seen_epoch, next, chans))
    }

    /// Decodes the MODS section: at most `max_modules` texts of at most `MAX_CODE_LEN` bytes,
    /// `max_total` in all, no text twice.
    pub fn decode_modules(
        b: &[u8],
        max_modules: usize,
        max_total: u64,
    ) -> Result<Vec<Arc<str>>, SnapshotError> {
        let mut d = Dec::new(b, "MODS");
        let n = d.count(max_modules, 4, "modules")?;
        let mut texts: Vec<Arc<str>> = Vec::with_capacity(n);
        let mut total = 0u64;
        for i in 0..n {
            let t = d.bytes(regs::MAX_CODE_LEN as usize, "module text")?;
            total += t.len() as u64;
            if total > max_total {
                return Err(d.bad(format!("module texts over {max_total} bytes")));
            }
            let t = std::str::from_utf8(t)
                .map_err(|_| d.bad(format!("module {i}: text is not UTF-8")))?;
            if texts.iter().any(|x| &**x == t) {
                return Err(d.bad(format!("module {i}: the same text twice")));
            }
            texts.push(Arc::from(t));
        }
        d.end()?;
        Ok(texts)
    }

    /// Decodes the CTXT section: each suspended job must sit on its channel's launch or copy
    /// method (one per channel), name a saved module, and all fit `max_context` bytes.
    pub fn decode_suspended(
        b: &[u8],
        chans: &[Option<ChanImage>],
        modules: usize,
        max_context: usize,
    ) -> Result<Vec<SuspendedImage>, SnapshotError> {
        let mut d = Dec::new(b, "CTXT");
        let n = d.count(chans.len(), 24, "suspended jobs")?;
        let mut out: Vec<SuspendedImage> = Vec::with_capacity(n);
        let mut left = max_context;
        for _ in 0..n {
            let s = Self::decode_one_suspended(&mut d, chans, modules, left)?;
            if out.iter().any(|o| o.channel == s.channel) {
                return Err(d.bad(format!("two suspended jobs on channel {}", s.channel)));
            }
            left -= s.context.to_bytes().len();
            out.push(s);
        }
        d.end()?;
        Ok(out)
    }

    fn decode_one_suspended(
        d: &mut Dec<'_>,
        chans: &[Option<ChanImage>],
        modules: usize,
        max_context: usize,
    ) -> Result<SuspendedImage, SnapshotError> {
        let channel = d.u32()?;
        let backend = d.string(64, "backend name")?;
        let gpu_ns = d.u64()?;
        let module = match d.u32()? {
            u32::MAX => None,
            i if (i as usize) < modules => Some(i),
            i => return Err(d.bad(format!("module index {i} of {modules}"))),
        };
        let context = d.clone_bytes(max_context, "job context")?;
        let c = chans
            .get(channel as usize)
            .and_then(|c| c.as_ref())
            .ok_or_else(|| d.bad(format!("suspended job on channel {channel} without state")))?;
        let method = c
            .in_segment
            .then(|| c.calls.get(c.pos as usize))
            .flatten()
            .map(|call| call.addr);
        let want_module = match method {
            Some(regs::method::LAUNCH) => true,
            Some(regs::method::COPY_LAUNCH) => false,
            _ => {
                return Err(d.bad(format!(
                    "suspended job on channel {channel}, which is not at a launch or copy"
                )));
            }
        };
        if want_module != module.is_some() {
            return Err(d.bad("a launch's module missing (or a copy's given)"));
        }
        Ok(SuspendedImage {
            channel,
            backend,
            gpu_ns,
            module,
            context: SavedContext::from_bytes(context),
        })
    }
}
