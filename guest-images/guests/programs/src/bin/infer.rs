//! `infer`: the latency-sensitive side of the priority experiment. Issues requests one after
//! another: a request is `kernels` launches of `suite::lcg`'s `lcg_spin` (`iters` steps of a
//! 32-bit LCG per thread, `blocks` x `threads`) submitted back to back on one channel and waited
//! for (sleeping on the GPU's interrupt), every output checked against the recurrence on the CPU;
//! then `think_us` microseconds of guest CPU "think time" (a busy-wait on the TSC, no GPU work)
//! before the next request. Stops after `ms` milliseconds of guest time (at least one request).
//!
//! Arguments: `iters=N` (default 100000), `threads=T` (1..=1024, default 32), `blocks=B`
//! (1..=65535, default 1), `kernels=K` (1..=16, default 2), `think_us=U` (default 1000),
//! `ms=M` (1.., default 1000), `lines=L` (most per-request lines, default 2000), `wait=poll`
//! (spin instead of sleeping; default: interrupt), and the driver options of
//! `guest_programs::platform::config_from_args`.
//!
//! Output (parsed by a host tool):
//! `INFER start iters=<N> threads=<T> blocks=<B> kernels=<K> think_us=<U>` once;
//! `INFER req=<n> lat_us=<latency>` per request, for the first `lines` requests (output stays
//! bounded);
//! `INFER end t_ms=<t> requests=<n> ok=<0|1> p50_us=<p> p99_us=<p> max_us=<m> exits=<e>` at the
//! end (the percentiles over every request, from a log-linear histogram: at most 1/32 below the
//! truth; `exits`: the driver's MMIO accesses, each a VM exit, over all the requests).
//! Latency is from the first launch of a request to the last of its outputs checked.
//! Exit codes: 0 all ok, 10 a result mismatch (`infer: MISMATCH ...`), 11 a bad argument,
//! 12 no usable GPU, 13 a GPU fault or timeout (`INFER fault <what>`).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::str::FromStr;

use gpu_driver::{Channel, Error, Fence, Gpu, LaunchDesc, Platform, PushBuf, SysAlloc, suite_run};
use guest_programs::platform::{self, BareMetal};
use guest_rt::println;
use suite::lcg;

guest_rt::entry!(main);

/// Most kernels per request.
const MAX_KERNELS: u32 = 16;

/// The run's parameters.
#[derive(Clone, Copy, Debug)]
struct Args {
    iters: u32,
    threads: u32,
    blocks: u32,
    kernels: u32,
    think_us: u64,
    ms: u64,
    lines: u64,
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
            kernels: num("kernels", 2, 1, MAX_KERNELS)?,
            think_us: num("think_us", 1000, 0, 60_000_000)?,
            ms: num("ms", 1000, 1, u64::MAX / 1_000_000)?,
            lines: num("lines", 2000, 0, 1_000_000)?,
        })
    }

    /// Threads per kernel.
    fn count(&self) -> u32 {
        self.threads * self.blocks
    }
}

/// Latencies in microseconds, log-linear: values below 32 exactly, above in 32 steps per
/// octave (a bucket's lower bound is at most 1/32 below any value in it).
struct Histogram {
    counts: Vec<u64>,
    n: u64,
    max: u64,
}

const SUB: u32 = 32;

impl Histogram {
    fn new() -> Self {
        Self {
            counts: vec![0; (SUB as usize) * 60],
            n: 0,
            max: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < u64::from(SUB) {
            return v as usize;
        }
        let oct = 63 - v.leading_zeros(); // >= 5
        let sub = (v >> (oct - 5)) & u64::from(SUB - 1);
        ((oct - 4) * SUB) as usize + sub as usize
    }

    fn lower(i: usize) -> u64 {
        if i < SUB as usize {
            return i as u64;
        }
        let oct = (i / SUB as usize) as u32 + 4;
        let sub = (i % SUB as usize) as u64;
        (u64::from(SUB) + sub) << (oct - 5)
    }

    fn add(&mut self, v: u64) {
        let i = Self::index(v).min(self.counts.len() - 1);
        self.counts[i] += 1;
        self.n += 1;
        self.max = self.max.max(v);
    }

    /// The `p`-th percentile (1..=100): the lower bound of the bucket holding it.
    fn percentile(&self, p: u64) -> u64 {
        let rank = (self.n * p).div_ceil(100).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::lower(i);
            }
        }
        self.max
    }
}

