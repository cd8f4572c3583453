//! The checkpoint preemption method on the cuda engine (`CudaConfig::preempt = Checkpoint`):
//! loading the `ptx::ckpt`-transformed module beside the sliced one, and running a launch as
//! ONE launch of the whole grid with the four checkpoint parameters. The flag and the save area
//! are engine-owned device memory (`ckmem`); the flag is cleared on the job stream before the
//! kernel, and a request raises it from the requesting thread (`FlagHook::fire`, ordered after
//! the clear by an event). When the kernel ends, the records' status words are read (one
//! strided copy, only if the flag was raised): any record not done makes the outcome
//! `Preempted`, and `resume` relaunches the grid with `__ck_resume = 1`. A time-slice deadline
//! on the handle is honoured by polling the kernel's end event and raising the flag at it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::sys;

use super::ckmem::{DevBuf, FlagHook, FlagWrite, Signal};
use super::ckpath::{
    CONTIGUOUS_MAX_BYTES, CkBreakdown, HostFlag, HostFlags, StatusRead, pick_statuses, wait_end,
};
use super::ckqueue::{Pinned, Queued};
use super::context::{CkLive, JobState, LaunchState, Live};
use super::driver::ck;
use super::engine::CudaEngine;
use super::modules::CkLoaded;
use super::stream::Stream;
use crate::ckpt::{self, area_bytes, shared_per_cta, tally, threads};
use crate::engine::*;
use crate::sync::lock;

impl CudaEngine {
    /// Counters of the checkpoint preemption method.
    pub fn ckpt_stats(&self) -> crate::ckpt::CkptStats {
        self.ckpt.snapshot()
    }

    /// Non-zero save-area bytes in the idle buffers of the checkpoint pool (0 unless a
    /// completed job returned a dirty buffer): for tests on a GPU.
    #[doc(hidden)]
    pub fn ck_pool_nonzero_bytes(&self) -> Result<u64, EngineError> {
        self.ck_pool.idle_nonzero_bytes().map_err(|e| self.drv(e))
    }

