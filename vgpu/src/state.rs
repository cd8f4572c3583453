//! The device state shared by the register front end (vCPU threads) and the GPU worker: the
//! register file, per-channel registers, the fault record, interrupt status, and the set of
//! guest VRAM pages that hold GPU structures (whose writes the device must notice).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use mmio::pci::MsiMessage;
use serde::Serialize;

use crate::regs::{self, Access, FaultKind};

/// Delivers the device's interrupt; implemented by the VMM.
pub trait IrqSink: Send + Sync {
    /// Sends an MSI message.
    fn msi(&self, msg: MsiMessage);
    /// Drives the INTA line (level-triggered) when MSI is off.
    fn intx(&self, level: bool);
}

/// Channel registers.
#[derive(Debug, Clone, Default)]
pub struct ChanRegs {
    /// CHAN_INST as written (VALID | address >> 12).
    pub inst: u32,
    pub state: u32,
    pub fault_kind: u8,
    pub gp_put: u32,
    pub gp_get: u32,
    /// The instance block must be (re-)read before the channel runs again.
    pub inst_dirty: bool,
    /// Bumped at every CHAN_INST write (a new binding, GP_GET/GP_PUT reset): a turn the worker
    /// began under an older binding must not move this one's GP_GET.
    pub binding: u64,
    /// When the guest's latest doorbell for work not yet started arrived (trapped write or
    /// doorbell page): the start of the submission latency (`Latency::submit`).
    pub rung_at: Option<Instant>,
}

/// The first fault not yet cleared by the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FaultRecord {
    #[serde(serialize_with = "kind_code")]
    pub kind: FaultKind,
    #[serde(serialize_with = "access_code")]
    pub access: Access,
    /// Channel id, or 0xffff for device-level faults.
    pub channel: u32,
    pub addr: u64,
    pub info: u32,
}

fn access_code<S: serde::Serializer>(a: &Access, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u8(*a as u8)
}

fn kind_code<S: serde::Serializer>(k: &FaultKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u8(k.code())
}

/// What a watched guest VRAM page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// The instance block of these channels (bitmask).
    Instance(u32),
    /// A page directory or page table.
    Table,
}

/// A latency measured over many events: count, sum and maximum, in ns.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    pub n: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

impl Latency {
    /// Adds one event of `ns`.
    pub fn add(&mut self, ns: u64) {
        self.n += 1;
        self.total_ns += ns;
        self.max_ns = self.max_ns.max(ns);
    }
}

/// Where a submission's time goes on the device (always measured; `--stats`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PathTimes {
    /// Doorbell noticed (the trapped `GP_PUT` write, or the worker's poll of the doorbell page)
    /// → the engine starts the first copy or kernel, or the first semaphore release is written.
    pub submit: Latency,
    /// Of `submit`: doorbell noticed → the worker begins the channel's turn (the wake-up).
    pub wakeup: Latency,
    /// The engine ends a copy or kernel → the release after it is written (and its interrupt
    /// raised): the fence becomes visible to the guest.
    pub complete: Latency,
    /// Fetching GPFIFO entries and pushbuffer segments from guest memory.
    pub fetch: Latency,
    /// Preparing a launch (reading its descriptor, text and parameters; the module cache).
    pub launch_prep: Latency,
    /// Writing semaphore releases.
    pub release: Latency,
    /// Copy jobs whose destination is system memory (guest RAM: a download's copy out of
    /// VRAM), from the engine's start to its end (each run of a job preempted and resumed
    /// counts once per run).
    pub copy_to_sysmem: Latency,
    /// Copy jobs into VRAM (an upload's copy), timed the same way.
    pub copy_to_vram: Latency,
    /// Copy jobs whose destination the worker could not classify (`direct=off`: it keeps no
    /// list of the space's mappings), timed the same way.
    pub copy_unclassified: Latency,
    /// Bytes of the three kinds of copies, in the same order.
    pub copy_to_sysmem_bytes: u64,
    pub copy_to_vram_bytes: u64,
    pub copy_unclassified_bytes: u64,
}

