//! The GPU worker: one thread that runs the guest's channels on the engine. It picks runnable
//! channels round-robin (one GPFIFO entry per turn), re-reads instance blocks and rebuilds
//! shadow page tables when the guest changed them, decodes pushbuffers, loads modules and runs
//! copies and kernels under the per-job time limit (loading included) and the VM's host memory
//! budget, and turns every failure into the fault the spec names.
//!
//! Files: `worker/pick` (waiting for work: pause parking, flushes, channel choice, doorbell
//! polling), `worker/launch` (a launch's module and parameters), `worker/copy` (a copy
//! job and its path timings by destination), `worker/job` (the job runner: time limit,
//! vgpud grants, pause, write log, and the fault a job's end becomes), `worker/pause` (the
//! state a snapshot exports and a restore imports).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use pgpu::{CopyJob, EngineSnapshot, Job, ModuleId, PreemptHandle, SpaceId};

use crate::budget::HostBudget;
use crate::config::GpuConfig;
use crate::host::HostLink;
use crate::methods::{Command, MethodState};
use crate::modcache::ModuleCache;
use crate::pushbuf::{self, MethodCall};
use crate::regs::{self, Access, FaultKind};
use crate::shadowing::{Instance, Shadows};
use crate::state::{FaultRecord, Shared, Watched};
use crate::watchdog::Watchdog;
use job::{JobEnd, JobRunner};

mod copy;
mod job;
mod launch;
mod pause;
mod pick;

/// A fault as the worker finds it (the channel is filled in by the caller).
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    pub kind: FaultKind,
    pub access: Access,
    pub addr: u64,
    pub info: u32,
}

impl Fault {
    pub fn new(kind: FaultKind, addr: u64, info: u32) -> Self {
        Fault {
            kind,
            access: Access::None,
            addr,
            info,
        }
    }
    fn access(mut self, a: Access) -> Self {
        self.access = a;
        self
    }
}

#[derive(Default)]
struct ChanRt {
    /// The channel binding (`ChanRegs::binding`) this state belongs to.
    binding: u64,
    instance: Option<Instance>,
    methods: MethodState,
    calls: Vec<MethodCall>,
    pos: usize,
    decode_error: Option<pushbuf::DecodeError>,
    in_segment: bool,
    waiting_since: Option<Instant>,
    /// The job a pause preempted (resumed when the channel's method is replayed).
    suspended: Option<pause::Suspended>,
}

/// What one turn of a channel did.
enum Turn {
    /// The entry was consumed.
    Advanced,
    /// An acquire is not satisfied yet; try again later.
    Waiting,
    /// A pause preempted the job; the entry resumes it after the pause.
    Suspended,
    Faulted(Fault),
}

/// See the module documentation.
pub struct Worker {
    shared: Arc<Shared>,
    engine: Arc<dyn EngineSnapshot>,
    cfg: GpuConfig,
    shadows: Shadows,
    chans: Vec<ChanRt>,
    /// Runs each engine job under its time limit, grants, pauses and the write log.
    jobs: JobRunner,
    next: usize,
    /// The last TLB-flush epoch handled eagerly (without lazy shadowing).
    seen_epoch: u64,
    /// `mode=para`: channels run in these spaces (held for a whole turn; see `para`).
    para: Option<crate::para::SharedSpaces>,
    /// BAR remap: table pages found by a rebuild keep trapping from then on.
    remap: Option<std::sync::Arc<std::sync::Mutex<crate::remap::Remap>>>,
    /// The VM's host memory budget (modules, shadow spaces).
    budget: HostBudget,
    modules: ModuleCache,
    /// The page directory the current turn runs in (its shadow is never evicted meanwhile).
    current_pdb: Option<shadow::Pdb>,
    /// The last activity (work found or run, a wake-up): the doorbell page is polled for
    /// `cfg.spin` after it.
    active: Instant,
    /// Since when the worker has polled without finding work (charged to `bell.spin_ns`).
    spin_since: Option<Instant>,
    /// Polling found its core taken by another thread: sleep until the next activity.
    contended: bool,
    /// Guest RAM reached directly for the worker's own reads and writes (see `direct`).
    direct: Option<crate::direct::Direct>,
    /// When the engine last ended a job whose completion no release has signalled yet.
    job_end: Option<(usize, Instant)>,
}

