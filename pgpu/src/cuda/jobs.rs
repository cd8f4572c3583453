//! Jobs on the cuda engine: sliced kernel launches (the grid runs as 1-D sub-launches of K blocks
//! with a block offset, the preemption flag is checked between them, K follows the measured block
//! throughput so that one sub-launch lasts about `CudaConfig::sub_launch_target`) and copy jobs
//! (`cuMemcpyDtoDAsync` in chunks with a preemption check between chunks). Up to
//! `pipeline_depth` sub-launches are in flight on as many streams, so the next one's blocks fill
//! the SMs the previous one's tail leaves idle; a preemption request stops issuing and waits for
//! those in flight. GPU time comes from CUDA events: from an origin event recorded at the start
//! of the call to the end event of the last sub-launch; each sub-launch's own events give the
//! throughput that sizes the next one (never below one wave of resident blocks).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::sys;

use super::context::{CopyState, JobState, LaunchState, Live};
use super::driver::{DrvError, ck};
use super::engine::{CudaEngine, RateKey};
use super::modules::Func;
use super::stream::Stream;
use crate::engine::*;
use crate::sync::lock;

fn kernel_fault(entry: &str, e: &DrvError) -> JobFault {
    JobFault {
        kind: FaultKind::Kernel(format!("{entry}: {e}")),
        va: 0,
        access: None,
        site: None,
    }
}

impl CudaEngine {
    pub(crate) fn run_job(&self, job: JobState, h: &PreemptHandle) -> Result<Outcome, EngineError> {
        self.alive()?;
        match job {
            JobState::Copy(c) => self.run_copy(c, h),
            JobState::Launch(l) => self.run_launch(l, h),
        }
    }

    pub(crate) fn check_launch(&self, l: &LaunchState) -> Result<(), EngineError> {
        let lim = &self.info.limits;
        let bad = |m: &str| Err(EngineError::BadLaunch(m.to_string()));
        if l.entry.len() > lim.max_entry_name {
            return bad("entry name too long");
        }
        if l.params.len() > lim.max_param_bytes {
            return bad("parameter buffer too large");
        }
        for i in 0..3 {
            if l.grid[i] == 0 || l.grid[i] > lim.max_grid[i] {
                return bad("grid size out of range");
            }
            if l.block[i] == 0 || l.block[i] > lim.max_block[i] {
                return bad("block size out of range");
            }
        }
        if l.block.iter().map(|&b| u64::from(b)).product::<u64>()
            > u64::from(lim.max_threads_per_block)
        {
            return bad("too many threads per block");
        }
        if l.dynamic_shared > lim.max_shared_per_block {
            return bad("too much shared memory");
        }
        if l.total_blocks() > u64::from(u32::MAX) {
            return bad("more than 2^32 blocks");
        }
        Ok(())
    }

    fn run_launch(&self, l: LaunchState, h: &PreemptHandle) -> Result<Outcome, EngineError> {
        self.check_launch(&l)?;
        if let Some((ck, plan, start)) = self.ck_for(&l)? {
            self.ckpt.launches.fetch_add(1, Ordering::Relaxed);
            return self.run_ck(l, ck, plan, start, h);
        }
        self.run_sliced(l, h)
    }

    /// Runs (from `l.next_block`) a launch as sliced sub-launches, whatever its module's
    /// checkpoint form: also the next run of a stalled restarting launch that has no checkpoint
    /// form to escalate to (`escalate.rs`), which `run_launch` would restart again.
    pub(crate) fn run_sliced(
        &self,
        mut l: LaunchState,
        h: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        let calls_at_start = super::driver::calls();
        let fresh = l.next_block == 0;
        self.check_launch(&l)?;
        let loaded = lock(&self.modules).get(l.module)?;
        let func = self.run_func(&loaded, &l.entry)?;
        if l.params.len() < func.own_end || l.params.len() > func.slice_off {
            return Err(EngineError::BadLaunch(format!(
                "parameter buffer is {} bytes, the entry takes {}",
                l.params.len(),
                func.own_end
            )));
        }
        let (_use, ()) = self.begin(l.space, |_| ())?;
        let sliced = loaded.sliced;
        let mut buf = vec![0u8; func.slice_off + if sliced { 16 } else { 0 }];
        buf[..l.params.len()].copy_from_slice(&l.params);
        if sliced {
            for (i, g) in l.grid.iter().enumerate() {
                let at = func.slice_off + 4 + 4 * i;
                buf[at..at + 4].copy_from_slice(&g.to_le_bytes());
            }
        }
        let depth = if sliced {
            self.cfg.pipeline_depth.max(1)
        } else {
            1
        };
        let mut streams = Vec::with_capacity(depth);
        for _ in 0..depth {
            match self.take_stream() {
                Ok(st) => streams.push(st),
                Err(e) => {
                    streams.into_iter().for_each(|st| self.give_stream(st));
                    return Err(e);
                }
            }
        }
        let out = self.slices(&mut l, func, sliced, &mut buf, &streams, h);
        if self.lost().is_none() {
            streams.into_iter().for_each(|st| self.give_stream(st));
        } else {
            std::mem::forget(streams);
        }
        let out = out?;
        if fresh && matches!(out, Outcome::Completed { .. }) {
            // One run from the first block to the end: the baseline of the checkpointed
            // runs' host work (`hostcost`).
            self.plain_calls
                .record(super::driver::calls().wrapping_sub(calls_at_start));
        }
        if let Outcome::Preempted { gpu_time, .. } = out {
            let context = SavedContext::live(Box::new(Live {
                engine: self.id,
                job: JobState::Launch(l),
                ck: None,
            }));
            return Ok(Outcome::Preempted { context, gpu_time });
        }
        Ok(out)
    }