/// Where one kernel of a request has its parameters and output.
struct Slot {
    params: SysAlloc,
    out: SysAlloc,
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
            println!("infer: {m}");
            return guest_rt::abi::exit_codes::BAD_ARGUMENT;
        }
    };
    let mut cfg = platform::config_from_args();
    cfg.use_interrupts = guest_rt::arg("wait") != Some("poll");
    let opened = BareMetal::find(cfg.use_interrupts)
        .and_then(|p| suite_run::open(p, cfg).map_err(|e| format!("driver init: {e}")));
    let (mut gpu, mut ch, _) = match opened {
        Ok(g) => g,
        Err(e) => {
            println!("infer: {e}");
            println!("INFER fault {e}");
            return guest_rt::abi::exit_codes::NO_DEVICE;
        }
    };
    if cfg.use_interrupts && !gpu.interrupts_on() {
        println!("infer: the GPU's MSI could not be enabled (wait=poll spins instead)");
        println!("INFER fault no interrupts");
        return guest_rt::abi::exit_codes::NO_DEVICE;
    }
    let (code, entry, slots) = match setup(&mut gpu, args) {
        Ok(k) => k,
        Err(e) => {
            println!(
                "infer: cannot allocate {} kernels of {} threads: {e} (sys_mib=N gives more system memory)",
                args.kernels,
                args.count()
            );
            return guest_rt::abi::exit_codes::BAD_ARGUMENT;
        }
    };
    println!(
        "INFER start iters={} threads={} blocks={} kernels={} think_us={}",
        args.iters, args.threads, args.blocks, args.kernels, args.think_us
    );
    let mut run = Run {
        args,
        code,
        entry,
        slots,
        jump: lcg::Jump::new(args.iters),
        seed: 0,
        requests: 0,
        kernels_done: 0,
        hist: Histogram::new(),
        buf: vec![0; args.count() as usize * 4],
    };
    let t0 = gpu.platform().now_ns();
    let mmio0 = gpu.mmio_count();
    let r = run.go(&mut gpu, &mut ch, t0, cfg.wait_timeout_ns);
    let t_ms = gpu.platform().now_ns().saturating_sub(t0) / 1_000_000;
    let exits = gpu.mmio_count().saturating_sub(mmio0);
    let summary = |ok: u8, run: &Run| {
        println!(
            "INFER end t_ms={t_ms} requests={} ok={ok} p50_us={} p99_us={} max_us={} exits={exits}",
            run.requests,
            run.hist.percentile(50),
            run.hist.percentile(99),
            run.hist.max
        );
    };
    match r {
        Ok(()) => {
            summary(1, &run);
            0
        }
        Err(Stop::Mismatch(m)) => {
            println!("infer: MISMATCH {m}");
            summary(0, &run);
            guest_rt::abi::exit_codes::CHECK_FAILED
        }
        Err(Stop::Fault(m)) => {
            println!("INFER fault {m}");
            guest_rt::abi::exit_codes::GPU_FAULT
        }
    }
}

/// Loads the PTX and the entry name, and allocates `kernels` parameter + output buffers.
fn setup<P: Platform>(
    gpu: &mut Gpu<P>,
    args: Args,
) -> Result<(SysAlloc, SysAlloc, Vec<Slot>), Error> {
    let code = gpu.sys_alloc(lcg::PTX.len() as u64)?;
    gpu.sys_write(&code, 0, lcg::PTX.as_bytes())?;
    let entry = gpu.sys_alloc(lcg::ENTRY.len() as u64)?;
    gpu.sys_write(&entry, 0, lcg::ENTRY.as_bytes())?;
    let mut slots = Vec::with_capacity(args.kernels as usize);
    for _ in 0..args.kernels {
        let params = gpu.sys_alloc(16)?;
        let out = gpu.sys_alloc(u64::from(args.count()) * 4)?;
        slots.push(Slot { params, out });
    }
    Ok((code, entry, slots))
}

/// The running experiment.
struct Run {
    args: Args,
    code: SysAlloc,
    entry: SysAlloc,
    slots: Vec<Slot>,
    jump: lcg::Jump,
    /// Seed of the last launched kernel (each kernel gets a new one, so a stale output fails).
    seed: u32,
    requests: u64,
    kernels_done: u64,
    hist: Histogram,
    buf: Vec<u8>,
}