/// FAULT_INFO of a RESOURCE_LIMIT fault for a module (ADDR = CODE_VA of the launch).
pub const LIMIT_MODULE: u32 = 1;

/// The channel index `pick` returns for an eager flush.
const FLUSH: usize = usize::MAX;

/// A yield of the polling worker that took longer than this gave its core to another thread.
const CONTENDED: Duration = Duration::from_micros(50);

/// How long a waiting acquire sleeps before it is retried.
const ACQUIRE_POLL: Duration = Duration::from_millis(1);

impl Worker {
    pub fn new(
        shared: Arc<Shared>,
        engine: Arc<dyn EngineSnapshot>,
        cfg: GpuConfig,
        shadows: Shadows,
        handle: PreemptHandle,
        cancel: Arc<AtomicBool>,
    ) -> std::io::Result<Self> {
        let chans = (0..cfg.channels).map(|_| ChanRt::default()).collect();
        let jobs = JobRunner {
            shared: shared.clone(),
            engine: engine.clone(),
            host: None,
            handle,
            cancel,
            watchdog: Watchdog::start()?,
            write_log: None,
            timeout: cfg.job_timeout,
            last_end: None,
        };
        Ok(Worker {
            budget: HostBudget::new(cfg.hostmem),
            modules: ModuleCache::default(),
            current_pdb: None,
            active: Instant::now(),
            spin_since: None,
            contended: false,
            direct: None,
            job_end: None,
            jobs,
            shared,
            engine,
            cfg,
            shadows,
            chans,
            next: 0,
            seen_epoch: 0,
            remap: None,
            para: None,
        })
    }

    /// Shared GPU: gate every job on a grant of the daemon behind `link`.
    pub fn set_host(&mut self, link: Arc<HostLink>) {
        self.jobs.host = Some(link);
    }

    /// Reads and writes the worker makes in guest RAM go straight to `ram` (see `direct`).
    /// Writes are noted in `log` while a live snapshot runs.
    pub fn set_direct(
        &mut self,
        ram: vm_memory::GuestMemoryMmap,
        log: std::sync::Arc<crate::snapshot::live::RamWriteLog>,
    ) {
        let sysmem = self.shadows.sysmem().clone();
        let mut d = crate::direct::Direct::new(ram, sysmem);
        d.log = Some(log);
        self.direct = Some(d);
    }

    /// Marks what each job may write in `log` while it is on (live snapshots).
    pub fn set_write_log(&mut self, log: std::sync::Arc<crate::snapshot::writes::WriteSetLog>) {
        self.jobs.write_log = Some(log);
    }

    /// Para mode: run channels in the para-managed spaces instead of shadows of guest tables.
    pub fn set_para(&mut self, spaces: crate::para::SharedSpaces) {
        self.para = Some(spaces);
    }

    /// Runs until the device shuts down.
    pub fn run(mut self) {
        while let Some((ch, flush_epoch)) = self.pick() {
            if ch == FLUSH {
                self.eager_flush(flush_epoch);
                continue;
            }
            // Para mode: no hypercall changes a space during this turn (its jobs included).
            let para = self.para.clone();
            let held = para.as_ref().map(crate::para::lock);
            let turn = self.turn(ch, flush_epoch, held.as_deref());
            drop(held);
            let shared = self.shared.clone();
            let mut r = shared.lock();
            r.counters.hostmem = self.budget.stats();
            r.counters.direct_accesses = self.direct.as_ref().map_or(0, |d| d.hits);
            if r.chans[ch].binding != self.chans[ch].binding {
                // The guest re-bound the channel while this turn ran: the turn belonged to the
                // old binding, whose GPFIFO is gone; the new one starts from its own GP_GET.
                log::debug!("vgpu: channel {ch} re-bound during a turn; its result is dropped");
                continue;
            }
            let entries = self.chans[ch]
                .instance
                .as_ref()
                .map_or(1, |i| i.gpfifo_entries);
            let c = &mut r.chans[ch];
            match turn {
                Turn::Advanced => {
                    c.gp_get = (c.gp_get + 1) % entries;
                    if c.state == regs::CHAN_RUNNING {
                        c.state = if c.gp_get == c.gp_put {
                            // Nothing left: a doorbell whose work ran no job is not timed.
                            c.rung_at = None;
                            regs::CHAN_IDLE
                        } else {
                            regs::CHAN_PENDING
                        };
                    }
                }
                Turn::Waiting | Turn::Suspended => {
                    if c.state == regs::CHAN_RUNNING {
                        c.state = regs::CHAN_PENDING;
                    }
                }
                Turn::Faulted(f) => {
                    self.job_end = None;
                    self.chans[ch] = ChanRt {
                        binding: self.chans[ch].binding,
                        instance: self.chans[ch].instance.take(),
                        ..ChanRt::default()
                    };
                    let rec = FaultRecord {
                        kind: f.kind,
                        access: f.access,
                        channel: ch as u32,
                        addr: f.addr,
                        info: f.info,
                    };
                    shared.fault(&mut r, rec);
                }
            }
            crate::state::Shared::mirror(&r, ch as u32);
        }
        self.modules.clear(&*self.engine, &mut self.budget);
    }

