//! The request path of a checkpointed/restarting launch on the cuda engine, as configurable
//! parts (issue 23: which part of request → context costs what): how the host notices the
//! kernel's end ([`EndWait`]), how the status words are read back ([`StatusRead`]), the
//! host-mapped flag words of [`super::ckmem::FlagWrite::HostMapped`] ([`HostFlags`]), and the
//! per-preemption timing record ([`CkBreakdown`]) the engine keeps for `vgpu-bench preempt`
//! and the GPU tests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::driver::{Ctx, DrvError, ck};
use super::stream::Stream;
use super::sys;

/// How the engine waits for a checkpointed kernel's end event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EndWait {
    /// `cuEventSynchronize` (the context's scheduling policy decides whether the driver spins,
    /// yields or blocks; the primary context's default `CU_CTX_SCHED_AUTO` spins while the
    /// process has fewer active contexts than cores). The baseline.
    #[default]
    Sync,
    /// `cuEventQuery` in a busy loop (one core for the kernel's whole run).
    Spin,
    /// `cuEventQuery` with `sched_yield` between queries.
    Yield,
    /// Spin on a host-pinned word that the job stream's front end writes behind the kernel
    /// (`cuStreamWriteValue32`, enqueued at launch): no driver call while waiting. Bounded:
    /// the end event is queried every few ms, and an end event without the word is logged
    /// and taken as the end (`notice::wait`). Without a free word (or if the write cannot be
    /// enqueued, logged) it spins on `cuEventQuery` instead.
    Notice,
}

impl std::str::FromStr for EndWait {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(EndWait::Sync),
            "spin" => Ok(EndWait::Spin),
            "yield" => Ok(EndWait::Yield),
            "notice" => Ok(EndWait::Notice),
            o => Err(format!("unknown end wait {o:?} (sync|spin|yield|notice)")),
        }
    }
}

/// How the status words of a preempted launch come back to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusRead {
    /// One `cuMemcpy2D` of 4-byte rows, one per thread record (the baseline).
    #[default]
    Strided,
    /// One contiguous copy of all the records (when they are at most
    /// [`CONTIGUOUS_MAX_BYTES`]), the words picked out on the host; else strided.
    Contiguous,
    /// As `Contiguous`, but the request enqueues the copy (into pinned memory) on the job
    /// stream behind the kernel (`ckqueue`): no round trip after the end is noticed.
    Queued,
    /// The kernel itself stores every status word it writes into a host-pinned mirror too
    /// (`ptx::ckpt::MIRROR_OFF`): the host reads them from memory, no driver call (records
    /// spanning at most [`CONTIGUOUS_MAX_BYTES`]; else strided). A mirror saying "all done"
    /// after a request is confirmed by a strided read.
    Mirror,
}

/// Largest record span [`StatusRead::Contiguous`] copies whole.
pub const CONTIGUOUS_MAX_BYTES: u64 = 4 << 20;

impl std::str::FromStr for StatusRead {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strided" => Ok(StatusRead::Strided),
            "contiguous" => Ok(StatusRead::Contiguous),
            "queued" => Ok(StatusRead::Queued),
            "mirror" => Ok(StatusRead::Mirror),
            o => Err(format!(
                "unknown status read {o:?} (strided|contiguous|queued|mirror)"
            )),
        }
    }
}

/// Waits for `stream`'s end event under `mode`; with a `deadline` (a time slice), raises the
/// flag there (`fire`, once: `fired` records it). Returns when the end was noticed.
pub fn wait_end(
    stream: &Stream,
    mode: EndWait,
    deadline: Option<Instant>,
    fired: &AtomicBool,
    fire: &dyn Fn(),
) -> Result<Instant, DrvError> {
    loop {
        let now = Instant::now();
        let pending = match deadline {
            Some(d) if !fired.load(Ordering::SeqCst) => {
                if now >= d {
                    if !fired.swap(true, Ordering::SeqCst) {
                        fire();
                    }
                    None
                } else {
                    Some(d - now)
                }
            }
            _ => None,
        };
        if mode == EndWait::Sync && pending.is_none() {
            stream.sync_end()?;
            return Ok(Instant::now());
        }
        if stream.end_done()? {
            return Ok(Instant::now());
        }
        match (mode, pending) {
            // Before a deadline: short sleeps (bounded by the deadline), as the engine did.
            (EndWait::Sync, Some(left)) => {
                std::thread::sleep(left.min(Duration::from_micros(20)));
            }
            (EndWait::Yield, _) => std::thread::yield_now(),
            _ => std::hint::spin_loop(),
        }
    }
}

