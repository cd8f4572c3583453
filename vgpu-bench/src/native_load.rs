//! `vgpu-bench native-load` (hidden): one plain CUDA process, no VM and no vgpu-vmm code in the
//! path — the native anchor of `priority` (and of any experiment that compares against "plain
//! CUDA processes sharing the GPU under the driver's own time-slicing").
//!
//! It runs `suite::lcg`'s `lcg_spin` through the CUDA driver API (cudarc, its own context on
//! device 0) in one of two roles and prints the same lines as the guest it stands in for, so
//! the experiments parse both with one parser:
//! - `hp`: the `infer` guest — requests of `kernels` launches back to back on one stream, waited
//!   for, every output checked, then `think_us` of CPU busy-wait; `INFER ...` lines.
//! - `lp`: the `fairness` guest — kernels kept `depth` deep in flight, each output checked;
//!   `FAIRNESS ...` lines (progress every `report_ms`).
//!
//! Both start at `--start-at` (Unix time in ms) so that processes of one run begin together.
//! Exit codes as the guests': 0 ok, 10 a result mismatch, 12 no usable GPU (no driver), 13 a
//! CUDA error during the run.

use std::ffi::CString;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};
use suite::lcg;

/// Role of a native process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Latency-sensitive requests.
    Hp,
    /// Backlogged kernels.
    Lp,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// hp: requests of a few kernels with think time (the `infer` guest); lp: a backlog (the
    /// `fairness` guest).
    #[arg(long, value_enum)]
    pub role: Role,
    /// lcg_spin steps per thread.
    #[arg(long)]
    pub iters: u32,
    /// Threads per CTA.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// CTAs per kernel.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub blocks: u32,
    /// hp: launches per request.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub kernels: u32,
    /// hp: CPU think time between requests, µs.
    #[arg(long, default_value_t = 1000)]
    pub think_us: u64,
    /// lp: kernels in flight.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub depth: u32,
    /// Run time, ms.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub ms: u64,
    /// hp: most per-request lines printed.
    #[arg(long, default_value_t = 2000)]
    pub lines: u64,
    /// lp: progress line period, ms.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub report_ms: u64,
    /// Unix time (ms) at which to start the run (0: at once).
    #[arg(long, default_value_t = 0)]
    pub start_at: u64,
}

/// Exit codes (the bundled guests' convention).
pub const EXIT_MISMATCH: u8 = 10;
pub const EXIT_NO_GPU: u8 = 12;
pub const EXIT_FAULT: u8 = 13;

enum Stop {
    Cuda(&'static str, DriverError),
    Mismatch(String),
}

type R<T> = Result<T, Stop>;

fn ck(what: &'static str) -> impl FnOnce(DriverError) -> Stop {
    move |e| Stop::Cuda(what, e)
}

fn check(code: sys::CUresult, what: &'static str) -> R<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Stop::Cuda(what, DriverError(code)))
    }
}

/// The loaded kernel and one output buffer per slot.
struct Kernel {
    stream: Arc<CudaStream>,
    func: sys::CUfunction,
    module: sys::CUmodule,
    outs: Vec<sys::CUdeviceptr>,
    count: u32,
    threads: u32,
    blocks: u32,
    iters: u32,
    jump: lcg::Jump,
    _ctx: Arc<CudaContext>,
}

impl Kernel {
    fn new(a: &Args, slots: usize) -> R<Self> {
        let ctx = CudaContext::new(0).map_err(ck("create a context on device 0"))?;
        let stream = ctx.new_stream().map_err(ck("create a stream"))?;
        let text = CString::new(lcg::PTX).expect("the suite's PTX has no NUL");
        let name = CString::new(lcg::ENTRY).expect("entry name");
        let mut module = std::ptr::null_mut();
        let mut func = std::ptr::null_mut();
        // SAFETY: the context is current on this thread (new_stream binds it); `text` is a
        // NUL-terminated PTX image that outlives the call; the out-pointers are valid.
        unsafe {
            check(
                sys::cuModuleLoadData(&mut module, text.as_ptr().cast()),
                "load lcg_spin",
            )?;
            check(
                sys::cuModuleGetFunction(&mut func, module, name.as_ptr()),
                "find lcg_spin",
            )?;
        }
        let count = a.threads * a.blocks;
        let mut outs = Vec::with_capacity(slots);
        for _ in 0..slots {
            let mut p = 0;
            check(
                // SAFETY: valid out-pointer; the context is current.
                unsafe { sys::cuMemAlloc_v2(&mut p, u64::from(count) as usize * 4) },
                "allocate an output buffer",
            )?;
            outs.push(p);
        }
        Ok(Kernel {
            stream,
            func,
            module,
            outs,
            count,
            threads: a.threads,
            blocks: a.blocks,
            iters: a.iters,
            jump: lcg::Jump::new(a.iters),
            _ctx: ctx,
        })
    }