    /// Waits for a runnable channel; returns it (marked running) and the flush epoch.
    /// Keeps page-table pages trapping once a rebuild finds them (BAR remap).
    pub fn set_remap(&mut self, remap: std::sync::Arc<std::sync::Mutex<crate::remap::Remap>>) {
        self.remap = Some(remap);
    }

    /// Rebuilds every shadow from scratch now (naive full virtualization: `opt=none`).
    fn eager_flush(&mut self, epoch: u64) {
        let (modules, engine) = (&mut self.modules, &self.engine);
        let reports = self
            .shadows
            .rebuild_all(epoch, &mut self.budget, &mut |b, older| {
                modules.evict_older(&**engine, b, older)
            });
        let mut r = self.shared.lock();
        r.counters.hostmem = self.budget.stats();
        for report in reports {
            r.counters.shadow_rebuilds += 1;
            r.counters.pages_shadowed += report.mapped;
            r.counters.pages_unshadowed += report.unmapped;
        }
        r.flushed_epoch = epoch;
        self.shared.flushed.notify_all();
    }

    fn turn(
        &mut self,
        ch: usize,
        flush_epoch: u64,
        para: Option<&crate::para::ParaSpaces>,
    ) -> Turn {
        match self.turn_inner(ch, flush_epoch, para) {
            Ok(t) => t,
            Err(f) => Turn::Faulted(f),
        }
    }

