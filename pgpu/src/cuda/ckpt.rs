//! The checkpoint preemption method on the cuda engine (`CudaConfig::preempt = Checkpoint`):
//! loading the `ptx::ckpt`-transformed module beside the sliced one, and running a launch as
//! ONE launch of the whole grid with the four checkpoint parameters. The flag and the save area
//! are engine-owned device memory (`ckmem`); the flag is cleared on the job stream before the
//! kernel when a request may have left it up (`hostcost`), and a request raises it from the
//! requesting thread (`FlagHook::fire`, ordered after the clear by an event). When the kernel ends, the records' status words are read (one
//! strided copy, only if the flag was raised): any record not done makes the outcome
//! `Preempted`, and `resume` relaunches the grid with `__ck_resume = 1`. A time-slice deadline
//! on the handle is honoured by polling the kernel's end event and raising the flag at it.
//! The kernel's launch and the wait for its end are `cklaunch`'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sys;

use super::ckmem::{DevBuf, FlagHook, FlagWrite};
use super::ckpath::{
    AT_ARMED, AT_NOTICE, CkBreakdown, EndWait, HostFlag, HostFlags, pick_statuses,
};
use super::ckstatus::{Trace, write_to_end};
use super::context::{CkLive, CkStart, JobState, LaunchState, Live};
use super::driver::ck;
use super::engine::CudaEngine;
use super::modules::CkLoaded;
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
            ckpt::Chunking {
                instructions: self.cfg.ckpt_chunk_instructions,
                fast: self.cfg.ckpt_fast_chunks,
                atomic_weight: self.cfg.ckpt_atomic_weight,
            },
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

    /// Where a fresh launch runs checkpointed, if it does (a save area over the limit is
    /// counted as a fallback): the method chooses (`crate::ckpt::choose`), and a restarting
    /// entry's launch that is not provably idempotent runs in the entry's checkpoint form from
    /// its first run (`CkStart::Fresh::save_form`), or sliced where there is none within the
    /// limit.
    pub(crate) fn ck_for(
        &self,
        l: &LaunchState,
    ) -> Result<Option<(Arc<CkLoaded>, usize, CkStart)>, EngineError> {
        if l.next_block != 0 {
            return Ok(None);
        }
        let Some(ck) = lock(&self.modules).ck(l.module)? else {
            return Ok(None);
        };
        let Some((idx, plan)) = ck.plan(&l.entry) else {
            return Ok(None);
        };
        let limit = self.cfg.max_save_area_bytes;
        let need = area_bytes(plan, l.grid, l.block, l.dynamic_shared);
        if need > limit {
            self.ckpt.launch_fallback(&l.entry, need, limit);
            return Ok(None);
        }
        // Auto and restart: one CTA per SM is the smallest wave.
        let wave = u64::from(self.sms.max(1));
        let fresh = |need, save_form| CkStart::Fresh { need, save_form };
        match self
            .ckpt
            .choose(self.cfg.preempt, plan, &l.params, l.total_blocks(), wave)
        {
            ckpt::Choice::Restart | ckpt::Choice::Checkpoint => {
                Ok(Some((ck.clone(), idx, fresh(need, false))))
            }
            ckpt::Choice::Slice(_) => Ok(None),
            ckpt::Choice::SaveForm(why) => {
                let save = lock(&self.modules).ck_save(l.module)?;
                let save = save.and_then(|s| {
                    let (i, p) = s.plan(&l.entry)?;
                    let need = area_bytes(p, l.grid, l.block, l.dynamic_shared);
                    (need <= limit).then_some((s.clone(), i, need))
                });
                self.ckpt.unproven(&l.entry, &why, save.is_none());
                Ok(save.map(|(s, i, need)| (s, i, fresh(need, true))))
            }
        }
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
        start: CkStart,
        h: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        let calls_at_start = super::driver::calls();
        self.check_launch(&l)?;
        let func = self.run_func(&module.loaded, &l.entry)?;
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
        let (buf, before, resume, escalated, need) = match start {
            CkStart::Resume(s) => (s.buf, s.statuses, true, s.escalated, s.area_len),
            CkStart::Fresh { need, save_form } => (
                self.ck_pool.take(need).map_err(|e| self.drv(e))?,
                Vec::new(),
                false,
                save_form,
                need,
            ),
        };
        // This run's request path (`ckchoice`); a fresh launch's is counted.
        let path = self.run_path(&l);
        if !resume {
            self.ckpt.path_chosen(path == super::ckchoice::CkPath::FAST);
        }
        let mut method = match path.flag_write {
            FlagWrite::Armed if !sys::has_symbol("cuStreamWaitValue32_v2") => FlagWrite::WriteValue,
            m => m,
        };
        if !write_value && method != FlagWrite::HostMapped {
            method = FlagWrite::Memcpy;
        }
        // One pinned slot holds the host flag or gate, the end notice and the armed write's
        // completion word.
        let notice_on = path.end_wait == EndWait::Notice;
        let host_flag = match method {
            FlagWrite::HostMapped | FlagWrite::Armed => self.host_flags().and_then(HostFlags::take),
            _ if notice_on => self.host_flags().and_then(HostFlags::take),
            _ => None,
        };
        if method == FlagWrite::Armed && host_flag.is_none() {
            method = FlagWrite::WriteValue;
        }
        let seq = self.ck_path.next_seq();
        let notice = host_flag
            .as_ref()
            .filter(|_| notice_on)
            .map(|f| (f.word(AT_NOTICE), f.device_at(AT_NOTICE), seq));
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
        let queued = self.queue_statuses(&buf, &stream, n, stride, path.status_read)?;
        let mirror = self.take_mirror(n, path.status_read)?;
        let mirror_dev = mirror.as_ref().map_or(0, |m| m.dev);
        if let (Some(f), FlagWrite::HostMapped) = (&host_flag, method) {
            // The kernel reads the mirror's address next to its flag, here in the slot.
            f.set_mirror(mirror_dev);
        }
        // The device flag is cleared (a memset, and `cleared` behind it for the hook's write to
        // wait for) only if it may be up: a buffer's flag stays down from its zeroing until a
        // request raises it (`hostcost`).
        let host_word = method == FlagWrite::HostMapped && host_flag.is_some();
        let clear = super::hostcost::needs_clear(buf.flag_raised, host_word);
        // The request path's two events, pooled (given back below once the hook is gone).
        let events = self.ck_events.take();
        let (cleared, done) = match &events {
            Ok(ev) if clear => (ev.cleared, ev.done),
            Ok(ev) => (std::ptr::null_mut(), ev.done),
            Err(_) => (std::ptr::null_mut(), std::ptr::null_mut()),
        };
        let made = events.as_ref().map(|_| ()).map_err(Clone::clone);
        let hook = FlagHook {
            ctx: self.ctx,
            flag: flag_at,
            cleared,
            signal: arm.as_ref().map_or(signal, |a| a.stream),
            method,
            done,
            host: host_flag
                .as_ref()
                .filter(|_| matches!(method, FlagWrite::HostMapped | FlagWrite::Armed))
                .map(HostFlag::host),
            host_value: if method == FlagWrite::Armed { seq } else { 1 },
            gate: host_flag.as_ref().map_or(0, HostFlag::device),
            armed_done: host_flag.as_ref().map_or(0, |f| f.device_at(AT_ARMED)),
            fallback: signal,
        };
        let armed_word = host_flag.as_ref().map(|f| f.word(AT_ARMED));
        let q = queued.as_ref().map(|(q, _)| q.clone());
        let r = made.and_then(|_| {
            self.ck_kernel(
                &l,
                func.f,
                &mut params,
                (&buf, mirror_dev, clear),
                hook,
                (&stream, q, notice),
                path.end_wait,
                h,
            )
        });
        let mut buf = buf;
        if !host_word {
            // The kernel read the mirror's address in the buffer's header: what it holds now
            // (`ck_kernel` wrote this run's, or 0 over a stale one, or the flag's clear zeroed
            // it); after an error, possibly either.
            buf.mirror_set =
                super::hostcost::mirror_set_after(buf.mirror_set, mirror_dev, r.is_ok());
        }
        // Set when the armed write never completed (see below): its stream, slot and buffer
        // are retired (leaked), never reused.
        let stuck = std::cell::Cell::new(false);
        type Ran = Result<(bool, Duration, Trace), super::driver::DrvError>;
        let finish = |r: Ran| -> Ran {
            let (fired, gpu, mut trace) = r?;
            if let (Some(a), Some(w)) = (&arm, armed_word) {
                // The armed write always runs (its gate was opened at the end if no request
                // did): it lands before this buffer's next job, seen by its completion word
                // (bounded, then the driver's sync).
                if trace.arm_failed {
                    // SAFETY: the job's arming stream, live (its gate is open).
                    ck("cuStreamSynchronize", unsafe {
                        sys::cuStreamSynchronize(a.stream)
                    })?;
                } else if !super::notice::spin_for(w, hook.host_value, super::notice::ARMED_BOUND) {
                    log::warn!(
                        "cuda: the armed flag write's completion word did not come within {} ms: its event is waited for",
                        super::notice::ARMED_BOUND.as_millis()
                    );
                    // Not `cuStreamSynchronize`: a gate the front end never sees would hold
                    // it forever. The event behind the write, for a further bound.
                    if !super::notice::event_within(done, super::notice::ARMED_STUCK) {
                        log::error!(
                            "cuda: the armed flag write did not complete within {} ms more: its stream, slot and buffer are retired",
                            super::notice::ARMED_STUCK.as_millis()
                        );
                        stuck.set(true);
                    }
                }
                if trace.late {
                    // SAFETY: the engine's live signal stream (the late write's).
                    ck("cuStreamSynchronize", unsafe {
                        sys::cuStreamSynchronize(signal)
                    })?;
                }
                trace.synced = Some(Instant::now());
                if fired {
                    trace.write_to_end = write_to_end(&stream, done);
                }
            } else if fired {
                // The flag write may still be queued on the signal stream: let it land now,
                // not in this buffer's next job.
                // SAFETY: the engine's live stream.
                ck("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(hook.signal)
                })?;
                trace.synced = Some(Instant::now());
                if method != FlagWrite::HostMapped {
                    trace.write_to_end = write_to_end(&stream, done);
                }
            }
            Ok((fired, gpu, trace))
        };
        if let (Some(_), Some(f)) = (&arm, &host_flag) {
            // Whatever happened, the armed write's gate opens (a stream waiting on it must
            // not go back to the pool blocked).
            f.host().store(hook.host_value);
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
        // The status mirror: read (and zeroed) once the kernel has ended, if a status may have
        // been stored there (a fresh run that was not requested stores none); while a kernel
        // may still store to it, it is neither reused nor freed (leaked).
        let (mirror_words, r) = match (mirror, r) {
            (Some(pin), Ok(x)) => {
                let words = (x.0 || resume).then(|| {
                    self.ck_path.mirrors.take_mirror(
                        &pin,
                        n as usize,
                        if resume { &before[..] } else { &[] },
                    )
                });
                self.ck_path.mirrors.give(pin);
                (words, Ok(x))
            }
            // `Pinned` has no destructor: not giving it back leaks it.
            (Some(_pin), Err(e)) => (None, Err(e)),
            (None, r) => (None, r),
        };
        // The hook that used the events was removed inside `ck_kernel`, and the signal stream
        // was synchronised if it fired: reused. After an error a write may still be pending
        // behind them (destroyed), and an armed write that never completed may still record
        // `done` (leaked, as its stream).
        match events {
            Ok(ev) if stuck.get() => std::mem::forget(ev),
            Ok(ev) if r.is_ok() && self.lost().is_none() => self.ck_events.give(ev),
            _ => {}
        }
        if self.lost().is_none() {
            self.give_stream(stream);
            match arm {
                // Synchronised in `finish`.
                Some(a) if armed_ok && !stuck.get() => self.give_stream(a),
                Some(a) => std::mem::forget(a),
                None => {}
            }
        } else {
            std::mem::forget(stream);
            std::mem::forget(arm);
        }
        if stuck.get() {
            std::mem::forget(host_flag);
            // Never pooled nor freed, whichever path below ends the job (a preempted job's
            // buffer goes into its saved context, and on with its resumed runs).
            buf.retire();
        } else {
            drop(host_flag);
        }
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
        // The flag's state for the buffer's next launch (the kernel has ended; a raised flag's
        // write has landed: `finish`).
        buf.flag_raised = super::hostcost::raised_after(buf.flag_raised, clear, fired, method);
        let planr = &module.plans[plan];
        // A resumed run that ended unrequested must have finished every record (one strided
        // read per resumed completion); if not, its kernel read an area that had not landed.
        let unfinished = match (fired, resume) {
            (false, true) => {
                let mut after = match mirror_words.clone() {
                    Some(w) => w,
                    None => self.read_statuses(&buf, n, planr.record_bytes, path.status_read)?,
                };
                if mirror_words.is_some() && !ckpt::unrequested_end_complete(&after) {
                    // Confirmed by the records themselves before resuming again.
                    after = self.read_statuses(&buf, n, planr.record_bytes, path.status_read)?;
                }
                (!ckpt::unrequested_end_complete(&after)).then_some(after)
            }
            _ => None,
        };
        if !fired && unfinished.is_none() {
            if !buf.retired {
                self.release_area(&mut buf, resume, need);
            }
            if !resume {
                self.ckpt
                    .unrequested(super::driver::calls().wrapping_sub(calls_at_start));
            }
            return Ok(Outcome::Completed {
                gpu_time: gpu.max(Duration::from_nanos(1)),
            });
        }
        let from_mirror = unfinished.is_none() && mirror_words.is_some();
        let after = match (unfinished, queued_words.or(mirror_words)) {
            (Some(a), _) => {
                log::warn!(
                    "cuda: resumed launch of {} ended unrequested with records not done: resumed again",
                    l.entry
                );
                a
            }
            (None, Some(w)) => w,
            (None, None) => self.read_statuses(&buf, n, planr.record_bytes, path.status_read)?,
        };
        let statuses_at = Instant::now();
        let mut after = after;
        let mut t = tally(
            planr,
            &before,
            &after,
            per_cta,
            shared_per_cta(planr, l.dynamic_shared),
        );
        if t.pending == 0 && from_mirror {
            // The mirror says every record is done after a request (the kernel ended before
            // it stopped): confirmed by the records before the job is called complete, so a
            // mirror store that never landed cannot lose a stop.
            after = self.read_statuses(&buf, n, planr.record_bytes, path.status_read)?;
            t = tally(
                planr,
                &before,
                &after,
                per_cta,
                shared_per_cta(planr, l.dynamic_shared),
            );
        }
        if t.pending == 0 {
            if !buf.retired {
                self.release_area(&mut buf, resume, need);
            }
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
                stalled: planr.restart && !trace.early && ckpt::stalled(&before, &after),
                statuses: after,
                escalated,
            }),
        }));
        let mut flag = if method == FlagWrite::HostMapped && !trace.host {
            "host-mapped (no free word: device flag)".to_string()
        } else {
            method.to_string()
        };
        if trace.arm_failed {
            flag.push_str(" (arm failed)");
        }
        if trace.late {
            flag.push_str(" (late: driver write)");
        }
        let wait = match (path.end_wait, trace.noticed_by) {
            (EndWait::Notice, None) => "notice (no word: event spin)".to_string(),
            (EndWait::Notice, Some(super::notice::Noticed::Event)) => {
                "notice (word lost: event)".to_string()
            }
            (w, _) => format!("{w:?}").to_lowercase(),
        };
        let path = format!(
            "{flag}/{wait}/{}",
            format!("{:?}", path.status_read).to_lowercase()
        );
        self.ck_path
            .record(trace.breakdown(path, h.requested_at(), statuses_at, Instant::now()));
        Ok(Outcome::Preempted {
            context,
            gpu_time: gpu,
        })
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
}
