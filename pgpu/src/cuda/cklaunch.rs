//! The kernel launch of one checkpointed run on the cuda engine (`ckpt::run_ck`'s middle):
//! the flag's clear and the status mirror's address on the job stream, the request hook
//! attached (a request pending already also raises the flag on the job stream, before the
//! kernel), the launch with its start and end events, the end notice and the armed write,
//! and the wait for the kernel's end by the configured `EndWait`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ckmem::{DevBuf, FlagHook, FlagWrite};
use super::ckpath::{EndWait, HostWord, wait_end};
use super::ckqueue::Queued;
use super::ckstatus::Trace;
use super::context::LaunchState;
use super::driver::ck;
use super::engine::CudaEngine;
use super::stream::Stream;
use super::sys;
use crate::engine::PreemptHandle;

impl CudaEngine {
    /// Clears the flag, attaches the request hook, launches the grid and waits for its end.
    /// Returns whether the flag was raised, the GPU time and the timing trace.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ck_kernel(
        &self,
        l: &LaunchState,
        f: sys::CUfunction,
        params: &mut [u8],
        (buf, mirror, clear): (&DevBuf, u64, bool),
        hook: FlagHook,
        (stream, queued, notice): (&Stream, Option<Arc<Queued>>, Option<NoticeWord>),
        end_wait: EndWait,
        h: &PreemptHandle,
    ) -> Result<(bool, Duration, Trace), super::driver::DrvError> {
        match (hook.method, hook.host) {
            // A plain store before the launch is enqueued: program order (the mirror's
            // address is in the slot already).
            (FlagWrite::HostMapped, Some(w)) => w.store(0),
            // The flag (if it may be up: `clear`), then the mirror's address next to it (0:
            // none), on the job stream: this run's, or 0 over a previous run's
            // (`DevBuf::mirror_set`: runs of one engine may take different status reads,
            // `ckchoice`) unless the flag's clear, which zeroes it, just did. A buffer no
            // mirror run used is never written: 0 since its zeroing.
            // SAFETY: the job's own buffer (256 header bytes) and stream.
            _ => unsafe {
                if clear {
                    ck(
                        "cuMemsetD32Async",
                        sys::cuMemsetD32Async(buf.flag(), 0, 4, stream.stream),
                    )?;
                }
                if super::hostcost::writes_mirror(mirror, buf.mirror_set, clear) {
                    let at = buf.flag() + ptx::ckpt::MIRROR_OFF as u64;
                    ck(
                        "cuMemsetD32Async",
                        sys::cuMemsetD32Async(at, mirror as u32, 1, stream.stream),
                    )?;
                    ck(
                        "cuMemsetD32Async",
                        sys::cuMemsetD32Async(at + 4, (mirror >> 32) as u32, 1, stream.stream),
                    )?;
                }
            },
        }
        if let (FlagWrite::Armed, Some(gate)) = (hook.method, hook.host) {
            // Closed before the hook is attached (a request's store comes after it).
            gate.store(0);
        }
        if !hook.cleared.is_null() {
            // SAFETY: live event and stream.
            ck("cuEventRecord", unsafe {
                sys::cuEventRecord(hook.cleared, stream.stream)
            })?;
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
        let early = fired.load(Ordering::SeqCst);
        if early && hook.flag == buf.flag() {
            // A request pending before the launch (the hook fired at `attach`) must stop the
            // kernel at its first point: the hook's own write goes on another stream (the
            // signal or arming stream; the armed one is enqueued only after the launch), which
            // a short kernel may outrun. The same flag raised on the job's stream, behind the
            // clear, is in program order before the kernel. (A host-mapped word the kernel
            // reads instead was stored by the hook before the launch.)
            // SAFETY: the job's own buffer and stream.
            ck("cuMemsetD32Async", unsafe {
                sys::cuMemsetD32Async(buf.flag(), 1, 1, stream.stream)
            })?;
        }
        // One event starts both the call's GPU time and the kernel's (nothing is enqueued
        // between them).
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
        let notice = notice.filter(|&(_, dev, value)| {
            // SAFETY: the job's live stream; `dev` is a word of the job's pinned slot, held
            // until the job ends (its value is fresh: an older store never matches).
            let r = ck("cuStreamWriteValue32_v2", unsafe {
                sys::cuStreamWriteValue32_v2(stream.stream, dev, value, 0)
            });
            // The kernel runs: its end is waited for by the event instead.
            r.inspect_err(|e| log::warn!("cuda: enqueuing the end notice failed: {e}"))
                .is_ok()
        });
        let arm_failed = hook.method == FlagWrite::Armed
            && hook.arm().map_or_else(
                |e| {
                    // The job goes on: a request is then written by the driver once late
                    // (`EndWait::Notice`), else the kernel runs to its end; the arming
                    // stream is synchronised after the gate opens.
                    log::warn!("cuda: arming the checkpoint flag failed: {e}");
                    true
                },
                |_| false,
            );
        if let Some(q) = &queued {
            q.on_launched(&fired)?;
        }
        let late = || hook.fire_driver();
        let (noticed, noticed_by, late_used) = match notice {
            Some((word, _, value)) => match super::notice::wait(&super::notice::Wait {
                word,
                value,
                stream,
                deadline: h.deadline(),
                fired: &fired,
                fire: &*fire,
                late: (hook.method == FlagWrite::Armed).then_some(&late as &dyn Fn()),
            }) {
                Ok((t, by, l)) => (Ok(t), Some(by), l),
                Err(e) => (Err(e), None, false),
            },
            None => (
                wait_end(stream, end_wait, h.deadline(), &fired, &*fire),
                None,
                false,
            ),
        };
        if let (FlagWrite::Armed, Some(gate)) = (hook.method, hook.host) {
            // Open the gate whether or not a request did, so the armed write completes (on
            // the flag of a finished kernel, before the buffer is reused).
            gate.store(hook.host_value);
        }
        drop(guard);
        let noticed = noticed?;
        let gpu = stream.start_to_end()?;
        let kernel = gpu;
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
                noticed_by,
                late: late_used,
                arm_failed,
                early,
            },
        ))
    }
}

/// `EndWait::Notice`'s word: host address, device address, the launch's value.
pub(super) type NoticeWord = (HostWord, u64, u32);
