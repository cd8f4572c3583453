//! `fairness`: the load generator of the fairness experiment. Keeps one channel backlogged with
//! `depth` compute-bound kernels (`suite::lcg`'s `lcg_spin`: `iters` steps of a 32-bit LCG per
//! thread, `blocks` x `threads`), submitting a new one each time one completes, sleeping on the
//! GPU's interrupt in between (each submission ends with a semaphore release + interrupt); checks
//! every completed kernel's output against the recurrence on the CPU; stops after `ms`
//! milliseconds of guest time (0: never) and drains what is in flight.
//!
//! Arguments: `iters=N` (default 100000), `threads=T` (1..=1024, default 32), `blocks=B`
//! (1..=65535, default 1), `depth=D` (1..=16, default 2), `ms=M` (default 1000, 0 = forever),
//! `report_ms=R` (>= 1, default 100), `wait=poll` (spin instead of sleeping; default: interrupt),
//! `out=vram` (each kernel writes its output to VRAM, and the copy engine copies it to system
//! memory for the check: VRAM the GPU keeps rewriting, e.g. for live snapshots' dirty logging;
//! default `out=sys`: straight to system memory), `pool_mib=N` (a VRAM working set of N MiB,
//! filled at start and checked byte for byte at the end, `guest_programs::vram_dirty`) with
//! `dirty_mib_s=R` (R MiB of it rewritten per second of guest time, by copies appended to the
//! kernels' submissions; default 0), `stray=1` (after each kernel a one-block
//! `stray` kernel increments 64 words 4096 bytes *below* its pointer parameter: the pointer is
//! a one-page VRAM buffer, the words are in the one allocated just before it, before every
//! other buffer, which no kernel is given: a store outside the buffer its write set names,
//! planted for the validation of live write sets; the words are checked at the end against
//! the number of `stray` launches), `kernels=N` (stop submitting after N kernels, whichever
//! of `ms` and N comes first; default 0: no limit), `heap=1` (report the guest heap's
//! high-water mark at the end: long runs must not grow it), and the driver options of
//! `guest_programs::platform::config_from_args` (`vpool_mib=` makes the driver's VRAM pool
//! large enough for the working set).
//!
//! Output (parsed by a host tool):
//! `FAIRNESS pool mib=<N> fill_ms=<ms>` once the working set is filled (with `pool_mib`);
//! `FAIRNESS start iters=<N> threads=<T> blocks=<B> depth=<D>` once, when kernels start;
//! `FAIRNESS t_ms=<guest ms since start> done=<completions>` every `report_ms`;
//! `FAIRNESS stray launches=<n> ok` before the end line with `stray=1` (a mismatch ends ok=0);
//! `FAIRNESS heap top_kib=<KiB>` before the end line with `heap=1` (`guest_rt::heap::top`: the
//! guest RAM the image and the heap used);
//! `FAIRNESS end t_ms=<t> done=<n> ok=<0|1>` at the end (with `pool_mib`, preceded by
//! `FAIRNESS pool rewritten_mib=<M> check=<ok|bad>`).
//! Exit codes: 0 all ok, 1 a result mismatch (`fairness: MISMATCH ...`), 2 a bad argument,
//! 3 a GPU fault or timeout (`FAIRNESS fault <what>`) or no usable GPU.
//!
//! Time is the TSC (the runtime's clock: no VM exit per read), read about once per wake-up.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::str::FromStr;

use gpu_driver::{
    Channel, Error, Fence, Gpu, LaunchDesc, Platform, PushBuf, SysAlloc, VramAlloc, suite_run,
};
use guest_programs::platform::{self, BareMetal};
use guest_programs::vram_dirty::DirtyPool;
use guest_rt::println;
use suite::lcg;

guest_rt::entry!(main);

/// Most kernels kept in flight.
const MAX_DEPTH: u32 = 16;

/// The run's parameters.
#[derive(Clone, Copy, Debug)]
struct Args {
    iters: u32,
    threads: u32,
    blocks: u32,
    depth: u32,
    ms: u64,
    report_ms: u64,
    /// Outputs go to VRAM first (`out=vram`).
    vram_out: bool,
    /// MiB of VRAM working set (0: none) and MiB per second of it rewritten.
    pool_mib: u64,
    dirty_mib_s: u64,
    /// The planted out-of-buffer kernel runs after each kernel (`stray=1`).
    stray: bool,
    /// Most kernels submitted (0: no limit).
    kernels: u64,
    /// Report the heap's high-water mark at the end (`heap=1`).
    heap: bool,
}