/// The doorbell page's figures (`doorbell=poll`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct BellCounters {
    /// Doorbells the worker took from the page (included in `doorbells`).
    pub polled: u64,
    /// Times the worker stopped polling and set `WAKE` (each may cost the guest one trapped
    /// `GP_PUT` write).
    pub sleeps: u64,
    /// Time the worker spent polling without finding work, ns: wall time, an upper bound of
    /// the CPU time it cost (the worker yields its core between looks; at most `spin_us` per
    /// idle period).
    pub spin_ns: u64,
    /// Doorbell page addresses refused (BAD_REGISTER).
    pub refused: u64,
}

/// Device counters for `--stats`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuCounters {
    pub doorbells: u64,
    pub tlb_flushes: u64,
    pub shadow_rebuilds: u64,
    pub pages_shadowed: u64,
    pub pages_unshadowed: u64,
    pub table_writes_noticed: u64,
    pub instance_writes_noticed: u64,
    pub gpfifo_entries: u64,
    pub methods: u64,
    pub copies: u64,
    pub launches: u64,
    pub releases: u64,
    pub acquires: u64,
    pub interrupts: u64,
    pub faults: u64,
    pub faults_dropped: u64,
    pub gpu_ns: u64,
    /// The part of `gpu_ns` that copy jobs took (not kept in snapshots: a restored VM counts
    /// from zero).
    pub copy_gpu_ns: u64,
    /// Register, aperture and para-virtual BAR accesses that reached the device: each is a VM
    /// exit of the guest (MMIO exits).
    pub mmio_traps: u64,
    pub bell: BellCounters,
    pub path: PathTimes,
    /// The worker's reads and writes in channels' address spaces served straight from guest
    /// RAM (`direct=on`) instead of by engine copies.
    pub direct_accesses: u64,
    /// The host memory budget's accounting (as of the worker's last turn).
    pub hostmem: crate::budget::HostMemStats,
    /// `faults` by kind (snake_case names of docs/hardware.md's kinds). All but `gpu_lost`
    /// (the host daemon took the GPU away) are caused by the guest, so they are logged at info
    /// level, not as warnings: a guest cannot flood the host's log at the default level.
    pub faults_by_kind: BTreeMap<String, u64>,
}

impl GpuCounters {
    /// Counts one fault reported to the guest.
    pub fn count_fault(&mut self, kind: FaultKind) {
        self.faults += 1;
        *self.faults_by_kind.entry(kind_name(kind)).or_default() += 1;
    }
}

/// The snake_case name of a fault kind (for `--stats` and logs), from docs/hardware.md's name.
pub fn kind_name(kind: FaultKind) -> String {
    kind.name().to_ascii_lowercase()
}

/// The log level of a fault of `kind`: info for guest-caused faults, warn for host problems.
pub fn fault_log_level(kind: FaultKind) -> log::Level {
    match kind {
        FaultKind::GpuLost => log::Level::Warn,
        _ => log::Level::Info,
    }
}

/// Registers and bookkeeping, under one lock.
#[derive(Debug)]
pub struct Regs {
    pub intr_status: u32,
    pub intr_enable: u32,
    pub intr_channels: u32,
    pub pramin_base: u32,
    pub runlist_base: u32,
    /// Channels on the current runlist.
    pub runlist: Vec<u32>,
    pub chans: Vec<ChanRegs>,
    pub fault: Option<FaultRecord>,
    /// Incremented by every TLB_FLUSH.
    pub flush_epoch: u64,
    /// The last flush epoch whose shadows the worker rebuilt eagerly (without lazy shadowing).
    pub flushed_epoch: u64,
    pub watched: HashMap<u64, Watched>,
    pub counters: GpuCounters,
    pub shutdown: bool,
    /// Pausing for a snapshot (`snapshot`): requested, parked, the worker's exported state.
    pub pause: crate::snapshot::PauseCtl,
    /// The doorbell page, while the guest has one enabled.
    pub bell: Option<crate::bell::BellPage>,
    /// Whether the interrupt condition was signalled and not yet cleared (edge per MSI).
    irq_line: bool,
}

