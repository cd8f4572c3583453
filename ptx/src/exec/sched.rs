//! CTA scheduling: worker threads take independent CTAs (preempted ones first, then fresh
//! ones); within a CTA, warps run round-robin in quanta with `bar.sync` semantics.
//! Preemption and faults stop every worker; unfinished CTAs keep their exact state.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use crate::exec::cta::{Cta, cta_coords};
use crate::exec::launch::{KernelFault, Launch, RunControl, RunOutcome, Stats};
use crate::exec::mem::Tlb;
use crate::exec::pool;
use crate::exec::warp::{Env, WarpStop, deliver_bar_red, exec_warp, fix_thread};
use crate::ir::Entry;
use crate::memory::GlobalMemory;

/// Warp-instructions a warp runs before the scheduler rotates and polls for preemption.
pub(crate) const QUANTUM: u64 = 256;
/// Most worker threads.
const MAX_THREADS: usize = 256;

enum CtaStop {
    Done,
    Preempted,
    Fault(KernelFault),
}

struct Shared<'a> {
    entry: &'a Entry,
    module: &'a crate::modvars::ModMem,
    launch_cfg: &'a crate::exec::launch::LaunchConfig,
    shared_bytes: u32,
    total: u64,
    next: AtomicU64,
    pending: Mutex<Vec<Cta>>,
    preempted: Mutex<Vec<Cta>>,
    fault: Mutex<Option<KernelFault>>,
    stats: Mutex<Stats>,
    stop: AtomicBool,
    ctl: &'a RunControl,
    mem: &'a dyn GlobalMemory,
    t0: Instant,
    printf: Mutex<Vec<u8>>,
}

/// Run a launch until completion, fault or preemption.
pub(crate) fn run(l: &mut Launch, mem: &dyn GlobalMemory, ctl: &RunControl) -> RunOutcome {
    if let Some(f) = l.fault {
        return RunOutcome::Faulted(f);
    }
    if l.is_complete() {
        return RunOutcome::Completed(Stats::default());
    }
    let module = l.module.clone();
    let entry = &module.entries[l.entry];
    let sh = Shared {
        entry,
        module: &module.vars,
        launch_cfg: &l.cfg,
        shared_bytes: l.shared_bytes,
        total: l.total_ctas,
        next: AtomicU64::new(l.next_cta),
        pending: Mutex::new(std::mem::take(&mut l.pending)),
        preempted: Mutex::new(Vec::new()),
        fault: Mutex::new(None),
        stats: Mutex::new(Stats::default()),
        stop: AtomicBool::new(false),
        ctl,
        mem,
        t0: Instant::now(),
        printf: Mutex::new(std::mem::take(&mut l.printf)),
    };
    let threads = ctl.threads.clamp(1, MAX_THREADS);
    if threads == 1 {
        worker(&sh);
    } else {
        // The calling thread is one of the workers; the others come from the pool.
        if !pool::scope_run(threads - 1, &|| worker(&sh)) {
            log::error!("ptx: a worker thread panicked");
        }
    }
    l.printf = into(sh.printf);
    let stats: Stats = into(sh.stats);
    let fault: Option<KernelFault> = into(sh.fault);
    let mut pending: Vec<Cta> = into(sh.preempted);
    pending.extend(into(sh.pending));
    pending.sort_by_key(|c| c.linear);
    l.next_cta = sh.next.load(Relaxed).min(l.total_ctas);
    l.pending = pending;
    l.stats.add(stats);
    if let Some(f) = fault {
        log::debug!("kernel fault: {f}");
        l.fault = Some(f);
        return RunOutcome::Faulted(f);
    }
    if l.is_complete() {
        RunOutcome::Completed(stats)
    } else {
        RunOutcome::Preempted(stats)
    }
}