/// `key=value` as a number in `lo..=hi`, or `default` when absent.
fn num<T>(key: &str, default: T, lo: T, hi: T) -> Result<T, String>
where
    T: FromStr + PartialOrd + Copy + core::fmt::Display,
{
    let Some(v) = guest_rt::arg(key) else {
        return Ok(default);
    };
    match v.parse::<T>() {
        Ok(n) if n >= lo && n <= hi => Ok(n),
        _ => Err(format!("bad argument {key}={v} (must be {lo}..={hi})")),
    }
}

impl Args {
    fn parse() -> Result<Self, String> {
        Ok(Self {
            iters: num("iters", 100_000, 0, u32::MAX)?,
            threads: num("threads", 32, 1, 1024)?,
            blocks: num("blocks", 1, 1, 65_535)?,
            depth: num("depth", 2, 1, MAX_DEPTH)?,
            ms: num("ms", 1000, 0, u64::MAX / 1_000_000)?,
            report_ms: num("report_ms", 100, 1, u64::MAX / 1_000_000)?,
            vram_out: match guest_rt::arg("out") {
                None | Some("sys") => false,
                Some("vram") => true,
                Some(v) => return Err(format!("bad argument out={v} (must be sys or vram)")),
            },
            pool_mib: num("pool_mib", 0, 0, 65_536)?,
            dirty_mib_s: num("dirty_mib_s", 0, 0, 1 << 20)?,
            stray: match guest_rt::arg("stray") {
                None | Some("0") => false,
                Some("1") => true,
                Some(v) => return Err(format!("bad argument stray={v} (must be 0 or 1)")),
            },
            kernels: num("kernels", 0, 0, u64::MAX)?,
            heap: match guest_rt::arg("heap") {
                None | Some("0") => false,
                Some("1") => true,
                Some(v) => return Err(format!("bad argument heap={v} (must be 0 or 1)")),
            },
        })
    }

    /// Threads per kernel.
    fn count(&self) -> u32 {
        self.threads * self.blocks
    }
}

/// Where one in-flight kernel's parameters and output live (reused once it completed).
struct Slot {
    params: SysAlloc,
    out: SysAlloc,
    /// With `out=vram`: where the kernel writes, copied to `out` after it.
    dev: Option<VramAlloc>,
}

/// What every launch shares.
struct Kernel {
    code: SysAlloc,
    entry: SysAlloc,
    args: Args,
    stray: Option<Stray>,
}

/// The planted kernel (`stray=1`): its pointer parameter is the page after `Stray::buf`, and every thread
/// increments word `tid` of `Stray::buf`, the page below it.
const STRAY_PTX: &str = ".version 7.0
.target sm_70
.address_size 64
.visible .entry stray(.param .u64 p)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<4>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    ld.global.u32 %r2, [%rd3+-4096];
    add.u32 %r2, %r2, 1;
    st.global.u32 [%rd3+-4096], %r2;
    ret;
}
";
const STRAY_ENTRY: &str = "stray";
const STRAY_THREADS: u32 = 64;

struct Stray {
    code: SysAlloc,
    entry: SysAlloc,
    params: SysAlloc,
    /// The page the kernel writes, allocated first (below every other buffer); its pointer
    /// is the page allocated just after it.
    buf: VramAlloc,
    /// Where the words are copied back for the check.
    back: SysAlloc,
    launches: u32,
}

/// Why the run stopped early.
enum Stop {
    Fault(String),
    Mismatch(String),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Fault(format!("{e}"))
    }
}