    /// Launches into `slot` with `seed` (asynchronous, on the stream).
    fn launch(&self, slot: usize, seed: u32) -> R<()> {
        let mut out = self.outs[slot];
        let mut iters = self.iters;
        let mut seed = seed;
        let mut params: [*mut std::ffi::c_void; 3] = [
            (&raw mut out).cast(),
            (&raw mut iters).cast(),
            (&raw mut seed).cast(),
        ];
        check(
            // SAFETY: `func` belongs to the current context; `params` points at three live locals
            // matching the kernel's (.u64, .u32, .u32) parameters, read by the driver during the
            // call; the stream is this context's.
            unsafe {
                sys::cuLaunchKernel(
                    self.func,
                    self.blocks,
                    1,
                    1,
                    self.threads,
                    1,
                    1,
                    0,
                    self.stream.cu_stream(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "launch lcg_spin",
        )
    }

    fn sync(&self) -> R<()> {
        self.stream.synchronize().map_err(ck("synchronize"))
    }

    /// Reads `slot` back and compares two threads' values (first and last) with the recurrence
    /// for `seed`; the first check of a run compares every thread.
    fn verify(&self, slot: usize, seed: u32, full: bool) -> R<()> {
        let mut host = vec![0u32; self.count as usize];
        check(
            // SAFETY: `host` has room for `count` u32s, the buffer was allocated with that size;
            // the stream was synchronized by the caller.
            unsafe {
                sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), self.outs[slot], host.len() * 4)
            },
            "read an output back",
        )?;
        let gids: Vec<u32> = if full {
            (0..self.count).collect()
        } else {
            vec![0, self.count - 1]
        };
        for gid in gids {
            let want = self.jump.value(gid, seed);
            if host[gid as usize] != want {
                return Err(Stop::Mismatch(format!(
                    "seed={seed} gid={gid} got={:#x} want={want:#x}",
                    host[gid as usize]
                )));
            }
        }
        Ok(())
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self._ctx.bind_to_thread();
        for p in &self.outs {
            // SAFETY: allocated by cuMemAlloc in this context, freed once.
            unsafe { sys::cuMemFree_v2(*p) };
        }
        // SAFETY: loaded in this context, unloaded once; no launch is in flight (synchronized).
        unsafe { sys::cuModuleUnload(self.module) };
    }
}

fn wait_start(start_at: u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if start_at > now {
        std::thread::sleep(Duration::from_millis((start_at - now).min(60_000)));
    }
}

fn percentile(sorted: &[u64], p: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() as u64 * p).div_ceil(100).max(1) as usize;
    sorted[rank - 1]
}

fn run_hp(a: &Args, out: &mut impl Write) -> R<()> {
    let k = Kernel::new(a, a.kernels as usize)?;
    let _ = writeln!(
        out,
        "INFER start iters={} threads={} blocks={} kernels={} think_us={} native=1",
        a.iters, a.threads, a.blocks, a.kernels, a.think_us
    );
    wait_start(a.start_at);
    let t0 = Instant::now();
    let mut lat = Vec::new();
    let mut seed = 0u32;
    let mut ok = true;
    let mut stop = None;
    while lat.is_empty() || t0.elapsed() < Duration::from_millis(a.ms) {
        let r0 = Instant::now();
        let seeds: Vec<u32> = (0..a.kernels)
            .map(|_| {
                seed = seed.wrapping_add(1);
                seed
            })
            .collect();
        let res = (|| {
            for (s, &sd) in seeds.iter().enumerate() {
                k.launch(s, sd)?;
            }
            k.sync()?;
            for (s, &sd) in seeds.iter().enumerate() {
                k.verify(s, sd, lat.is_empty())?;
            }
            Ok(())
        })();
        if let Err(e) = res {
            ok = false;
            stop = Some(e);
            break;
        }
        let us = r0.elapsed().as_micros() as u64;
        if (lat.len() as u64) < a.lines {
            let _ = writeln!(out, "INFER req={} lat_us={us}", lat.len() + 1);
        }
        lat.push(us);
        let think = Instant::now() + Duration::from_micros(a.think_us);
        while Instant::now() < think {
            std::hint::spin_loop();
        }
    }
    let mut sorted = lat.clone();
    sorted.sort_unstable();
    let _ = writeln!(
        out,
        "INFER end t_ms={} requests={} ok={} p50_us={} p99_us={} max_us={}",
        t0.elapsed().as_millis(),
        lat.len(),
        u8::from(ok),
        percentile(&sorted, 50),
        percentile(&sorted, 99),
        sorted.last().copied().unwrap_or(0)
    );
    stop.map_or(Ok(()), Err)
}

