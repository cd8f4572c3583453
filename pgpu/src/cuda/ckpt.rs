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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::sys;

use super::ckmem::{DevBuf, FlagHook, FlagWrite, Signal};
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
        let t = match ckpt::transform(text, limits, self.cfg.ckpt_poll_interval, restart) {
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

    fn signal(&self) -> Result<&Signal, EngineError> {
        if let Some(s) = self.signal.get() {
            return Ok(s);
        }
        let s = Stream::new().map_err(|e| self.drv(e))?;
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
        let mut params = p.buffer(&l.params, buf.flag(), buf.area(), resume, l.dynamic_shared)?;
        let stream = self.take_stream()?;
        let mut cleared: sys::CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; destroyed below once the hook is gone.
        ck("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut cleared,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        })
        .map_err(|e| self.drv(e))?;
        let method = match self.cfg.flag_write {
            FlagWrite::WriteValue if !write_value => FlagWrite::Memcpy,
            m => m,
        };
        let r = self.ck_kernel(
            &l,
            func.f,
            &mut params,
            &buf,
            (cleared, signal, method),
            &stream,
            h,
        );
        // SAFETY: created above; the hook that used it was removed inside `ck_kernel`.
        unsafe { sys::cuEventDestroy_v2(cleared) };
        if self.lost().is_none() {
            self.give_stream(stream);
        } else {
            std::mem::forget(stream);
        }
        let (fired, gpu) = match r {
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
        let mut buf = buf;
        if fired {
            // The flag write may still be queued on the signal stream: let it land now, not in
            // this buffer's next job.
            // SAFETY: the engine's live signal stream.
            ck("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(signal)
            })
            .map_err(|e| self.drv(e))?;
        }
        if !fired {
            self.release_area(&mut buf, resume, need);
            return Ok(Outcome::Completed {
                gpu_time: gpu.max(Duration::from_nanos(1)),
            });
        }
        let planr = &module.plans[plan];
        let (n, per_cta) = threads(l.grid, l.block);
        let after = buf
            .statuses(n, planr.record_bytes)
            .map_err(|e| self.drv(e))?;
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

    /// Clears the flag, attaches the request hook, launches the grid and waits for its end.
    /// Returns whether the flag was raised and the GPU time.
    #[allow(clippy::too_many_arguments)]
    fn ck_kernel(
        &self,
        l: &LaunchState,
        f: sys::CUfunction,
        params: &mut [u8],
        buf: &DevBuf,
        (cleared, signal, method): (sys::CUevent, sys::CUstream, FlagWrite),
        stream: &Stream,
        h: &PreemptHandle,
    ) -> Result<(bool, Duration), super::driver::DrvError> {
        // SAFETY: the job's own buffer and stream; the event is live.
        unsafe {
            ck(
                "cuMemsetD32Async",
                sys::cuMemsetD32Async(buf.flag(), 0, 1, stream.stream),
            )?;
            ck("cuEventRecord", sys::cuEventRecord(cleared, stream.stream))?;
        }
        let fired = Arc::new(AtomicBool::new(false));
        let hook = FlagHook {
            ctx: self.ctx,
            flag: buf.flag(),
            cleared,
            signal,
            method,
        };
        let fired2 = fired.clone();
        let guard = h.attach(Arc::new(move || {
            fired2.store(true, Ordering::SeqCst);
            hook.fire();
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
        if let Some(deadline) = h.deadline() {
            // A time slice: poll the end and raise the flag at the deadline.
            loop {
                if stream.end_done()? {
                    break;
                }
                if Instant::now() >= deadline && !fired.swap(true, Ordering::SeqCst) {
                    hook.fire();
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        let r = stream.wait_end();
        drop(guard);
        r?;
        let gpu = stream.origin_to_end(stream)?;
        Ok((fired.load(Ordering::SeqCst), gpu))
    }
}