fn main() -> u8 {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(m) => {
            println!("fairness: {m}");
            return guest_rt::abi::exit_codes::BAD_ARGUMENT;
        }
    };
    let mut cfg = platform::config_from_args();
    // Wait by interrupt unless told to spin.
    cfg.use_interrupts = guest_rt::arg("wait") != Some("poll");
    let opened = BareMetal::find(cfg.use_interrupts)
        .and_then(|p| suite_run::open(p, cfg).map_err(|e| format!("driver init: {e}")));
    let (mut gpu, mut ch, _) = match opened {
        Ok(g) => g,
        Err(e) => {
            println!("fairness: {e}");
            println!("FAIRNESS fault {e}");
            return guest_rt::abi::exit_codes::NO_DEVICE;
        }
    };
    if cfg.use_interrupts && !gpu.interrupts_on() {
        println!("fairness: the GPU's MSI could not be enabled (wait=poll spins instead)");
        println!("FAIRNESS fault no interrupts");
        return guest_rt::abi::exit_codes::NO_DEVICE;
    }
    if let Err(m) = self_check(args.iters) {
        println!("fairness: MISMATCH {m}");
        return guest_rt::abi::exit_codes::CHECK_FAILED;
    }
    let (kernel, slots) = match setup(&mut gpu, args) {
        Ok(k) => k,
        Err(e) => {
            println!(
                "fairness: cannot allocate {} kernels of {} threads: {e} (sys_mib=N gives more system memory)",
                args.depth,
                args.count()
            );
            return guest_rt::abi::exit_codes::BAD_ARGUMENT;
        }
    };
    let pool = match args.pool_mib {
        0 => None,
        mib => match make_pool(&mut gpu, &mut ch, args, mib) {
            Ok(p) => Some(p),
            Err(e) => {
                println!(
                    "fairness: cannot fill a VRAM working set of {mib} MiB: {e} (vpool_mib=N makes the driver's VRAM pool larger)"
                );
                println!("FAIRNESS fault {e}");
                return guest_rt::abi::exit_codes::GPU_FAULT;
            }
        },
    };
    println!(
        "FAIRNESS start iters={} threads={} blocks={} depth={}",
        args.iters, args.threads, args.blocks, args.depth
    );
    let budget_ns = cfg.wait_timeout_ns;
    let mut run = Run {
        kernel,
        slots,
        jump: lcg::Jump::new(args.iters),
        t0: gpu.platform().now_ns(),
        done: 0,
        seed: 0,
        buf: vec![0; args.count() as usize * 4],
        pool,
    };
    let r = run
        .go(&mut gpu, &mut ch, budget_ns)
        .and_then(|()| run.check_pool(&mut gpu, &mut ch));
    let t_ms = run.elapsed_ns(&mut gpu) / 1_000_000;
    if args.heap {
        println!(
            "FAIRNESS heap top_kib={}",
            guest_rt::heap::top().div_ceil(1024)
        );
    }
    match r {
        Ok(()) => {
            println!("FAIRNESS end t_ms={t_ms} done={} ok=1", run.done);
            0
        }
        Err(Stop::Mismatch(m)) => {
            println!("fairness: MISMATCH {m}");
            println!("FAIRNESS end t_ms={t_ms} done={} ok=0", run.done);
            guest_rt::abi::exit_codes::CHECK_FAILED
        }
        Err(Stop::Fault(m)) => {
            println!("FAIRNESS fault {m}");
            guest_rt::abi::exit_codes::GPU_FAULT
        }
    }
}

/// Allocates and fills the VRAM working set.
fn make_pool<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    args: Args,
    mib: u64,
) -> Result<DirtyPool, Error> {
    let t = gpu.platform().now_ns();
    let mut pool = DirtyPool::new(gpu, mib, args.dirty_mib_s, args.depth as usize)?;
    pool.fill(gpu, ch)?;
    let ms = (gpu.platform().now_ns() - t) / 1_000_000;
    println!("FAIRNESS pool mib={mib} fill_ms={ms}");
    Ok(pool)
}

/// The O(log n) form of the recurrence that checks every output must agree with the plain loop.
fn self_check(iters: u32) -> Result<(), String> {
    let j = lcg::Jump::new(iters);
    for (gid, seed) in [(0, 1), (1023, 0x8000_0001)] {
        let (a, b) = (j.value(gid, seed), lcg::reference(gid, iters, seed));
        if a != b {
            return Err(format!(
                "CPU self-check gid={gid} iters={iters}: jump {a:#x} loop {b:#x}"
            ));
        }
    }
    Ok(())
}

/// Loads the PTX and the entry name, and allocates `depth` parameter + output buffers.
fn setup<P: Platform>(gpu: &mut Gpu<P>, args: Args) -> Result<(Kernel, Vec<Slot>), Error> {
    let stray = match args.stray {
        true => Some(setup_stray(gpu)?),
        false => None,
    };
    let code = gpu.sys_alloc(lcg::PTX.len() as u64)?;
    gpu.sys_write(&code, 0, lcg::PTX.as_bytes())?;
    let entry = gpu.sys_alloc(lcg::ENTRY.len() as u64)?;
    gpu.sys_write(&entry, 0, lcg::ENTRY.as_bytes())?;
    let mut slots = Vec::with_capacity(args.depth as usize);
    for _ in 0..args.depth {
        let params = gpu.sys_alloc(16)?;
        let out = gpu.sys_alloc(u64::from(args.count()) * 4)?;
        let dev = match args.vram_out {
            true => Some(gpu.vram_alloc(u64::from(args.count()) * 4)?),
            false => None,
        };
        slots.push(Slot { params, out, dev });
    }
    Ok((
        Kernel {
            code,
            entry,
            args,
            stray,
        },
        slots,
    ))
}