fn run_lp(a: &Args, out: &mut impl Write) -> R<()> {
    let depth = a.depth as usize;
    let k = Kernel::new(a, depth)?;
    let _ = writeln!(
        out,
        "FAIRNESS start iters={} threads={} blocks={} depth={depth} native=1",
        a.iters, a.threads, a.blocks
    );
    wait_start(a.start_at);
    let t0 = Instant::now();
    let mut next_report = Duration::from_millis(a.report_ms);
    let mut seed = 0u32;
    let mut done = 0u64;
    // One stream, in order: launch `depth` kernels, then wait for the oldest by synchronizing
    // on an event recorded after it.
    let mut events = Vec::with_capacity(depth);
    for _ in 0..depth {
        let mut e = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer; the context is current (Kernel::new bound it).
            unsafe {
                sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            },
            "create an event",
        )?;
        events.push(e);
    }
    let mut seeds = vec![0u32; depth];
    let res = (|| {
        for (s, sd) in seeds.iter_mut().enumerate() {
            seed = seed.wrapping_add(1);
            *sd = seed;
            k.launch(s, seed)?;
            check(
                // SAFETY: event and stream of the current context.
                unsafe { sys::cuEventRecord(events[s], k.stream.cu_stream()) },
                "record an event",
            )?;
        }
        let mut s = 0;
        while t0.elapsed() < Duration::from_millis(a.ms) {
            check(
                // SAFETY: the event was recorded on this context's stream.
                unsafe { sys::cuEventSynchronize(events[s]) },
                "wait for a kernel",
            )?;
            k.verify(s, seeds[s], done == 0)?;
            done += 1;
            if t0.elapsed() >= next_report {
                let _ = writeln!(
                    out,
                    "FAIRNESS t_ms={} done={done}",
                    t0.elapsed().as_millis()
                );
                next_report += Duration::from_millis(a.report_ms);
            }
            seed = seed.wrapping_add(1);
            seeds[s] = seed;
            k.launch(s, seed)?;
            check(
                // SAFETY: as above.
                unsafe { sys::cuEventRecord(events[s], k.stream.cu_stream()) },
                "record an event",
            )?;
            s = (s + 1) % depth;
        }
        k.sync()
    })();
    for e in events {
        // SAFETY: created above, destroyed once, no longer waited on.
        unsafe { sys::cuEventDestroy_v2(e) };
    }
    let _ = writeln!(
        out,
        "FAIRNESS end t_ms={} done={done} ok={}",
        t0.elapsed().as_millis(),
        u8::from(res.is_ok())
    );
    res
}

/// Runs one native process; returns its exit code.
pub fn run(a: &Args) -> u8 {
    // SAFETY: only tries to dlopen the library; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        eprintln!("native-load: no CUDA driver (libcuda.so could not be loaded)");
        return EXIT_NO_GPU;
    }
    let mut out = std::io::stdout().lock();
    let res = match a.role {
        Role::Hp => run_hp(a, &mut out),
        Role::Lp => run_lp(a, &mut out),
    };
    let _ = out.flush();
    match res {
        Ok(()) => 0,
        Err(Stop::Mismatch(m)) => {
            let who = if a.role == Role::Hp {
                "infer"
            } else {
                "fairness"
            };
            println!("{who}: MISMATCH {m}");
            EXIT_MISMATCH
        }
        Err(Stop::Cuda(what, e)) => {
            let prefix = if a.role == Role::Hp {
                "INFER"
            } else {
                "FAIRNESS"
            };
            println!("{prefix} fault {what}: {e}");
            EXIT_FAULT
        }
    }
}