    fn turn_inner(
        &mut self,
        ch: usize,
        flush_epoch: u64,
        para: Option<&crate::para::ParaSpaces>,
    ) -> Result<Turn, Fault> {
        let (inst_reg, gp_get, gp_put) = {
            let r = self.shared.lock();
            let c = &r.chans[ch];
            (c.inst, c.gp_get, c.gp_put)
        };
        if self.chans[ch].instance.is_none() {
            let addr = u64::from(inst_reg & 0x0fff_ffff) << 12;
            let inst = self.shadows.read_instance(addr)?;
            // `mode=pt` watches no guest structure: the instance block is read at binding, as
            // the spec says, and a later write to it is the trusted guest's business.
            if self.cfg.mode != crate::config::Mode::Pt {
                let mut r = self.shared.lock();
                let page = addr >> 12;
                let mask = match r.watched.get(&page) {
                    Some(Watched::Instance(m)) => *m,
                    _ => 0,
                };
                r.watched.insert(page, Watched::Instance(mask | 1 << ch));
            }
            self.chans[ch].instance = Some(inst);
        }
        let inst = self.chans[ch]
            .instance
            .ok_or(Fault::new(FaultKind::BadInstance, 0, 0))?;
        let sync = match para {
            // Para mode: the space the guest built with hypercalls; nothing to walk or rebuild.
            Some(p) => crate::shadowing::SpaceSync {
                space: p.space_for(inst.pdb).ok_or(Fault::new(
                    FaultKind::BadInstance,
                    inst.addr,
                    0,
                ))?,
                report: None,
            },
            None => {
                self.current_pdb = Some(inst.pdb);
                let (modules, engine) = (&mut self.modules, &self.engine);
                self.shadows
                    .space_for(&inst, flush_epoch, &mut self.budget, &mut |b, older| {
                        modules.evict_older(&**engine, b, older)
                    })?
            }
        };
        if let Some(report) = sync.report {
            let mut r = self.shared.lock();
            if report.rebuilt {
                r.counters.shadow_rebuilds += 1;
            }
            r.counters.pages_shadowed += report.mapped;
            r.counters.pages_unshadowed += report.unmapped;
            if self.cfg.mode != crate::config::Mode::Pt {
                r.watched.retain(|_, w| !matches!(w, Watched::Table));
                for page in &report.table_pages {
                    r.watched.entry(*page).or_insert(Watched::Table);
                }
            }
            if let Some(remap) = &self.remap {
                remap
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .trap(report.table_pages.iter().map(|p| p << 12));
            }
            for f in &report.faults {
                let rec = FaultRecord {
                    kind: f.kind,
                    access: Access::None,
                    channel: ch as u32,
                    addr: f.addr,
                    info: f.info,
                };
                // Reported, but the channel goes on: the bad range simply stays unmapped.
                log::debug!("vgpu: channel {ch}: the fault is in its guest page tables");
                Shared::record_fault(&mut r, rec);
            }
            self.shared.update_irq(&mut r);
        }
        let space = sync.space;
        if let Some(d) = self.direct.as_mut() {
            match para {
                Some(p) => d.use_space(space, p.generation(), || p.installed(inst.pdb)),
                None => {
                    let shadows = &self.shadows;
                    d.use_space(space, shadows.generation(), || shadows.installed(inst.pdb))
                }
            }
        }
        if !self.chans[ch].in_segment {
            if gp_put >= inst.gpfifo_entries || gp_get >= inst.gpfifo_entries {
                return Err(Fault::new(
                    FaultKind::BadGpfifo,
                    u64::from(gp_put),
                    inst.gpfifo_entries,
                ));
            }
            self.fetch_segment(ch, space, &inst, gp_get)?;
        }
        self.execute_calls(ch, space)
    }

    fn read(
        &mut self,
        space: SpaceId,
        va: u64,
        buf: &mut [u8],
        access: Access,
    ) -> Result<(), Fault> {
        if self.direct.as_mut().is_some_and(|d| d.read(space, va, buf)) {
            return Ok(());
        }
        self.engine.copy_from_space(space, va, buf).map_err(|e| {
            log::debug!("vgpu: read {} bytes at {va:#x}: {e}", buf.len());
            Fault::new(FaultKind::Unmapped, va, 0).access(access)
        })
    }

    fn fetch_segment(
        &mut self,
        ch: usize,
        space: SpaceId,
        inst: &Instance,
        gp_get: u32,
    ) -> Result<(), Fault> {
        let t0 = Instant::now();
        let entry_va = inst.gpfifo_base + 8 * u64::from(gp_get);
        let mut e = [0u8; 8];
        self.read(space, entry_va, &mut e, Access::Fetch)?;
        let e = u64::from_le_bytes(e);
        let (va, words) = (e & ((1 << 48) - 1), (e >> 48) as u32);
        if words > regs::MAX_PUSH || va % 4 != 0 {
            return Err(Fault::new(FaultKind::BadGpfifo, entry_va, gp_get));
        }
        let mut bytes = vec![0u8; 4 * words as usize];
        self.read(space, va, &mut bytes, Access::Fetch)?;
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (calls, err) = pushbuf::decode(&words);
        let rt = &mut self.chans[ch];
        rt.calls = calls;
        rt.pos = 0;
        rt.decode_error = err;
        rt.in_segment = true;
        let mut r = self.shared.lock();
        r.counters.gpfifo_entries += 1;
        r.counters.path.fetch.add(t0.elapsed().as_nanos() as u64);
        Ok(())
    }