/// The planted kernel's buffers (its VRAM first).
fn setup_stray<P: Platform>(gpu: &mut Gpu<P>) -> Result<Stray, Error> {
    let buf = gpu.vram_alloc(4096)?;
    let target = gpu.vram_alloc(4096)?;
    if target.va != buf.va + 4096 {
        return Err(Error::BadInfo("stray buffers are not adjacent"));
    }
    let code = gpu.sys_alloc(STRAY_PTX.len() as u64)?;
    gpu.sys_write(&code, 0, STRAY_PTX.as_bytes())?;
    let entry = gpu.sys_alloc(STRAY_ENTRY.len() as u64)?;
    gpu.sys_write(&entry, 0, STRAY_ENTRY.as_bytes())?;
    let params = gpu.sys_alloc(8)?;
    gpu.sys_write(&params, 0, &target.va.to_le_bytes())?;
    let back = gpu.sys_alloc(u64::from(STRAY_THREADS) * 4)?;
    Ok(Stray {
        code,
        entry,
        params,
        buf,
        back,
        launches: 0,
    })
}

/// The running experiment.
struct Run {
    kernel: Kernel,
    slots: Vec<Slot>,
    jump: lcg::Jump,
    t0: u64,
    done: u64,
    /// Seed of the last submitted kernel (each kernel gets a new one, so a stale output fails).
    seed: u32,
    buf: Vec<u8>,
    /// The VRAM working set (`pool_mib`).
    pool: Option<DirtyPool>,
}

impl Run {
    /// With a working set: compares all of it (after the run drained).
    fn check_pool<P: Platform>(&mut self, gpu: &mut Gpu<P>, ch: &mut Channel) -> Result<(), Stop> {
        let Some(pool) = self.pool.as_mut() else {
            return Ok(());
        };
        let r = pool.verify(gpu, ch)?;
        println!(
            "FAIRNESS pool rewritten_mib={} check={}",
            pool.written() >> 20,
            if r.is_ok() { "ok" } else { "bad" }
        );
        r.map_err(Stop::Mismatch)
    }

    fn elapsed_ns<P: Platform>(&self, gpu: &mut Gpu<P>) -> u64 {
        gpu.platform().now_ns().saturating_sub(self.t0)
    }