    /// Blocks the device runs at once for this entry and shape (one wave).
    fn wave(&self, func: Func, l: &LaunchState) -> u64 {
        let threads = l.block.iter().product::<u32>() as i32;
        let mut per_sm = 0i32;
        super::driver::count_call();
        // SAFETY: live function handle; out-pointer to a local.
        let r = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                func.f,
                threads,
                l.dynamic_shared as usize,
            )
        };
        let per_sm = if r == sys::CUresult::CUDA_SUCCESS {
            per_sm.max(1) as u64
        } else {
            1
        };
        per_sm * u64::from(self.sms)
    }

    /// Size of the first sub-launch: from the throughput measured before for this key, else
    /// `initial_blocks`, else one wave.
    fn first_k(&self, key: &RateKey, wave: u64) -> u64 {
        let target = self.cfg.sub_launch_target.as_secs_f64();
        let floor = self.k_floor(wave);
        match lock(&self.rates).get(key) {
            Some(&rate) => ((rate * target) as u64).max(floor),
            None if self.cfg.initial_blocks > 0 => u64::from(self.cfg.initial_blocks),
            None => wave,
        }
    }

    /// The smallest sub-launch: one wave (fewer blocks would leave SMs idle), or less when
    /// `initial_blocks` asks for less.
    fn k_floor(&self, wave: u64) -> u64 {
        match self.cfg.initial_blocks {
            0 => wave,
            n => wave.min(u64::from(n)),
        }
    }

    /// Issues sub-launches (up to `streams.len()` in flight) until the grid is done or a
    /// preemption is requested, then drains what is in flight. `l.next_block` counts the blocks
    /// finished; the caller fills the context of a preempted launch.
    fn slices(
        &self,
        l: &mut LaunchState,
        func: Func,
        sliced: bool,
        buf: &mut [u8],
        streams: &[Stream],
        h: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        let total = l.total_blocks();
        let key = (l.module, l.entry.clone(), l.block);
        let target = self.cfg.sub_launch_target.as_secs_f64();
        let wave = if sliced { self.wave(func, l) } else { total };
        let floor = self.k_floor(wave);
        let mut k = self.first_k(&key, wave);
        let mut size = buf.len();
        let mut inflight: VecDeque<(usize, u64)> = VecDeque::new();
        let mut issued = l.next_block;
        let mut slot = 0;
        let mut last: Option<usize> = None;
        let mut failure: Option<DrvError> = None;
        let origin_at = std::time::Instant::now();
        let mut first_call = true;
        streams[0].mark_origin().map_err(|e| self.drv(e))?;
        h.mark_running();
        loop {
            while failure.is_none()
                && inflight.len() < streams.len()
                && issued < total
                && !h.is_requested()
            {
                let n = if sliced { k.min(total - issued) } else { total };
                let grid = if sliced { [n as u32, 1, 1] } else { l.grid };
                if sliced {
                    let at = func.slice_off;
                    buf[at..at + 4].copy_from_slice(&(issued as u32).to_le_bytes());
                }
                let mut extra: [*mut c_void; 5] = [
                    // CU_LAUNCH_PARAM_BUFFER_POINTER ((void*)1 in cuda.h)
                    sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
                    buf.as_mut_ptr().cast(),
                    // CU_LAUNCH_PARAM_BUFFER_SIZE ((void*)2)
                    sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
                    (&mut size as *mut usize).cast(),
                    std::ptr::null_mut(), // CU_LAUNCH_PARAM_END
                ];
                let st = &streams[slot];
                self.sub_launches.fetch_add(1, Ordering::Relaxed);
                let called = std::time::Instant::now();
                if first_call {
                    first_call = false;
                    self.origin_gap_ns.fetch_add(
                        called.duration_since(origin_at).as_nanos() as u64,
                        Ordering::Relaxed,
                    );
                }
                let r = st.mark_start().and_then(|_| {
                    // SAFETY: `func` belongs to a module the caller keeps alive; the parameter
                    // buffer is laid out as the entry declares (offsets from
                    // cuFuncGetParamInfo) and the driver copies it at launch; the stream is ours.
                    ck("cuLaunchKernel", unsafe {
                        sys::cuLaunchKernel(
                            func.f,
                            grid[0],
                            grid[1],
                            grid[2],
                            l.block[0],
                            l.block[1],
                            l.block[2],
                            l.dynamic_shared,
                            st.stream,
                            std::ptr::null_mut(),
                            extra.as_mut_ptr(),
                        )
                    })
                });
                let r = r.and_then(|_| st.mark_end());
                self.launch_call_ns
                    .fetch_add(called.elapsed().as_nanos() as u64, Ordering::Relaxed);
                if let Err(e) = r {
                    failure = Some(e);
                    break;
                }
                inflight.push_back((slot, n));
                issued += n;
                slot = (slot + 1) % streams.len();
            }
            let Some((si, n)) = inflight.pop_front() else {
                break;
            };
            match streams[si].wait_end() {
                Ok(d) => {
                    self.kernel_ns
                        .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
                    l.next_block += n;
                    last = Some(si);
                    if sliced {
                        let rate = n as f64 / d.as_secs_f64().max(1e-6);
                        k = ((rate * target) as u64).min(4 * n).max(floor);
                        let mut rates = lock(&self.rates);
                        let e = rates.entry(key.clone()).or_insert(rate);
                        *e = 0.5 * *e + 0.5 * rate;
                    }
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        let gpu = match last {
            Some(si) => streams[0]
                .origin_to_end(&streams[si])
                .map_err(|e| self.drv(e))?,
            None => Duration::ZERO,
        };
        if let Some(e) = failure {
            if e.is_sticky() {
                self.poison(&e);
                return Ok(Outcome::Faulted {
                    fault: kernel_fault(&l.entry, &e),
                    gpu_time: gpu,
                });
            }
            return Err(EngineError::BadLaunch(e.to_string()));
        }
        if l.next_block >= total {
            return Ok(Outcome::Completed {
                gpu_time: gpu.max(Duration::from_nanos(1)),
            });
        }
        Ok(Outcome::Preempted {
            context: SavedContext::from_bytes(Vec::new()),
            gpu_time: gpu,
        })
    }

    fn run_copy(&self, mut c: CopyState, h: &PreemptHandle) -> Result<Outcome, EngineError> {
        if c.src.checked_add(c.len).is_none() || c.dst.checked_add(c.len).is_none() {
            return Err(EngineError::BadCopy("range wraps around"));
        }
        let rem = c.len - c.done;
        let (_use, fault) = self.begin(c.space, |s| {
            let (a, fa) = s.check_access(c.src + c.done, rem, AccessKind::Read);
            let (b, fb) = s.check_access(c.dst + c.done, rem, AccessKind::Write);
            if a <= b { fa.or(fb) } else { fb.or(fa) }
        })?;
        if let Some(fault) = fault {
            return Ok(Outcome::Faulted {
                fault,
                gpu_time: Duration::ZERO,
            });
        }
        let start = Instant::now();
        h.mark_running();
        let dist = c.src.abs_diff(c.dst);
        if dist == 0 {
            c.done = c.len;
        }
        let chunk = if dist < c.len {
            self.cfg.copy_chunk.min(dist)
        } else {
            self.cfg.copy_chunk
        }
        .max(1);
        let stream = self.take_stream()?;
        let out = loop {
            if c.done >= c.len {
                break Ok(Outcome::Completed {
                    gpu_time: start.elapsed(),
                });
            }
            if h.is_requested() {
                let context = SavedContext::live(Box::new(Live {
                    engine: self.id,
                    job: JobState::Copy(c),
                    ck: None,
                }));
                break Ok(Outcome::Preempted {
                    context,
                    gpu_time: start.elapsed(),
                });
            }
            let n = chunk.min(c.len - c.done);
            let t0 = Instant::now();
            // SAFETY: both ranges were checked mapped (source readable, destination writable)
            // in this space, whose mappings are frozen while `_use` lives; the stream is ours.
            let r = ck("cuMemcpyDtoDAsync", unsafe {
                sys::cuMemcpyDtoDAsync_v2(c.dst + c.done, c.src + c.done, n as usize, stream.stream)
            });
            let t1 = Instant::now();
            let r = r.and_then(|_| {
                // SAFETY: our stream.
                ck("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(stream.stream)
                })
            });
            let (call, wait) = (t1 - t0, t1.elapsed());
            self.copy_call_ns
                .fetch_add(call.as_nanos() as u64, Ordering::Relaxed);
            self.copy_wait_ns
                .fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
            if let Err(e) = r {
                break Err(self.drv(e));
            }
            c.done += n;
        };
        if self.lost().is_none() {
            self.give_stream(stream);
        } else {
            std::mem::forget(stream);
        }
        out
    }
}