/// Bytes per host flag slot (one cache line each, so two jobs' words never share one).
const SLOT: usize = 64;
/// Offsets in a slot: the flag (`HostMapped`) or the gate (`Armed`); the status mirror's
/// address the kernel reads at `flag + MIRROR_OFF` (`HostMapped`); the end notice; the armed
/// write's completion.
pub const AT_FLAG: usize = 0;
pub const AT_MIRROR: usize = 8;
pub const AT_NOTICE: usize = 16;
pub const AT_ARMED: usize = 20;
const _: () = assert!(AT_MIRROR as i64 == ptx::ckpt::MIRROR_OFF && AT_ARMED + 4 <= SLOT);
/// Words of the page.
const SLOTS: usize = 64;

/// Host-pinned, device-mapped flag words (`cuMemAllocHost`: with unified addressing every
/// device reaches it, at the device pointer `cuMemHostGetDevicePointer` gives). The CPU raises
/// a flag with a plain store; a kernel's `ld.volatile.global` of it (relaxed, system scope)
/// crosses PCIe at every poll.
#[derive(Debug)]
pub struct HostFlags {
    ctx: Ctx,
    host: *mut u8,
    dev: u64,
    used: Mutex<[bool; SLOTS]>,
}

// SAFETY: the page is pinned host memory used through volatile accesses of one word per
// holder (the slot's `HostFlag`); the pointer is freed once in Drop.
unsafe impl Send for HostFlags {}
// SAFETY: as above.
unsafe impl Sync for HostFlags {}

impl HostFlags {
    /// Allocates the page (the context must be current).
    pub fn new(ctx: Ctx) -> Result<HostFlags, DrvError> {
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; one page.
        ck("cuMemAllocHost_v2", unsafe {
            sys::cuMemAllocHost_v2(&mut p, SLOT * SLOTS)
        })?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is the pinned allocation just made.
        let r = ck("cuMemHostGetDevicePointer_v2", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0)
        });
        if let Err(e) = r {
            // SAFETY: allocated above, freed once.
            unsafe { sys::cuMemFreeHost(p) };
            return Err(e);
        }
        // SAFETY: the page is ours, SLOT * SLOTS bytes.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, SLOT * SLOTS) };
        Ok(HostFlags {
            ctx,
            host: p.cast(),
            dev,
            used: Mutex::new([false; SLOTS]),
        })
    }

    /// A free word, cleared (`None` when every word is in use).
    pub fn take(&self) -> Option<HostFlag<'_>> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let i = used.iter().position(|u| !u)?;
        used[i] = true;
        let f = HostFlag { pool: self, i };
        for off in (0..SLOT).step_by(4) {
            f.word(off).store(0);
        }
        Some(f)
    }
}

impl Drop for HostFlags {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: the page allocated in `new`, freed once; no kernel holds a word (the
            // engine outlives its jobs).
            unsafe { sys::cuMemFreeHost(self.host.cast()) };
        }
    }
}

/// One held word of [`HostFlags`].
#[derive(Debug)]
pub struct HostFlag<'a> {
    pool: &'a HostFlags,
    i: usize,
}

