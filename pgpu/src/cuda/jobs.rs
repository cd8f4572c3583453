//! Jobs on the cuda engine: sliced kernel launches (the grid runs as 1-D sub-launches of K blocks
//! with a block offset, the preemption flag is checked between them, K follows the measured block
//! throughput so that one sub-launch lasts about `CudaConfig::sub_launch_target`) and copy jobs
//! (`cuMemcpyDtoDAsync` in chunks with a preemption check between chunks). GPU time comes from
//! CUDA events around each sub-launch.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use super::context::{CopyState, JobState, LaunchState, Live};
use super::driver::{DrvError, ck};
use super::engine::{CudaEngine, RateKey, lock};
use super::modules::Func;
use super::stream::Stream;
use crate::engine::*;

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

    fn check_launch(&self, l: &LaunchState) -> Result<(), EngineError> {
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

    fn run_launch(&self, mut l: LaunchState, h: &PreemptHandle) -> Result<Outcome, EngineError> {
        self.check_launch(&l)?;
        let loaded = lock(&self.modules).get(l.module)?;
        let func = loaded.func(&l.entry)?;
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
        let stream = self.take_stream()?;
        let out = self.slices(&mut l, func, sliced, &mut buf, &stream, h);
        if self.lost().is_none() {
            self.give_stream(stream);
        } else {
            std::mem::forget(stream);
        }
        let out = out?;
        if let Outcome::Preempted { gpu_time, .. } = out {
            let context = SavedContext::live(Box::new(Live {
                engine: self.id,
                job: JobState::Launch(l),
            }));
            return Ok(Outcome::Preempted { context, gpu_time });
        }
        Ok(out)
    }

    /// The first sub-launch size for a key never measured: two blocks per SM.
    fn first_k(&self, key: &RateKey) -> u64 {
        let target = self.cfg.sub_launch_target.as_secs_f64();
        match lock(&self.rates).get(key) {
            Some(&rate) => ((rate * target) as u64).max(1),
            None if self.cfg.initial_blocks > 0 => u64::from(self.cfg.initial_blocks),
            None => 2 * u64::from(self.sms),
        }
    }

    /// Runs sub-launches until done, preempted (context filled by the caller) or faulted.
    fn slices(
        &self,
        l: &mut LaunchState,
        func: Func,
        sliced: bool,
        buf: &mut [u8],
        stream: &Stream,
        h: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        let total = l.total_blocks();
        let key = (l.module, l.entry.clone(), l.block);
        let target = self.cfg.sub_launch_target.as_secs_f64();
        let mut k = self.first_k(&key);
        let mut gpu = Duration::ZERO;
        let mut size = buf.len();
        h.mark_running();
        loop {
            if l.next_block >= total {
                return Ok(Outcome::Completed {
                    gpu_time: gpu.max(Duration::from_nanos(1)),
                });
            }
            if h.is_requested() {
                return Ok(Outcome::Preempted {
                    context: SavedContext::from_bytes(Vec::new()),
                    gpu_time: gpu,
                });
            }
            let n = if sliced {
                k.min(total - l.next_block)
            } else {
                total
            };
            let grid = if sliced { [n as u32, 1, 1] } else { l.grid };
            if sliced {
                let at = func.slice_off;
                buf[at..at + 4].copy_from_slice(&(l.next_block as u32).to_le_bytes());
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
            stream.mark_start().map_err(|e| self.drv(e))?;
            self.sub_launches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: `func` belongs to a module kept alive by the caller; the parameter buffer
            // is laid out as the entry declares (offsets from cuFuncGetParamInfo) and outlives
            // the call (the driver copies it at launch); the stream is ours.
            let r = ck("cuLaunchKernel", unsafe {
                sys::cuLaunchKernel(
                    func.f,
                    grid[0],
                    grid[1],
                    grid[2],
                    l.block[0],
                    l.block[1],
                    l.block[2],
                    l.dynamic_shared,
                    stream.stream,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                )
            });
            let r = r.and_then(|_| stream.finish());
            let d = match r {
                Ok(d) => d,
                Err(e) if e.is_sticky() => {
                    self.poison(&e);
                    return Ok(Outcome::Faulted {
                        fault: kernel_fault(&l.entry, &e),
                        gpu_time: gpu,
                    });
                }
                Err(e) => return Err(EngineError::BadLaunch(e.to_string())),
            };
            gpu += d;
            l.next_block += n;
            if sliced {
                let rate = n as f64 / d.as_secs_f64().max(1e-6);
                k = ((rate * target) as u64).clamp(1, 4 * n);
                let mut rates = lock(&self.rates);
                let e = rates.entry(key.clone()).or_insert(rate);
                *e = 0.5 * *e + 0.5 * rate;
            }
        }
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
                }));
                break Ok(Outcome::Preempted {
                    context,
                    gpu_time: start.elapsed(),
                });
            }
            let n = chunk.min(c.len - c.done);
            // SAFETY: both ranges were checked mapped (source readable, destination writable)
            // in this space, whose mappings are frozen while `_use` lives; the stream is ours.
            let r = ck("cuMemcpyDtoDAsync", unsafe {
                sys::cuMemcpyDtoDAsync_v2(c.dst + c.done, c.src + c.done, n as usize, stream.stream)
            })
            .and_then(|_| {
                // SAFETY: our stream.
                ck("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(stream.stream)
                })
            });
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