    /// Launches the kernel into slot `s` with the next seed.
    fn submit<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        ch: &mut Channel,
        s: usize,
    ) -> Result<(Fence, u32), Error> {
        self.seed = self.seed.wrapping_add(1);
        let a = self.kernel.args;
        let slot = &self.slots[s];
        let params = suite::layout_params(
            &[
                suite::Param::U64(slot.dev.map_or(slot.out.va, |d| d.va)),
                suite::Param::U32(a.iters),
                suite::Param::U32(self.seed),
            ],
            &[],
        )
        .map_err(|_| Error::BadInfo("lcg_spin parameters"))?;
        gpu.sys_write(&slot.params, 0, &params)?;
        let mut pb = PushBuf::new();
        pb.launch(&LaunchDesc {
            code_va: self.kernel.code.va,
            code_len: lcg::PTX.len() as u32,
            entry_va: self.kernel.entry.va,
            entry_len: lcg::ENTRY.len() as u32,
            grid: [a.blocks, 1, 1],
            block: [a.threads, 1, 1],
            shared_bytes: 0,
            param_va: slot.params.va,
            param_len: params.len() as u32,
        });
        if let Some(d) = slot.dev {
            pb.copy(d.va, slot.out.va, u64::from(a.count()) * 4);
        }
        if let Some(pool) = self.pool.as_mut() {
            let now = gpu.platform().now_ns();
            pool.append(gpu, &mut pb, s, now)?;
        }
        if let Some(st) = &mut self.kernel.stray {
            pb.launch(&LaunchDesc {
                code_va: st.code.va,
                code_len: STRAY_PTX.len() as u32,
                entry_va: st.entry.va,
                entry_len: STRAY_ENTRY.len() as u32,
                grid: [1, 1, 1],
                block: [STRAY_THREADS, 1, 1],
                shared_bytes: 0,
                param_va: st.params.va,
                param_len: 8,
            });
            st.launches += 1;
        }
        // `submit` appends the fence release (with the interrupt flag when interrupts are on).
        Ok((ch.submit(gpu, &mut pb)?, self.seed))
    }

    /// Compares slot `s`'s output with the recurrence for `seed`; the first completion is also
    /// checked step by step at its first and last thread.
    fn check<P: Platform>(&mut self, gpu: &mut Gpu<P>, s: usize, seed: u32) -> Result<(), Stop> {
        gpu.sys_read(&self.slots[s].out, 0, &mut self.buf)?;
        let n = self.kernel.args.count();
        let iters = self.kernel.args.iters;
        let got = |g: u32| {
            let i = g as usize * 4;
            u32::from_le_bytes([
                self.buf[i],
                self.buf[i + 1],
                self.buf[i + 2],
                self.buf[i + 3],
            ])
        };
        let bad = |g: u32, want: u32| {
            Stop::Mismatch(format!(
                "kernel={} seed={seed} out[{g}]={:#x} expected={want:#x} (iters={iters})",
                self.done,
                got(g)
            ))
        };
        if self.done == 1 {
            for g in [0, n - 1] {
                let want = lcg::reference(g, iters, seed);
                if got(g) != want {
                    return Err(bad(g, want));
                }
            }
        }
        match (0..n).find(|&g| got(g) != self.jump.value(g, seed)) {
            Some(g) => Err(bad(g, self.jump.value(g, seed))),
            None => Ok(()),
        }
    }

    /// Fills the pipeline, then per completion: check, submit the next (until `ms`), report.
    fn go<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        ch: &mut Channel,
        budget_ns: u64,
    ) -> Result<(), Stop> {
        let a = self.kernel.args;
        let period = a.report_ms * 1_000_000;
        let stop_at = (a.ms > 0).then(|| a.ms * 1_000_000);
        let limit = (a.kernels > 0).then_some(a.kernels);
        let mut inflight: VecDeque<(Fence, usize, u32)> = VecDeque::new();
        let mut submitted = 0u64;
        for s in 0..self.slots.len() {
            if limit.is_some_and(|n| submitted >= n) {
                break;
            }
            let (f, seed) = self.submit(gpu, ch, s)?;
            inflight.push_back((f, s, seed));
            submitted += 1;
        }
        let mut next_report = period;
        let mut stopping = false;
        // When the kernel at the head of the queue started to be waited for.
        let mut head_since = 0;
        let mut now = 0;
        while let Some(&(fence, s, seed)) = inflight.front() {
            if now >= next_report {
                println!("FAIRNESS t_ms={} done={}", now / 1_000_000, self.done);
                next_report = (now / period + 1) * period;
            }
            match ch.wait_timeout(gpu, fence, next_report - now) {
                Ok(()) => {
                    inflight.pop_front();
                    self.done += 1;
                    self.check(gpu, s, seed)?;
                    now = self.elapsed_ns(gpu);
                    head_since = now;
                    stopping |=
                        stop_at.is_some_and(|t| now >= t) || limit.is_some_and(|n| submitted >= n);
                    if !stopping {
                        let (f, seed) = self.submit(gpu, ch, s)?;
                        inflight.push_back((f, s, seed));
                        submitted += 1;
                    }
                }
                Err(Error::Timeout { .. }) => {
                    now = self.elapsed_ns(gpu);
                    if now - head_since > budget_ns {
                        return Err(Stop::Fault(format!(
                            "timeout: kernel {} not done after {} ms",
                            self.done + 1,
                            (now - head_since) / 1_000_000
                        )));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.check_stray(gpu, ch)
    }

    /// With `stray=1`: every word the planted kernel incremented counts every launch.
    fn check_stray<P: Platform>(&mut self, gpu: &mut Gpu<P>, ch: &mut Channel) -> Result<(), Stop> {
        let Some(st) = &self.kernel.stray else {
            return Ok(());
        };
        let mut pb = PushBuf::new();
        pb.copy(st.buf.va, st.back.va, u64::from(STRAY_THREADS) * 4);
        let f = ch.submit(gpu, &mut pb)?;
        ch.wait(gpu, f)?;
        let mut b = vec![0u8; STRAY_THREADS as usize * 4];
        gpu.sys_read(&st.back, 0, &mut b)?;
        for (t, w) in b.chunks_exact(4).enumerate() {
            let got = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            if got != st.launches {
                return Err(Stop::Mismatch(format!(
                    "stray word {t} = {got}, expected {} (a page the write sets missed?)",
                    st.launches
                )));
            }
        }
        println!("FAIRNESS stray launches={} ok", st.launches);
        Ok(())
    }
}