    /// Transforms and loads the checkpointed form of `text` (checkpoint method; idempotent
    /// entries restarting with `restart`): `Ok(None)` when the transformation or the JIT
    /// refuses it (counted, the module runs sliced); `Err` when the load's own limits stop it.
    pub(crate) fn load_ck(
        &self,
        text: &str,
        limits: &LoadLimits,
        restart: bool,
    ) -> Result<Option<(CkLoaded, u64)>, EngineError> {
        let t = match ckpt::transform(
            text,
            limits,
            self.cfg.ckpt_poll_interval,
            (self.cfg.ckpt_chunk_instructions, self.cfg.ckpt_fast_chunks),
            restart,
        ) {
            Ok(t) => t,
            Err(e) => {
                if let Some(err) = ckpt::limit_error(&e) {
                    return Err(err);
                }
                self.ckpt.refused(&e.to_string());
                return Ok(None);
            }
        };
        match super::modules::load(self.ctx, &t.ptx, 64 << 10) {
            Ok(m) => {
                self.ckpt.transformed();
                Ok(Some((
                    CkLoaded::new(self.ctx, m, t.entries),
                    t.ptx.len() as u64,
                )))
            }
            Err(EngineError::ModuleLoad { log }) => {
                self.ckpt
                    .refused(&format!("the JIT refused the transformed PTX: {log}"));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The checkpointed module and plan index for a fresh launch, if it runs checkpointed
    /// (a save area over the limit is counted as a fallback).
    pub(crate) fn ck_for(
        &self,
        l: &LaunchState,
    ) -> Result<Option<(Arc<CkLoaded>, usize, u64)>, EngineError> {
        if l.next_block != 0 {
            return Ok(None);
        }
        let Some(ck) = lock(&self.modules).ck(l.module)? else {
            return Ok(None);
        };
        let Some((idx, plan)) = ck.plan(&l.entry) else {
            return Ok(None);
        };
        let need = area_bytes(plan, l.grid, l.block, l.dynamic_shared);
        if need > self.cfg.max_save_area_bytes {
            self.ckpt
                .launch_fallback(&l.entry, need, self.cfg.max_save_area_bytes);
            return Ok(None);
        }
        // Auto and restart: one CTA per SM is the smallest wave.
        let wave = u64::from(self.sms.max(1));
        if !self
            .ckpt
            .choose(self.cfg.preempt, plan, &l.params, l.total_blocks(), wave)
        {
            return Ok(None);
        }
        Ok(Some((ck, idx, need)))
    }

    /// Rebuilds a checkpointed launch's state from its save-area bytes (already bounded by the
    /// decoder): the module must be checkpointed and the area exactly the launch's size.
    /// `escalated`: the area is in the checkpoint form of a restarting entry.
    pub(crate) fn ck_from_area(
        &self,
        l: &LaunchState,
        area: Vec<u8>,
        escalated: bool,
    ) -> Result<(Arc<CkLoaded>, usize, CkLive), EngineError> {
        let bad = |m: String| EngineError::BadContext(m);
        let m = lock(&self.modules);
        let ck = if escalated {
            m.ck_save(l.module)?
        } else {
            m.ck(l.module)?
        };
        drop(m);
        let ck = ck.ok_or_else(|| bad("module is not checkpointed (in that form)".into()))?;
        let (idx, plan) = ck
            .plan(&l.entry)
            .ok_or_else(|| bad("no such entry".into()))?;
        let need = area_bytes(plan, l.grid, l.block, l.dynamic_shared);
        if need != area.len() as u64 {
            return Err(bad(format!(
                "save area is {} bytes, the launch needs {need}",
                area.len()
            )));
        }
        let (n, _) = threads(l.grid, l.block);
        let stride = plan.record_bytes as usize;
        let statuses = (0..n as usize)
            .map(|g| {
                let o = g * stride;
                u32::from_le_bytes([area[o], area[o + 1], area[o + 2], area[o + 3]])
            })
            .collect();
        let buf = self.ck_pool.take(need).map_err(|e| self.drv(e))?;
        buf.write_area(&area).map_err(|e| self.drv(e))?;
        // From bytes the record of its last runs is gone: a restarting launch continues in its
        // checkpoint form (which keeps progress).
        let stalled = plan.restart;
        Ok((
            ck.clone(),
            idx,
            CkLive {
                buf,
                area_len: need,
                statuses,
                stalled,
                escalated,
            },
        ))
    }

    pub(crate) fn signal(&self) -> Result<&Signal, EngineError> {
        if let Some(s) = self.signal.get() {
            return Ok(s);
        }
        let high = self.cfg.flag_write == FlagWrite::WriteValuePriority;
        let s = Stream::with_priority(high).map_err(|e| self.drv(e))?;
        let ok = super::ckmem::has_write_value();
        if !ok {
            log::warn!(
                "cuda: no cuStreamWriteValue32_v2 in this driver: checkpoint flags by memcpy"
            );
        }
        let _ = self.signal.set(Signal(s, ok));
        self.signal
            .get()
            .ok_or_else(|| EngineError::Backend("signal stream".into()))
    }

    /// The engine's host flag words (`FlagWrite::HostMapped`), made on first use; `None`
    /// (logged once) if the driver refused the pinned page.
    pub(crate) fn host_flags(&self) -> Option<&HostFlags> {
        let r = self.ck_path.host_flags.get_or_init(|| {
            HostFlags::new(self.ctx).map_err(|e| {
                log::warn!("cuda: no host-mapped checkpoint flags ({e}): device flags instead");
                e.to_string()
            })
        });
        r.as_ref().ok()
    }

    /// Preemptions' timing breakdowns recorded since the last call (oldest first).
    pub fn take_ck_breakdowns(&self) -> Vec<CkBreakdown> {
        self.ck_path.take()
    }

    /// Runs (`state` None: fresh) or resumes a checkpointed launch until its kernel ends.
    pub(crate) fn run_ck(
        &self,
        l: LaunchState,
        module: Arc<CkLoaded>,
        plan: usize,
        need: u64,
        state: Option<CkLive>,
        h: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        self.check_launch(&l)?;
        let func = module.loaded.func(&l.entry)?;
        let p = func
            .ck
            .ok_or_else(|| EngineError::BadLaunch("checkpoint parameters missing".into()))?;
        if l.params.len() < func.own_end {
            return Err(EngineError::BadLaunch(format!(
                "parameter buffer is {} bytes, the entry takes {}",
                l.params.len(),
                func.own_end
            )));
        }
        p.buffer(&l.params, 0, 0, false, 0)?;
        let (_use, ()) = self.begin(l.space, |_| ())?;
        let sig = self.signal()?;
        let (signal, write_value) = (sig.0.stream, sig.1);
        let (buf, before, resume, escalated) = match state {
            Some(s) => (s.buf, s.statuses, true, s.escalated),
            None => (
                self.ck_pool.take(need).map_err(|e| self.drv(e))?,
                Vec::new(),
                false,
                false,
            ),
        };
        let mut method = match self.cfg.flag_write {
            FlagWrite::Armed if !sys::has_symbol("cuStreamWaitValue32_v2") => FlagWrite::WriteValue,
            m => m,
        };
        if !write_value && method != FlagWrite::HostMapped {
            method = FlagWrite::Memcpy;
        }
        let host_flag = match method {
            FlagWrite::HostMapped | FlagWrite::Armed => self.host_flags().and_then(HostFlags::take),
            _ => None,
        };
        if method == FlagWrite::Armed && host_flag.is_none() {
            method = FlagWrite::WriteValue;
        }
        let flag_at = match (&host_flag, method) {
            (Some(f), FlagWrite::HostMapped) => f.device(),
            _ => buf.flag(),
        };
        // `Armed`: the gated write waits on a stream of the job's own.
        let arm = match method {
            FlagWrite::Armed => Some(self.take_stream()?),
            _ => None,
        };
        let mut params = p.buffer(&l.params, flag_at, buf.area(), resume, l.dynamic_shared)?;
        let stream = self.take_stream()?;
        let (n, per_cta) = threads(l.grid, l.block);
        let stride = module.plans[plan].record_bytes;
        let queued = self.queue_statuses(&buf, &stream, n, stride)?;
        let mut cleared: sys::CUevent = std::ptr::null_mut();
        let mut done: sys::CUevent = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; destroyed below once the hook is gone.
        let made = unsafe {
            ck(
                "cuEventCreate",
                sys::cuEventCreate(
                    &mut cleared,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                ),
            )
            .and_then(|_| ck("cuEventCreate", sys::cuEventCreate(&mut done, 0)))
        };
        let hook = FlagHook {
            ctx: self.ctx,
            flag: flag_at,
            cleared,
            signal: arm.as_ref().map_or(signal, |a| a.stream),
            method,
            done,
            host: host_flag.as_ref().map(HostFlag::host),
            gate: host_flag.as_ref().map_or(0, HostFlag::device),
        };
        let q = queued.as_ref().map(|(q, _)| q.clone());
        let r =
            made.and_then(|_| self.ck_kernel(&l, func.f, &mut params, &buf, hook, (&stream, q), h));
        let mut buf = buf;
        type Ran = Result<(bool, Duration, Trace), super::driver::DrvError>;
        let finish = |r: Ran| -> Ran {
            let (fired, gpu, mut trace) = r?;
            if fired || arm.is_some() {
                // The flag write may still be queued on the signal stream: let it land now,
                // not in this buffer's next job (an armed write always runs: its gate was
                // opened at the end if no request did).
                // SAFETY: the engine's (or the job's arming) live stream.
                ck("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(hook.signal)
                })?;
                trace.synced = Some(Instant::now());
                if fired && method != FlagWrite::HostMapped {
                    trace.write_to_end = write_to_end(&stream, done);
                }
            }
            Ok((fired, gpu, trace))
        };
        if let (Some(_), Some(f)) = (&arm, &host_flag) {
            // Whatever happened, the armed write's gate opens (a stream waiting on it must
            // not go back to the pool blocked).
            f.host().store(1);
        }
        let armed_ok = r.is_ok();
        let r = finish(r);
        // The queued status copy, if the request enqueued it: waited for before its pinned
        // buffer goes back (and before the stream does).
        let (queued_words, r) = match (queued, r) {
            (Some((q, pin)), r) => match q.finish() {
                Ok(true) => {
                    let w = pick_statuses(
                        pin.bytes(n as usize * stride as usize),
                        n as usize,
                        stride as usize,
                    );
                    self.ck_path.pins.give(pin);
                    (Some(w), r)
                }
                Ok(false) => {
                    self.ck_path.pins.give(pin);
                    (None, r)
                }
                // A copy may still target the buffer: it is neither reused nor freed (`pin`
                // has no destructor: the pinned memory is leaked).
                Err(e) => (None, r.and(Err(e))),
            },
            (None, r) => (None, r),
        };
        // SAFETY: created above (null if not); the hook that used them was removed inside
        // `ck_kernel`, and the signal stream was synchronised if it fired.
        unsafe {
            for ev in [cleared, done] {
                if !ev.is_null() {
                    sys::cuEventDestroy_v2(ev);
                }
            }
        }
        if self.lost().is_none() {
            self.give_stream(stream);
            match arm {
                // Synchronised in `finish`.
                Some(a) if armed_ok => self.give_stream(a),
                Some(a) => std::mem::forget(a),
                None => {}
            }
        } else {
            std::mem::forget(stream);
            std::mem::forget(arm);
        }
        drop(host_flag);
        let (fired, gpu, trace) = match r {
            Ok(x) => x,
            Err(e) if e.is_sticky() => {
                self.poison(&e);
                return Ok(Outcome::Faulted {
                    fault: JobFault {
                        kind: FaultKind::Kernel(format!("{}: {e}", l.entry)),
                        va: 0,
                        access: None,
                        site: None,
                    },
                    gpu_time: Duration::ZERO,
                });
            }
            Err(e) => return Err(EngineError::BadLaunch(e.to_string())),
        };
        let planr = &module.plans[plan];
        // A resumed run that ended unrequested must have finished every record (one strided
        // read per resumed completion); if not, its kernel read an area that had not landed.
        let unfinished = match (fired, resume) {
            (false, true) => {
                let after = self.read_statuses(&buf, n, planr.record_bytes)?;
                (!ckpt::unrequested_end_complete(&after)).then_some(after)
            }
            _ => None,
        };
        if !fired && unfinished.is_none() {
            self.release_area(&mut buf, resume, need);
            return Ok(Outcome::Completed {
                gpu_time: gpu.max(Duration::from_nanos(1)),
            });
        }
        let after = match (unfinished, queued_words) {
            (Some(a), _) => {
                log::warn!(
                    "cuda: resumed launch of {} ended unrequested with records not done: resumed again",
                    l.entry
                );
                a
            }
            (None, Some(w)) => w,
            (None, None) => self.read_statuses(&buf, n, planr.record_bytes)?,
        };
        let statuses_at = Instant::now();
        let t = tally(
            planr,
            &before,
            &after,
            per_cta,
            shared_per_cta(planr, l.dynamic_shared),
        );
        if t.pending == 0 {
            self.release_area(&mut buf, resume, need);
            return Ok(Outcome::Completed {
                gpu_time: gpu.max(Duration::from_nanos(1)),
            });
        }
        self.ckpt.preempted(&t);
        let context = SavedContext::live(Box::new(Live {
            engine: self.id,
            job: JobState::Launch(l),
            ck: Some(CkLive {
                buf,
                area_len: need,
                stalled: planr.restart && ckpt::stalled(&before, &after),
                statuses: after,
                escalated,
            }),
        }));
        let flag = if method == FlagWrite::HostMapped && !trace.host {
            "host-mapped (no free word: device flag)".to_string()
        } else {
            method.to_string()
        };
        let path = format!(
            "{flag}/{}/{}",
            format!("{:?}", self.cfg.end_wait).to_lowercase(),
            format!("{:?}", self.cfg.status_read).to_lowercase()
        );
        self.ck_path
            .record(trace.breakdown(path, h.requested_at(), statuses_at, Instant::now()));
        Ok(Outcome::Preempted {
            context,
            gpu_time: gpu,
        })
    }

    /// For `StatusRead::Queued` (records spanning at most `CONTIGUOUS_MAX_BYTES`): the copy
    /// a request enqueues behind the kernel, and its pinned destination.
    fn queue_statuses(
        &self,
        buf: &DevBuf,
        stream: &Stream,
        n: u64,
        stride: u32,
    ) -> Result<Option<(Arc<Queued>, Pinned)>, EngineError> {
        let span = n.saturating_mul(u64::from(stride));
        if self.cfg.status_read != StatusRead::Queued || span > CONTIGUOUS_MAX_BYTES {
            return Ok(None);
        }
        let pin = self
            .ck_path
            .pins
            .take(span as usize)
            .map_err(|e| self.drv(e))?;
        match Queued::new(self.ctx, stream.stream, buf.area(), &pin, span as usize) {
            Ok(q) => Ok(Some((Arc::new(q), pin))),
            Err(e) => {
                self.ck_path.pins.give(pin);
                Err(self.drv(e))
            }
        }
    }

    /// The status words of `n` records (`StatusRead`).
    fn read_statuses(&self, buf: &DevBuf, n: u64, stride: u32) -> Result<Vec<u32>, EngineError> {
        let span = n.saturating_mul(u64::from(stride));
        let r = if self.cfg.status_read == StatusRead::Contiguous && span <= CONTIGUOUS_MAX_BYTES {
            buf.read_area(span)
                .map(|b| pick_statuses(&b, n as usize, stride as usize))
        } else {
            buf.statuses(n, stride)
        };
        r.map_err(|e| self.drv(e))
    }

    /// A completed job's buffer goes back to the pool all zero. A run that was not resumed
    /// wrote nothing there but done (zero) status words: no thread stopped at a point, or it
    /// would not have completed. A resumed job's threads saved registers (and shared memory) at
    /// their points in earlier runs, which stay in the area after every record is done: it is
    /// scrubbed (`need` bytes), else a later job of another entry or form reading records of
    /// another stride would find non-zero status words where its fresh threads, which finish
    /// without writing theirs, left nothing — pending forever, or a resume launch restoring
    /// garbage or trapping (issue 23: `preempt=auto|restart` under vgpud, whose escalated
    /// checkpoint-form jobs left their registers to the restarting form's next launch).
    fn release_area(&self, buf: &mut DevBuf, resumed: bool, need: u64) {
        if !resumed {
            buf.clean = true;
        } else if let Err(e) = buf.scrub(need) {
            log::warn!("cuda: save area scrub failed ({e}): the buffer is freed");
        }
    }

    /// Clears the flag, attaches the request hook, launches the grid and waits for its end.
    /// Returns whether the flag was raised, the GPU time and the timing trace.
    #[allow(clippy::too_many_arguments)]
    fn ck_kernel(
        &self,
        l: &LaunchState,
        f: sys::CUfunction,
        params: &mut [u8],
        buf: &DevBuf,
        hook: FlagHook,
        (stream, queued): (&Stream, Option<Arc<Queued>>),
        h: &PreemptHandle,
    ) -> Result<(bool, Duration, Trace), super::driver::DrvError> {
        match hook.host {
            // A plain store before the launch is enqueued: program order.
            Some(w) => w.store(0),
            // SAFETY: the job's own buffer and stream.
            None => unsafe {
                ck(
                    "cuMemsetD32Async",
                    sys::cuMemsetD32Async(buf.flag(), 0, 1, stream.stream),
                )?;
            },
        }
        // SAFETY: live event and stream.
        ck("cuEventRecord", unsafe {
            sys::cuEventRecord(hook.cleared, stream.stream)
        })?;
        if hook.method == FlagWrite::Armed {
            hook.arm()?;
        }
        let fired = Arc::new(AtomicBool::new(false));
        let fire_times: Arc<Mutex<Option<(Instant, Instant)>>> = Arc::default();
        let fire = {
            let times = fire_times.clone();
            let q = queued.clone();
            move || {
                let t0 = Instant::now();
                hook.fire();
                let t1 = Instant::now();
                if let Some(q) = &q {
                    q.on_request();
                }
                let mut g = times.lock().unwrap_or_else(|e| e.into_inner());
                g.get_or_insert((t0, t1));
            }
        };
        let fire = Arc::new(fire);
        let (fired2, fire2) = (fired.clone(), fire.clone());
        let guard = h.attach(Arc::new(move || {
            fired2.store(true, Ordering::SeqCst);
            fire2();
        }));
        let mut size = params.len();
        let mut extra: [*mut c_void; 5] = [
            sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
            params.as_mut_ptr().cast(),
            sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
            (&mut size as *mut usize).cast(),
            std::ptr::null_mut(),
        ];
        stream.mark_origin()?;
        h.mark_running();
        stream.mark_start()?;
        // SAFETY: `f` belongs to the transformed module the caller keeps alive; the parameter
        // buffer is laid out as the entry declares (offsets from cuFuncGetParamInfo), with the
        // flag and save area of this job's live buffer; the stream is ours.
        ck("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                l.grid[0],
                l.grid[1],
                l.grid[2],
                l.block[0],
                l.block[1],
                l.block[2],
                l.dynamic_shared,
                stream.stream,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        })?;
        stream.mark_end()?;
        if let Some(q) = &queued {
            q.on_launched(fired.load(Ordering::SeqCst))?;
        }
        let noticed = wait_end(stream, self.cfg.end_wait, h.deadline(), &fired, &*fire);
        if let (FlagWrite::Armed, Some(gate)) = (hook.method, hook.host) {
            // Open the gate whether or not a request did, so the armed write completes (on
            // the flag of a finished kernel, before the buffer is reused).
            gate.store(1);
        }
        drop(guard);
        let noticed = noticed?;
        let gpu = stream.origin_to_end(stream)?;
        let kernel = stream.start_to_end()?;
        let fire_times = *fire_times.lock().unwrap_or_else(|e| e.into_inner());
        Ok((
            fired.load(Ordering::SeqCst),
            gpu,
            Trace {
                fire: fire_times,
                noticed,
                kernel,
                host: hook.host.is_some(),
                synced: None,
                write_to_end: None,
            },
        ))
    }
}

/// Host instants and GPU times of one checkpointed kernel run (`CkBreakdown`'s raw form).
struct Trace {
    /// The hook's flag write: called, returned.
    fire: Option<(Instant, Instant)>,
    noticed: Instant,
    kernel: Duration,
    host: bool,
    synced: Option<Instant>,
    write_to_end: Option<f64>,
}

impl Trace {
    fn breakdown(
        &self,
        path: String,
        requested: Option<Instant>,
        statuses: Instant,
        ready: Instant,
    ) -> CkBreakdown {
        let req = requested.or(self.fire.map(|f| f.0)).unwrap_or(self.noticed);
        let us = |t: Instant| t.saturating_duration_since(req).as_secs_f64() * 1e6;
        let synced = self.synced.unwrap_or(self.noticed);
        CkBreakdown {
            path,
            fire_us: self.fire.map_or(0.0, |f| us(f.1)),
            end_noticed_us: us(self.noticed),
            write_to_end_gpu_us: self.write_to_end,
            kernel_gpu_us: self.kernel.as_secs_f64() * 1e6,
            signal_sync_us: synced.saturating_duration_since(self.noticed).as_secs_f64() * 1e6,
            statuses_us: statuses.saturating_duration_since(synced).as_secs_f64() * 1e6,
            ready_us: us(ready),
        }
    }
}

/// GPU µs from the flag write's `done` event to the kernel's end; `None` if the write came
/// before the kernel started (the flag was already up) or the event was never recorded.
fn write_to_end(stream: &Stream, done: sys::CUevent) -> Option<f64> {
    let to_end = stream.to_end_signed_us(done).ok()?;
    let from_start = stream.start_to(done).ok();
    // `start_to` clamps at 0: a write before the start reads as 0 and counts as "before".
    match from_start {
        Some(d) if d > Duration::ZERO => Some(to_end),
        _ => None,
    }
}