/// State shared between the front end and the worker.
pub struct Shared {
    regs: Mutex<Regs>,
    /// Wakes the worker (doorbell, runlist, flush, shutdown).
    pub wake: Condvar,
    /// Signalled by the worker when it finished an eager flush.
    pub flushed: Condvar,
    /// Signalled by the worker when it parked for a pause (`snapshot`).
    pub parked: Condvar,
    pub msi: Mutex<Option<MsiMessage>>,
    pub irq: Arc<dyn IrqSink>,
    pub started: Instant,
    /// Added to the time since `started` (TIMER continues from a restored snapshot's value).
    timer_offset: AtomicI64,
    /// Set while a pause is requested: a job the worker starts is preempted at once (read
    /// after the worker clears its preemption handle, so no pause request is lost).
    pub pausing: AtomicBool,
    /// Accesses that trapped into the device (see `GpuCounters::mmio_traps`).
    pub traps: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    pub fn new(channels: u32, irq: Arc<dyn IrqSink>) -> Self {
        Shared {
            regs: Mutex::new(Regs {
                intr_status: 0,
                intr_enable: 0,
                intr_channels: 0,
                pramin_base: 0,
                runlist_base: 0,
                runlist: Vec::new(),
                chans: vec![ChanRegs::default(); channels as usize],
                fault: None,
                flush_epoch: 0,
                flushed_epoch: 0,
                watched: HashMap::new(),
                counters: GpuCounters::default(),
                shutdown: false,
                pause: crate::snapshot::PauseCtl::default(),
                bell: None,
                irq_line: false,
            }),
            wake: Condvar::new(),
            flushed: Condvar::new(),
            parked: Condvar::new(),
            msi: Mutex::new(None),
            irq,
            started: Instant::now(),
            timer_offset: AtomicI64::new(0),
            pausing: AtomicBool::new(false),
            traps: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Regs> {
        self.regs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Nanoseconds since the device was created (the TIMER register).
    pub fn timer_ns(&self) -> u64 {
        let t = self.started.elapsed().as_nanos() as i64;
        t.saturating_add(self.timer_offset.load(Ordering::SeqCst))
            .max(0) as u64
    }

    /// Makes TIMER read `ns` now and count on from there (snapshot restore).
    pub fn set_timer_ns(&self, ns: u64) {
        let t = self.started.elapsed().as_nanos() as i64;
        let ns = i64::try_from(ns).unwrap_or(i64::MAX);
        self.timer_offset
            .store(ns.saturating_sub(t), Ordering::SeqCst);
    }

    /// Whether the interrupt condition is signalled (snapshot).
    pub fn irq_line(regs: &Regs) -> bool {
        regs.irq_line
    }

    /// Sets the interrupt line state without signalling (snapshot restore: an interrupt that
    /// was pending was delivered before the snapshot; the interrupt controller's state is the
    /// VMM's).
    pub fn set_irq_line(regs: &mut Regs, level: bool) {
        regs.irq_line = level;
    }

    /// Signals the interrupt when STATUS & ENABLE becomes non-zero: one MSI message if the
    /// guest enabled MSI, else INTA asserted until the condition clears. Call after changing
    /// either register.
    pub fn update_irq(&self, regs: &mut Regs) {
        let active = regs.intr_status & regs.intr_enable != 0;
        let msi = *self.msi.lock().unwrap_or_else(PoisonError::into_inner);
        if active && !regs.irq_line {
            regs.counters.interrupts += 1;
            match msi {
                Some(msg) => self.irq.msi(msg),
                None => self.irq.intx(true),
            }
        } else if !active && regs.irq_line && msi.is_none() {
            self.irq.intx(false);
        }
        regs.irq_line = active;
    }

    /// Records a fault — counted, logged, kept in the fault registers (the first one stays
    /// until cleared), the FAULT interrupt status raised — without stopping its channel and
    /// without updating the interrupt line (the caller does, after its other changes): every
    /// fault the device reports passes here.
    pub fn record_fault(regs: &mut Regs, rec: FaultRecord) {
        regs.counters.count_fault(rec.kind);
        log::log!(
            fault_log_level(rec.kind),
            "vgpu: guest fault {} on channel {:#x}: addr {:#x} access {:?} info {:#x}",
            kind_name(rec.kind),
            rec.channel,
            rec.addr,
            rec.access,
            rec.info
        );
        if regs.fault.is_none() {
            regs.fault = Some(rec);
        } else {
            regs.counters.faults_dropped += 1;
        }
        regs.intr_status |= regs::INTR_FAULT;
    }

    /// Records a fault ([`Shared::record_fault`]), stops its channel (FAULTED) and raises the
    /// FAULT interrupt.
    pub fn fault(&self, regs: &mut Regs, rec: FaultRecord) {
        Self::record_fault(regs, rec);
        if let Some(c) = regs.chans.get_mut(rec.channel as usize) {
            c.state = regs::CHAN_FAULTED;
            c.fault_kind = rec.kind.code();
            c.rung_at = None;
            Self::mirror(regs, rec.channel);
        }
        self.update_irq(regs);
    }

    /// A doorbell for channel `n` with GP_PUT `v` (the trapped `GP_PUT[n]` write or a change of
    /// `PUT[n]` in the doorbell page): an unbound channel or an id ≥ CHANNELS is a BAD_CHANNEL
    /// fault; otherwise GP_PUT takes the value and an idle channel with work becomes pending.
    /// Returns whether the channel took it.
    pub fn ring(&self, regs: &mut Regs, n: u32, v: u32) -> bool {
        let bound = regs
            .chans
            .get(n as usize)
            .is_some_and(|c| c.state != regs::CHAN_UNBOUND);
        if !bound {
            let rec = FaultRecord {
                kind: FaultKind::BadChannel,
                access: Access::None,
                channel: 0xffff,
                addr: u64::from(n),
                info: v,
            };
            self.fault(regs, rec);
            return false;
        }
        regs.counters.doorbells += 1;
        let ch = &mut regs.chans[n as usize];
        ch.gp_put = v;
        if ch.gp_put != ch.gp_get && ch.rung_at.is_none() {
            ch.rung_at = Some(Instant::now());
        }
        if ch.state == regs::CHAN_IDLE && ch.gp_put != ch.gp_get {
            ch.state = regs::CHAN_PENDING;
        }
        Self::mirror(regs, n);
        true
    }

    /// Takes the doorbells written into the doorbell page since the last look (the worker,
    /// while it polls). Returns whether a channel took new work.
    pub fn poll_bell(&self, regs: &mut Regs) -> bool {
        let Some(bell) = regs.bell.as_mut() else {
            return false;
        };
        let mut rung = [None; regs::MAX_CHANNELS as usize];
        let chans = regs.chans.len();
        for (n, slot) in rung.iter_mut().enumerate().take(chans) {
            let v = bell.put(n as u32);
            if v != bell.seen[n] {
                bell.seen[n] = v;
                *slot = Some(v);
            }
        }
        let mut took = false;
        for (n, v) in rung.iter().enumerate() {
            let Some(v) = *v else { continue };
            // Already rung through the trapped register (the guest saw WAKE): nothing new.
            if regs.chans.get(n).is_some_and(|c| c.gp_put == v) {
                continue;
            }
            if self.ring(regs, n as u32, v) {
                regs.counters.bell.polled += 1;
                took = true;
            }
        }
        took
    }

    /// Mirrors channel `n`'s GP_GET and CHAN_STATUS into the doorbell page, if one is in use.
    pub fn mirror(regs: &Regs, n: u32) {
        if let (Some(b), Some(c)) = (&regs.bell, regs.chans.get(n as usize)) {
            b.mirror(n, c.gp_get, c.state | u32::from(c.fault_kind) << 8);
        }
    }

    /// A device-level fault (not tied to a channel).
    pub fn device_fault(&self, regs: &mut Regs, kind: FaultKind, addr: u64, info: u32) {
        self.fault(
            regs,
            FaultRecord {
                kind,
                access: Access::None,
                channel: 0xffff,
                addr,
                info,
            },
        );
    }
}