impl Run {
    /// Launches the kernel into slot `s` with the next seed.
    fn submit<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        ch: &mut Channel,
        s: usize,
    ) -> Result<(Fence, u32), Error> {
        self.seed = self.seed.wrapping_add(1);
        let a = self.args;
        let slot = &self.slots[s];
        let params = suite::layout_params(
            &[
                suite::Param::U64(slot.out.va),
                suite::Param::U32(a.iters),
                suite::Param::U32(self.seed),
            ],
            &[],
        )
        .map_err(|_| Error::BadInfo("lcg_spin parameters"))?;
        gpu.sys_write(&slot.params, 0, &params)?;
        let mut pb = PushBuf::new();
        pb.launch(&LaunchDesc {
            code_va: self.code.va,
            code_len: lcg::PTX.len() as u32,
            entry_va: self.entry.va,
            entry_len: lcg::ENTRY.len() as u32,
            grid: [a.blocks, 1, 1],
            block: [a.threads, 1, 1],
            shared_bytes: 0,
            param_va: slot.params.va,
            param_len: params.len() as u32,
        });
        Ok((ch.submit(gpu, &mut pb)?, self.seed))
    }

    /// Compares slot `s`'s output with the recurrence for `seed` (the very first kernel is also
    /// checked step by step at its first and last thread).
    fn check<P: Platform>(&mut self, gpu: &mut Gpu<P>, s: usize, seed: u32) -> Result<(), Stop> {
        gpu.sys_read(&self.slots[s].out, 0, &mut self.buf)?;
        let n = self.args.count();
        let iters = self.args.iters;
        let buf = &self.buf;
        let got = |g: u32| {
            let i = g as usize * 4;
            u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]])
        };
        let bad = |g: u32, want: u32| {
            Stop::Mismatch(format!(
                "request={} kernel={s} seed={seed} out[{g}]={:#x} expected={want:#x} (iters={iters})",
                self.requests,
                got(g)
            ))
        };
        if self.kernels_done == 0 {
            for g in [0, n - 1] {
                let want = lcg::reference(g, iters, seed);
                if got(g) != want {
                    return Err(bad(g, want));
                }
            }
        }
        match (0..n).find(|&g| got(g) != self.jump.value(g, seed)) {
            Some(g) => Err(bad(g, self.jump.value(g, seed))),
            None => {
                self.kernels_done += 1;
                Ok(())
            }
        }
    }

    /// Waits for `fence`, sleeping on the interrupt; a fault if it takes over `budget_ns`.
    fn wait<P: Platform>(
        &self,
        gpu: &mut Gpu<P>,
        ch: &mut Channel,
        fence: Fence,
        budget_ns: u64,
    ) -> Result<(), Stop> {
        let since = gpu.platform().now_ns();
        loop {
            match ch.wait_timeout(gpu, fence, budget_ns) {
                Ok(()) => return Ok(()),
                Err(Error::Timeout { .. }) => {
                    let waited = gpu.platform().now_ns().saturating_sub(since);
                    if waited >= budget_ns {
                        return Err(Stop::Fault(format!(
                            "timeout: request {} not done after {} ms",
                            self.requests + 1,
                            waited / 1_000_000
                        )));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Requests until `ms` of guest time passed: launch, wait, check, record, think.
    fn go<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        ch: &mut Channel,
        t0: u64,
        budget_ns: u64,
    ) -> Result<(), Stop> {
        let stop_at = self.args.ms * 1_000_000;
        let mut seeds = vec![0u32; self.slots.len()];
        loop {
            let start = gpu.platform().now_ns();
            let mut last = None;
            for (s, seed) in seeds.iter_mut().enumerate() {
                let (f, sd) = self.submit(gpu, ch, s)?;
                *seed = sd;
                last = Some(f);
            }
            // The channel completes in order: the last fence covers the whole request.
            if let Some(f) = last {
                self.wait(gpu, ch, f, budget_ns)?;
            }
            for (s, &seed) in seeds.iter().enumerate() {
                self.check(gpu, s, seed)?;
            }
            let end = gpu.platform().now_ns();
            let lat_us = end.saturating_sub(start) / 1000;
            self.hist.add(lat_us);
            self.requests += 1;
            if self.requests <= self.args.lines {
                println!("INFER req={} lat_us={lat_us}", self.requests);
            }
            if end.saturating_sub(t0) >= stop_at {
                return Ok(());
            }
            // Think time: guest CPU only.
            let think_end = end + self.args.think_us * 1000;
            while gpu.platform().now_ns() < think_end {
                core::hint::spin_loop();
            }
            if gpu.platform().now_ns().saturating_sub(t0) >= stop_at {
                return Ok(());
            }
        }
    }
}