impl HostFlag<'_> {
    /// The flag word's device address (the kernel's `__ck_flag`).
    pub fn device(&self) -> u64 {
        self.device_at(AT_FLAG)
    }

    /// The flag word's host address (what a hook stores to).
    pub fn host(&self) -> HostWord {
        self.word(AT_FLAG)
    }

    /// Device address of the slot's word at `off` (one of the `AT_*`).
    pub fn device_at(&self, off: usize) -> u64 {
        self.pool.dev + (self.i * SLOT + off.min(SLOT - 4)) as u64
    }

    /// Host address of the slot's word at `off` (one of the `AT_*`).
    pub fn word(&self, off: usize) -> HostWord {
        // SAFETY: inside the page (i < SLOTS, off clamped inside the slot, 4-aligned).
        HostWord(unsafe { self.pool.host.add(self.i * SLOT + (off.min(SLOT - 4) & !3)) }.cast())
    }

    /// Stores the status mirror's device address at `AT_MIRROR` (0: none), before a launch.
    pub fn set_mirror(&self, dev: u64) {
        self.word(AT_MIRROR).store(dev as u32);
        self.word(AT_MIRROR + 4).store((dev >> 32) as u32);
    }
}

impl Drop for HostFlag<'_> {
    fn drop(&mut self) {
        let mut used = self.pool.used.lock().unwrap_or_else(|e| e.into_inner());
        used[self.i] = false;
    }
}

/// A host flag word's address, copyable into a hook.
#[derive(Debug, Clone, Copy)]
pub struct HostWord(*mut u32);

// SAFETY: a pinned word written with volatile stores only; the job that holds its slot keeps
// the page alive while the hook may run.
unsafe impl Send for HostWord {}
// SAFETY: as above.
unsafe impl Sync for HostWord {}

impl HostWord {
    /// Stores `v` and fences, so the GPU's next read across PCIe sees it.
    pub fn store(self, v: u32) {
        // SAFETY: an aligned word of the live pinned page (see `Send`).
        unsafe { std::ptr::write_volatile(self.0, v) };
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// A word of ordinary memory, for tests of the waits (the caller keeps it alive).
    #[cfg(test)]
    pub fn for_test(w: &mut u32) -> HostWord {
        HostWord(w)
    }

    /// Loads the word (the GPU's front end may store to it at any time), then an acquire
    /// fence: what the GPU wrote before it (the kernel's mirror stores, which the stream's
    /// write fences like `__threadfence_system`) is visible to the loads after this one.
    pub fn load(self) -> u32 {
        // SAFETY: an aligned word of the live pinned page (see `Send`).
        let v = unsafe { std::ptr::read_volatile(self.0) };
        std::sync::atomic::fence(Ordering::Acquire);
        v
    }
}

/// Where one preemption's time went (all µs; host times from `Instant`, GPU times from CUDA
/// events of one context). "Request" is the `PreemptHandle::request` call, or the time-slice
/// deadline's flag raise.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CkBreakdown {
    /// The flag write, the end wait and the status read that were used.
    pub path: String,
    /// Request → the hook's flag write returned (its driver calls; a store for host-mapped).
    pub fire_us: f64,
    /// Request → the host noticed the kernel's end event.
    pub end_noticed_us: f64,
    /// GPU time from the flag write's completion (an event recorded behind it on its stream)
    /// to the kernel's end event: the kernel seeing the flag at a poll and every CTA exiting.
    /// `None` for host-mapped flags (no stream op) and when the flag went up before the
    /// kernel started.
    pub write_to_end_gpu_us: Option<f64>,
    /// GPU time from the kernel's start event to its end event.
    pub kernel_gpu_us: f64,
    /// End noticed → the signal stream synchronised (the write landed).
    pub signal_sync_us: f64,
    /// → the status words on the host.
    pub statuses_us: f64,
    /// Request → the preempted outcome built (the live context in VRAM, ready).
    pub ready_us: f64,
}

impl CkBreakdown {
    /// Request → the flag in device memory, estimated by anchoring the GPU's end event at the
    /// host's notice of it: `end_noticed - write_to_end` (includes the notice delay).
    pub fn request_to_write_us(&self) -> Option<f64> {
        self.write_to_end_gpu_us.map(|g| self.end_noticed_us - g)
    }
}

/// Recent breakdowns kept by an engine (oldest dropped first).
pub const KEPT: usize = 4096;