    fn execute_calls(&mut self, ch: usize, space: SpaceId) -> Result<Turn, Fault> {
        while self.chans[ch].pos < self.chans[ch].calls.len() {
            let call = self.chans[ch].calls[self.chans[ch].pos];
            let cmd = self.chans[ch]
                .methods
                .apply(call.addr, call.data)
                .map_err(|_| Fault::new(FaultKind::BadMethod, u64::from(call.data), call.addr))?;
            self.shared.lock().counters.methods += 1;
            if let Some(cmd) = cmd {
                match self.command(ch, space, cmd)? {
                    Turn::Advanced => {}
                    other => return Ok(other),
                }
            }
            self.chans[ch].pos += 1;
        }
        let rt = &mut self.chans[ch];
        rt.in_segment = false;
        rt.calls.clear();
        if let Some(e) = rt.decode_error.take() {
            let index = match e {
                pushbuf::DecodeError::Opcode { index, .. }
                | pushbuf::DecodeError::Reserved { index, .. }
                | pushbuf::DecodeError::Truncated { index, .. } => index,
            };
            return Err(Fault::new(FaultKind::BadMethod, 0, index as u32));
        }
        Ok(Turn::Advanced)
    }

    fn command(&mut self, ch: usize, space: SpaceId, cmd: Command) -> Result<Turn, Fault> {
        match cmd {
            Command::SemAcquire { va, payload } => {
                let mut b = [0u8; 4];
                self.read(space, va, &mut b, Access::Read)?;
                let rt = &mut self.chans[ch];
                if u32::from_le_bytes(b) >= payload {
                    rt.waiting_since = None;
                    self.shared.lock().counters.acquires += 1;
                    return Ok(Turn::Advanced);
                }
                let since = *rt.waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() > self.cfg.job_timeout {
                    rt.waiting_since = None;
                    return Err(Fault::new(FaultKind::Timeout, va, payload));
                }
                Ok(Turn::Waiting)
            }
            Command::SemRelease {
                va,
                payload,
                interrupt,
                timestamp,
            } => {
                let (engine, direct) = (&self.engine, &mut self.direct);
                let mut write = |va: u64, data: &[u8]| {
                    if direct.as_mut().is_some_and(|d| d.write(space, va, data)) {
                        return Ok(());
                    }
                    engine
                        .copy_to_space(space, va, data)
                        .map_err(|_| Fault::new(FaultKind::Unmapped, va, 0).access(Access::Write))
                };
                let t0 = Instant::now();
                if va % 4 != 0 || (timestamp && va % 16 != 0) {
                    return Err(Fault::new(
                        FaultKind::BadMethod,
                        va,
                        regs::method::SEM_EXECUTE,
                    ));
                }
                if timestamp {
                    write(va + 8, &self.shared.timer_ns().to_le_bytes())?;
                }
                write(va, &payload.to_le_bytes())?;
                let mut r = self.shared.lock();
                r.counters.releases += 1;
                if interrupt {
                    r.intr_channels |= 1 << ch;
                    r.intr_status |= regs::INTR_SEMAPHORE;
                    self.shared.update_irq(&mut r);
                }
                let done = Instant::now();
                let p = &mut r.counters.path;
                p.release.add(done.duration_since(t0).as_nanos() as u64);
                if let Some((_, end)) = self.job_end.take_if(|(c, _)| *c == ch) {
                    p.complete.add(done.duration_since(end).as_nanos() as u64);
                }
                if let Some(rung) = r.chans[ch].rung_at.take() {
                    let ns = t0.saturating_duration_since(rung).as_nanos() as u64;
                    r.counters.path.submit.add(ns);
                }
                Ok(Turn::Advanced)
            }
            Command::Copy { src, dst, len } => {
                self.shared.lock().counters.copies += 1;
                if len == 0 {
                    // Nothing runs: a suspended job (only a forged snapshot puts one here) goes.
                    self.chans[ch].suspended = None;
                    self.keep_suspended_modules();
                    return Ok(Turn::Advanced);
                }
                self.run_copy(
                    ch,
                    CopyJob {
                        space,
                        src,
                        dst,
                        len,
                    },
                )
            }
            Command::Launch(desc) => {
                self.shared.lock().counters.launches += 1;
                let t0 = Instant::now();
                let (job, key) = self.launch_job(space, &desc)?;
                let prep = t0.elapsed().as_nanos() as u64;
                self.shared.lock().counters.path.launch_prep.add(prep);
                self.modules.set_in_use(Some(job.module));
                let r = self.run_job(ch, Job::Launch(job), Some(key), t0.elapsed());
                self.modules.set_in_use(None);
                r
            }
        }
    }

