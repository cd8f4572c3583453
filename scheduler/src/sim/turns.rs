//! The priority experiment as vgpud dispatches it (`vgpu-bench priority` with real VMs), in
//! simulation: a grant with a slice is a **turn** (the VM runs its ready jobs back to back and
//! the scheduler sees the turn as one job, unidentified once a second job runs in it), every
//! grant costs a round trip before the engine runs (`switch`), a stop (the VM's own deadline or
//! a preempt) takes `stop` before the run's end is reported, and the high-priority VM's think
//! time varies (a deterministic pseudo-random tail).
//! Deterministic: the same spec gives the same figures, so the decisions can be tested without
//! timing.

use std::time::Duration;

use super::SimError;
use super::priority::Mode;
use crate::config::{Config, PolicyKind};
use crate::scheduler::Scheduler;
use crate::types::{Action, KernelKey, Pick, VmId, VmParams};

/// The shape of the run (defaults: `vgpu-bench priority`'s, costs as measured on the GPU host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSpec {
    /// Kernels of one HP request, submitted together.
    pub hp_kernels: Vec<Duration>,
    /// HP think time from a request's end to the next: `think` + uniform `[0, jitter)`, and one
    /// request in `tail_every` another uniform `[0, tail)` (a loaded host).
    pub think: Duration,
    pub jitter: Duration,
    pub tail: Duration,
    pub tail_every: u32,
    /// LP VMs, each backlogged with `lp_kernel`-long kernels.
    pub lp: usize,
    pub lp_kernel: Duration,
    /// Grant → the engine running (daemon round trip, VM wake-up): the GPU idles. `switch` for
    /// LP VMs (told ahead by a standby hint, they poll); for the HP VM `hot` when the grant
    /// answers its want at once (its thread is still awake), `wake` when it comes later (its
    /// thread went to sleep: 100-400 µs in a nested VM).
    pub switch: Duration,
    pub hot: Duration,
    pub wake: Duration,
    /// Stop due (deadline or preempt) → the engine stopped, its context saved, reported.
    pub stop: Duration,
    pub duration: Duration,
    pub warmup: Duration,
}

impl TurnSpec {
    /// `vgpu-bench priority --lp N` on the GPU host, sim backend: 2 × 500 µs HP kernels, about
    /// 2.3 ms from a request's end to the next want (think time, result checks, interrupt),
    /// 2 ms LP kernels, ~60 µs per LP grant, 20 µs / 150 µs for an HP grant at once / later,
    /// ~15 µs per stop (vgpud's switch and preemption latencies, docs/performance.md).
    pub fn vgpu_bench(lp: usize) -> Self {
        let us = Duration::from_micros;
        Self {
            hp_kernels: vec![us(500), us(500)],
            think: us(2150),
            jitter: us(300),
            tail: us(1500),
            tail_every: 10,
            lp,
            lp_kernel: us(2000),
            switch: us(60),
            hot: us(20),
            wake: us(150),
            stop: us(15),
            duration: Duration::from_secs(5),
            warmup: Duration::from_millis(300),
        }
    }
}

/// Results of one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnResult {
    pub mode: Mode,
    pub latencies: Vec<Duration>,
    /// Kernel work done by the HP VM and by the LP VMs after the warm-up.
    pub hp_work: Duration,
    pub lp_work: Duration,
    /// Engine busy (work) / measured time.
    pub utilization: f64,
    pub grants: u64,
    /// Grants to a VM other than the previous one.
    pub switches: u64,
    pub preemptions: u64,
    /// HP runs that ended preempted (its own slice end).
    pub hp_preemptions: u64,
    pub measured: Duration,
}

impl TurnResult {
    /// The `q` quantile (nearest rank) of the HP request latencies.
    pub fn latency(&self, q: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let rank = (q.clamp(0.0, 1.0) * l.len() as f64).ceil() as usize;
        l.get(rank.saturating_sub(1)).copied().unwrap_or_default()
    }
}

/// xorshift64*: the think-time jitter, the same every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, d: Duration) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        let frac = x as f64 / (1u64 << 53) as f64;
        d.mul_f64(frac)
    }
}

#[derive(Debug, Clone, Copy)]
struct Running {
    vm: usize,
    /// When the engine starts (grant + switch).
    start: Duration,
    /// Stop due: the slice end (`None`: run to the end of the job or turn).
    deadline: Option<Duration>,
    /// The slice end as granted (an extended turn is preempted by a later submission).
    slice_end: Option<Duration>,
    /// Work done in this run so far (up to `last`), and the part of it that went to jobs
    /// completed in it.
    work: Duration,
    done: Duration,
    last: Duration,
    /// The engine stopped at this time (a preempt or the deadline); reported `stop` later.
    stopped: Option<Duration>,
}