fn into<T>(m: Mutex<T>) -> T {
    m.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn worker(sh: &Shared) {
    let mut tlb = Tlb::new();
    let mut stats = Stats::default();
    let mut steps_left = sh.ctl.step_limit.unwrap_or(u64::MAX);
    let info = &sh.entry.info;
    let block = sh.launch_cfg.block;
    let threads = block[0] * block[1] * block[2];
    loop {
        if sh.stop.load(Relaxed) || sh.ctl.stop_requested() || steps_left == 0 {
            break;
        }
        let popped = lock(&sh.pending).pop();
        let mut cta = match popped {
            Some(c) => c,
            None => {
                let i = sh.next.fetch_add(1, Relaxed);
                if i >= sh.total {
                    break;
                }
                Cta::new(
                    i,
                    threads,
                    sh.entry.nregs,
                    sh.entry.npreds,
                    sh.shared_bytes,
                    info.local_bytes_per_thread,
                )
            }
        };
        match run_cta(sh, &mut cta, &mut tlb, &mut stats, &mut steps_left) {
            CtaStop::Done => {}
            CtaStop::Preempted => {
                lock(&sh.preempted).push(cta);
                break;
            }
            CtaStop::Fault(f) => {
                let mut g = lock(&sh.fault);
                if g.is_none() {
                    *g = Some(f);
                }
                sh.stop.store(true, Relaxed);
                break;
            }
        }
    }
    lock(&sh.stats).add(stats);
}

fn run_cta(
    sh: &Shared,
    cta: &mut Cta,
    tlb: &mut Tlb,
    stats: &mut Stats,
    steps_left: &mut u64,
) -> CtaStop {
    let cfg = sh.launch_cfg;
    let nw = cta.warps.len();
    let env = Env {
        entry: sh.entry,
        params: &cfg.params,
        grid: cfg.grid,
        block: cfg.block,
        ctaid: cta_coords(cta.linear, cfg.grid),
        nwarps: nw as u32,
        mem: sh.mem,
        module: sh.module,
        local_bytes: sh.entry.info.local_bytes_per_thread as usize,
        t0: sh.t0,
        printf: &sh.printf,
    };
    if nw == 0 {
        return CtaStop::Done;
    }
    loop {
        let start = cta.cursor as usize % nw;
        let found = (0..nw)
            .map(|k| (start + k) % nw)
            .find(|&i| !cta.warps[i].done && !cta.warps[i].at_barrier);
        if found.is_none() && cta.warps.iter().all(|w| w.done) {
            return CtaStop::Done;
        }
        if sh.stop.load(Relaxed) || sh.ctl.stop_requested() || *steps_left == 0 {
            return CtaStop::Preempted;
        }
        let Some(i) = found else {
            // Every live warp waits at the barrier: release them all (with the `bar.red`
            // result, if any).
            let acc = std::mem::take(&mut cta.bar);
            for w in &mut cta.warps {
                w.at_barrier = false;
                deliver_bar_red(w, acc);
            }
            continue;
        };
        // A warp cut short by the step limit resumes with the rest of its quantum, so that
        // sliced (and saved/restored) runs interleave warps exactly like straight runs.
        let quantum = if cta.slice_left > 0 {
            u64::from(cta.slice_left)
        } else {
            QUANTUM
        };
        let budget = quantum.min(*steps_left);
        let before = stats.warp_instructions;
        let r = exec_warp(
            &mut cta.warps[i],
            i as u32,
            &mut cta.shared,
            &mut cta.bar,
            &env,
            tlb,
            budget,
            stats,
        );
        let used = stats.warp_instructions - before;
        *steps_left = steps_left.saturating_sub(used);
        if matches!(r, WarpStop::Budget) && used < quantum {
            cta.slice_left = (quantum - used) as u32;
            cta.cursor = i as u32;
        } else {
            cta.slice_left = 0;
            cta.cursor = ((i + 1) % nw) as u32;
        }
        if let WarpStop::Fault(mut f) = r {
            fix_thread(&mut f, i as u32, cfg.block);
            return CtaStop::Fault(f);
        }
    }
}