    /// Runs `job` (kernel identity `key`, for the daemon of a shared GPU) under the per-job time
    /// limit, of which `spent` went already (loading), resuming the job a pause suspended.
    fn run_job(
        &mut self,
        ch: usize,
        job: Job,
        key: Option<u64>,
        spent: Duration,
    ) -> Result<Turn, Fault> {
        let suspended = self.chans[ch].suspended.take();
        if suspended.is_some() {
            self.keep_suspended_modules();
        }
        // A launch runs its bounds-checked twin while live write sets log; a context a pause
        // suspended resumes in the module it ran in (a twin, or the launch's own).
        let twin = match (&job, &suspended) {
            (Job::Launch(l), Some(s)) => match s.module {
                Some(m) if m != l.module => Some(Job::Launch(pgpu::LaunchJob {
                    module: m,
                    ..l.clone()
                })),
                _ => None,
            },
            (Job::Launch(l), None) => {
                let t = Instant::now();
                let twin = self.checked_twin(l);
                if let Some(log) = self.jobs.write_log.as_ref().filter(|w| w.on()) {
                    log.note_worker(t.elapsed().as_nanos() as u64, true);
                }
                twin
            }
            (Job::Copy(_), _) => None,
        };
        let resume = match suspended {
            // The job a pause preempted: resume it (in the space and module it runs in now).
            Some(s) => {
                let (space, module) = match twin.as_ref().unwrap_or(&job) {
                    Job::Copy(c) => (c.space, None),
                    Job::Launch(l) => (l.space, Some(l.module)),
                };
                let patch = twin.as_ref().and_then(|t| self.twin_flag_patch(t));
                let context = self
                    .engine
                    .retarget_context(s.context, space, module, patch)
                    .map_err(|e| {
                        log::info!("vgpu: channel {ch}: the suspended job cannot resume: {e}");
                        Fault::new(FaultKind::BadLaunch, 0, 0)
                    })?;
                Some((context, s.gpu))
            }
            None => None,
        };
        let (rt, shared) = (&self.chans[ch], &self.shared);
        let end = self
            .jobs
            .run(&job, twin.as_ref(), key, spent, resume, ch, &|| {
                more_work(rt, shared, ch)
            });
        if let Some(t) = self.jobs.last_end.take() {
            self.job_end = Some((ch, t));
        }
        match end? {
            JobEnd::Completed => Ok(Turn::Advanced),
            JobEnd::Suspended(context, gpu) => {
                if let Some(context) = context {
                    let ran = twin.as_ref().unwrap_or(&job);
                    self.chans[ch].suspended = Some(pause::Suspended::of(context, gpu, ran));
                    self.keep_suspended_modules();
                }
                Ok(Turn::Suspended)
            }
        }
    }
}

impl Worker {
    /// Keeps the modules suspended jobs resume in out of the module cache's evictions.
    pub(super) fn keep_suspended_modules(&mut self) {
        let ids: Vec<ModuleId> = self
            .chans
            .iter()
            .filter_map(|c| c.suspended.as_ref()?.module)
            .collect();
        self.modules.keep(ids);
    }
}

/// Whether another job is probably ready after the current one of channel `ch` (state `rt`)
/// (shared GPU: the `more` of the run report, so a backlogged VM keeps its place without a new
/// Want). A wrong guess costs one message: the worker withdraws it when it finds nothing to run.
fn more_work(rt: &ChanRt, shared: &Shared, ch: usize) -> bool {
    if rt.pos + 1 < rt.calls.len() {
        return true;
    }
    let entries = rt.instance.as_ref().map_or(1, |i| i.gpfifo_entries);
    let r = shared.lock();
    r.chans.iter().enumerate().any(|(k, c)| {
        let queued = if k == ch {
            // The entry being run is still counted until the turn ends.
            (c.gp_put + entries - c.gp_get) % entries.max(1) > 1
        } else {
            c.gp_get != c.gp_put
        };
        queued && r.runlist.contains(&(k as u32))
    })
}