#[derive(Debug, Default)]
struct Vm {
    /// Work left of each queued job, head first.
    jobs: std::collections::VecDeque<Duration>,
    request_start: Option<Duration>,
    next_request: Option<Duration>,
}

const HP: usize = 0;

/// Runs one mode of the experiment (`Mode::Exclusive`: the HP VM alone).
pub fn run(base: &Config, spec: &TurnSpec, mode: Mode) -> Result<TurnResult, SimError> {
    let mut config = base.clone();
    config.policy = PolicyKind::Timeslice;
    config.fill = mode == Mode::Fill;
    let n = 1 + if mode == Mode::Exclusive { 0 } else { spec.lp };
    config.max_vms = config.max_vms.max(n);
    let mut sched = Scheduler::new(config)?;
    let id = |i: usize| u32::try_from(i).map(VmId).map_err(|_| SimError::TooManyVms);
    let mut vms: Vec<Vm> = (0..n).map(|_| Vm::default()).collect();
    for i in 0..n {
        let priority = u8::from(i == HP && matches!(mode, Mode::Priority | Mode::Fill));
        sched.register(
            id(i)?,
            VmParams {
                weight: 1,
                priority,
            },
            Duration::ZERO,
        )?;
    }
    if spec.hp_kernels.is_empty() || spec.lp_kernel.is_zero() {
        return Err(SimError::BadKernels(0));
    }
    let hp_key = Some(KernelKey(1));
    let lp_key = Some(KernelKey(2));
    for (i, v) in vms.iter_mut().enumerate().skip(1) {
        v.jobs.extend([spec.lp_kernel, spec.lp_kernel]);
        sched.on_submit_kernel(id(i)?, lp_key, Duration::ZERO)?;
    }
    vms[HP].next_request = Some(spec.warmup / 4);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut requests = 0u32;
    let (mut now, mut running, mut timer) = (Duration::ZERO, None::<Running>, None::<Duration>);
    let mut r = TurnResult {
        mode,
        latencies: Vec::new(),
        hp_work: Duration::ZERO,
        lp_work: Duration::ZERO,
        utilization: 0.0,
        grants: 0,
        switches: 0,
        preemptions: 0,
        hp_preemptions: 0,
        measured: spec.duration.saturating_sub(spec.warmup),
    };
    let (mut busy, mut last_vm) = (Duration::ZERO, None::<usize>);
    // Work in [a, b) of `vm`, counted after the warm-up.
    let mut count = |r: &mut TurnResult, vm: usize, a: Duration, b: Duration| {
        let d = b.saturating_sub(a.max(spec.warmup));
        if b > spec.warmup {
            busy += d;
            if vm == HP {
                r.hp_work += d;
            } else {
                r.lp_work += d;
            }
        }
    };
    let mut need_pick = true;
    while now < spec.duration {
        if running.is_none() && need_pick {
            need_pick = false;
            timer = None;
            match sched.pick(now)? {
                Pick::Run(d) => {
                    let vm = d.run.0 as usize;
                    r.grants += 1;
                    if last_vm.is_some_and(|l| l != vm) {
                        r.switches += 1;
                    }
                    last_vm = Some(vm);
                    let latency = match (vm, vms[HP].request_start) {
                        (HP, Some(asked)) if now > asked => spec.wake,
                        (HP, _) => spec.hot,
                        _ => spec.switch,
                    };
                    let start = now.saturating_add(latency);
                    // vgpud: a turn nobody else waits for is not stopped at its slice end
                    // (extended; a later submission preempts it, see below).
                    let others = (0..n).any(|o| {
                        o != vm
                            && id(o)
                                .ok()
                                .and_then(|o| sched.vm_info(o).ok())
                                .is_some_and(|(_, st)| st.pending > 0)
                    });
                    let deadline = d.slice.filter(|_| others);
                    running = Some(Running {
                        vm,
                        start,
                        deadline: deadline.map(|s| now.saturating_add(s)),
                        slice_end: d.slice.map(|s| now.saturating_add(s)),
                        work: Duration::ZERO,
                        done: Duration::ZERO,
                        last: start,
                        stopped: None,
                    });
                }
                Pick::Wait { until, .. } => timer = Some(until),
                Pick::Idle => {}
            }
        }
        // The next event: the running VM's head job ends, its deadline, its stop report, a
        // request, the timer.
        let run_event = running.map(|run| {
            if let Some(s) = run.stopped {
                return s.saturating_add(spec.stop);
            }
            let head = vms[run.vm].jobs.front().copied().unwrap_or_default();
            let done = run.last.max(run.start).saturating_add(head);
            run.deadline.map_or(done, |d| done.min(d.max(run.start)))
        });
        let t = [run_event, vms[HP].next_request, timer, Some(spec.duration)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(spec.duration)
            .max(now);
        now = t;
        if now >= spec.duration {
            break;
        }
        if let Some(mut run) = running.filter(|_| run_event == Some(now)) {
            let v = run.vm;
            if run.stopped.is_some() {
                // The stop is reported: the run ends preempted.
                running = None;
                need_pick = true;
                r.preemptions += 1;
                if v == HP {
                    r.hp_preemptions += 1;
                }
                sched.on_preempted(id(v)?, run.work, now)?;
            } else {
                let begin = run.last.max(run.start);
                let head = vms[v].jobs.front().copied().unwrap_or_default();
                let ran = now.saturating_sub(begin);
                count(&mut r, v, begin, now);
                run.work += ran;
                run.last = now;
                if ran >= head {
                    // The head job completed.
                    vms[v].jobs.pop_front();
                    if v != HP {
                        vms[v].jobs.push_back(spec.lp_kernel); // backlogged
                    } else if vms[v].jobs.is_empty() {
                        if let Some(s) = vms[v].request_start.take()
                            && s >= spec.warmup
                        {
                            r.latencies.push(now - s);
                        }
                        requests += 1;
                        let mut think = spec.think.saturating_add(rng.below(spec.jitter));
                        if spec.tail_every > 0 && requests.is_multiple_of(spec.tail_every) {
                            think = think.saturating_add(rng.below(spec.tail));
                        }
                        vms[v].next_request = Some(now.saturating_add(think));
                    }
                    let more = !vms[v].jobs.is_empty();
                    let deadline_passed = run.deadline.is_some_and(|d| now >= d);
                    let job = run.work.saturating_sub(run.done);
                    if more && !deadline_passed {
                        // `progress`: the turn goes on with the next job.
                        sched.on_progress(id(v)?, job, now)?;
                        run.done = run.work;
                        running = Some(run);
                    } else if more && deadline_passed {
                        sched.on_progress(id(v)?, job, now)?;
                        run.done = run.work;
                        run.stopped = Some(now);
                        running = Some(run);
                    } else {
                        running = None;
                        need_pick = true;
                        sched.on_complete(id(v)?, run.work, now)?;
                        if more {
                            // `done` with `more`: queued again, identified by the next want.
                            sched.on_submit_kernel(id(v)?, lp_key, now)?;
                        }
                    }
                } else {
                    // The deadline: the VM stops by itself.
                    if let Some(h) = vms[v].jobs.front_mut() {
                        *h = h.saturating_sub(ran);
                    }
                    run.stopped = Some(now);
                    running = Some(run);
                }
            }
        }
        if vms[HP].next_request == Some(now) {
            vms[HP].next_request = None;
            vms[HP].jobs.extend(spec.hp_kernels.iter().copied());
            vms[HP].request_start = Some(now);
            need_pick = true;
            match sched.on_submit_kernel(id(HP)?, hp_key, now)? {
                Action::None => {
                    let extended = running
                        .filter(|x| x.vm != HP && x.deadline.is_none())
                        .and_then(|x| x.slice_end)
                        .is_some_and(|e| now >= e);
                    if let Some(x) = running.filter(|_| extended) {
                        stop_at(&mut running, &mut vms, id(x.vm)?, now, &mut r, &mut count);
                    }
                }
                Action::Preempt(p) => stop_at(&mut running, &mut vms, p, now, &mut r, &mut count),
                Action::PreemptAt { vm, at } => {
                    // Let it end within the bound; the preempt follows at `at` if not.
                    if let Some(run) = running.as_mut().filter(|x| x.vm == vm.0 as usize) {
                        run.deadline = Some(run.deadline.map_or(at, |d| d.min(at)));
                    }
                }
            }
        }
        if timer == Some(now) {
            need_pick = true;
        }
    }
    r.utilization = if r.measured.is_zero() {
        0.0
    } else {
        busy.as_secs_f64() / r.measured.as_secs_f64()
    };
    Ok(r)
}

/// A preempt reaches the running VM `p` at `now`: its engine stops now (its work so far
/// counted), the end is reported `stop` later.
fn stop_at(
    running: &mut Option<Running>,
    vms: &mut [Vm],
    p: VmId,
    now: Duration,
    r: &mut TurnResult,
    count: &mut impl FnMut(&mut TurnResult, usize, Duration, Duration),
) {
    let Some(run) = running
        .as_mut()
        .filter(|x| x.vm == p.0 as usize && x.stopped.is_none())
    else {
        return;
    };
    let begin = run.last.max(run.start);
    if now > begin {
        let ran = now - begin;
        count(r, run.vm, begin, now);
        run.work += ran;
        if let Some(h) = vms[run.vm].jobs.front_mut() {
            *h = h.saturating_sub(ran);
        }
    }
    run.last = now.max(run.start);
    run.stopped = Some(now.max(run.start));
}

/// Every mode on `spec` under `base`.
pub fn compare(base: &Config, spec: &TurnSpec) -> Result<Vec<TurnResult>, SimError> {
    Mode::ALL.into_iter().map(|m| run(base, spec, m)).collect()
}