/// The engine's state of these parts.
#[derive(Debug)]
pub struct PathState {
    pub host_flags: OnceLock<Result<HostFlags, String>>,
    pub breakdowns: Mutex<VecDeque<CkBreakdown>>,
    /// Pinned buffers of `StatusRead::Queued`.
    pub pins: super::ckqueue::PinPool,
    /// Status mirrors of `StatusRead::Mirror`: every idle one is all zero.
    pub mirrors: super::ckqueue::PinPool,
    /// Values of the end notices and gates (never 0: a cleared word never matches).
    pub seq: std::sync::atomic::AtomicU32,
}

impl PathState {
    pub fn new(ctx: Ctx) -> PathState {
        PathState {
            host_flags: OnceLock::new(),
            breakdowns: Mutex::new(VecDeque::new()),
            pins: super::ckqueue::PinPool::new(ctx),
            mirrors: super::ckqueue::PinPool::new(ctx),
            seq: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// A fresh non-zero notice value.
    pub fn next_seq(&self) -> u32 {
        loop {
            let v = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if v != 0 {
                return v;
            }
        }
    }

    pub fn record(&self, b: CkBreakdown) {
        let mut q = self.breakdowns.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= KEPT {
            q.pop_front();
        }
        q.push_back(b);
    }

    pub fn take(&self) -> Vec<CkBreakdown> {
        let mut q = self.breakdowns.lock().unwrap_or_else(|e| e.into_inner());
        q.drain(..).collect()
    }
}

/// Status word `g` of records `stride` bytes apart in `bytes` (a contiguous copy).
pub fn pick_statuses(bytes: &[u8], n: usize, stride: usize) -> Vec<u32> {
    (0..n)
        .map(|g| {
            let o = g * stride;
            bytes
                .get(o..o + 4)
                .map_or(0, |w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_refuse_unknown_names() {
        assert_eq!("spin".parse::<EndWait>(), Ok(EndWait::Spin));
        assert_eq!("yield".parse::<EndWait>(), Ok(EndWait::Yield));
        assert_eq!("sync".parse::<EndWait>(), Ok(EndWait::Sync));
        assert!("busy".parse::<EndWait>().is_err());
        assert_eq!(
            "contiguous".parse::<StatusRead>(),
            Ok(StatusRead::Contiguous)
        );
        assert!("2d".parse::<StatusRead>().is_err());
        assert_eq!("notice".parse::<EndWait>(), Ok(EndWait::Notice));
        assert_eq!("mirror".parse::<StatusRead>(), Ok(StatusRead::Mirror));
    }

    #[test]
    fn statuses_are_picked_at_the_stride() {
        let mut b = vec![0u8; 3 * 24];
        b[0..4].copy_from_slice(&7u32.to_le_bytes());
        b[24..28].copy_from_slice(&1u32.to_le_bytes());
        b[48..52].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        b[52] = 9; // a register slot, not a status
        assert_eq!(pick_statuses(&b, 3, 24), vec![7, 1, 0xdead_beef]);
        // Short input: missing words read as 0 (never a panic).
        assert_eq!(pick_statuses(&b[..30], 3, 24), vec![7, 1, 0]);
    }

    #[test]
    fn breakdowns_are_bounded_and_drained() {
        let s = PathState::new(Ctx {
            ctx: std::ptr::null_mut(),
            device: 0,
        });
        assert_ne!(s.next_seq(), 0);
        s.seq.store(u32::MAX - 1, Ordering::Relaxed);
        assert_eq!(s.next_seq(), u32::MAX);
        assert_eq!(s.next_seq(), 1, "0 is skipped when the values wrap");
        for i in 0..KEPT + 10 {
            s.record(CkBreakdown {
                fire_us: i as f64,
                ..CkBreakdown::default()
            });
        }
        let v = s.take();
        assert_eq!(v.len(), KEPT);
        assert_eq!(v[0].fire_us, 10.0);
        assert!(s.take().is_empty());
        let b = CkBreakdown {
            end_noticed_us: 50.0,
            write_to_end_gpu_us: Some(12.5),
            ..CkBreakdown::default()
        };
        assert_eq!(b.request_to_write_us(), Some(37.5));
    }
}
