//! `wait`, the fourth method of `PreemptMethod::Auto` (issue 23): a preemption request for a
//! running launch that is expected to end within a budget (`preempt_wait`) is not acted on;
//! the launch runs to its end and the scheduler sees the job complete, sooner than a stop,
//! save and resume would free the GPU, and with nothing to resume.
//!
//! The expectation comes from what the engine measured: the GPU time of the last
//! [`RECENT`] completed fresh runs of the same kernel and shape ([`Key`]: module, entry, grid,
//! block, dynamic shared bytes), their maximum (conservative: one slow run keeps the kernel
//! from being waited on), once [`MIN_SAMPLES`] are known. At a request, the launch is waited
//! when that maximum, less the time it has run, is at most the budget; one that has already
//! run well past that maximum (by the lesser of the maximum and the budget, an allowance for
//! the GPU's start after the host's mark: `past_tolerance`) is not waited (stopped at once).
//! No estimate: not waited.
//!
//! Bounded: a launch with an estimate runs under a *child* handle ([`Gate::handle`]; one
//! without, under the caller's, only timed); a request on the caller's handle reaches the
//! child at once (not waited: the launch stops by its normal method) or, when waited, from a
//! timer thread once the budget has passed (`CkptStats::wait_overruns`; what the launch had
//! run then is kept as one of its kernel's durations), so that a launch that outlasts its
//! estimate stops within budget + its method's own stop. A request already pending when the
//! launch starts is never waited on (a job started with the flag set stops at its first
//! point, as documented for `PreemptHandle`), nor is a time slice's deadline
//! (`PreemptHandle::set_deadline`: the child has the same deadline; vgpud's slice ends), nor
//! a resumed run (not gated).
//!
//! Guests choose their kernels' lengths: one that runs short, then long, costs each request
//! at most the budget more (an overrun), and the estimate then holds the longer time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::engine::{LaunchJob, Outcome, PreemptHandle};
use crate::sync::lock;

/// Default wait budget: issue 23's stop target (request → GPU free ≤ 40 µs). A launch that
/// ends within it frees the GPU as soon as the best stop would, with nothing saved or
/// resumed; a longer budget would let a mis-estimated kernel delay a stop beyond the target.
pub const DEFAULT_WAIT_BUDGET: Duration = Duration::from_micros(40);

/// Completed runs of a kernel kept per key.
pub const RECENT: usize = 8;
/// Completed runs needed before a kernel is waited on.
pub const MIN_SAMPLES: usize = 2;
/// Kernels (keys) whose durations are kept; a new one beyond evicts another (the map's
/// size is bounded whatever guests launch).
pub const MAX_KEYS: usize = 4096;

/// A kernel and its launch shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    module: u64,
    entry: String,
    shape: [u32; 7],
}

impl Key {
    /// The key of a launch.
    pub fn of(l: &LaunchJob) -> Key {
        Key::new(l.module, &l.entry, l.grid, l.block, l.dynamic_shared)
    }

    /// The key of a kernel of `module` and its launch shape.
    pub fn new(
        module: crate::engine::ModuleId,
        entry: &str,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_shared: u32,
    ) -> Key {
        let [g0, g1, g2] = grid;
        let [b0, b1, b2] = block;
        Key {
            module: module.0,
            entry: entry.to_owned(),
            shape: [g0, g1, g2, b0, b1, b2, dynamic_shared],
        }
    }
}

/// The recent durations of one kernel (nanoseconds, newest at `next - 1`).
#[derive(Debug, Default, Clone)]
struct Recent {
    ns: [u64; RECENT],
    len: usize,
    next: usize,
}

impl Recent {
    fn push(&mut self, d: Duration) {
        self.ns[self.next] = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.next = (self.next + 1) % RECENT;
        self.len = (self.len + 1).min(RECENT);
    }
    fn expected(&self) -> Option<Duration> {
        (self.len >= MIN_SAMPLES)
            .then(|| Duration::from_nanos(self.ns.iter().copied().max().unwrap_or(0)))
    }
}

/// The engine's durations and the wait counters (inside `ckpt::CkptCounters`).
#[derive(Debug, Default)]
pub(crate) struct Waits {
    recent: Mutex<HashMap<Key, Recent>>,
    pub waited: AtomicU64,
    pub overruns: AtomicU64,
    /// Expected remaining time of the latest waited request, ns.
    pub last_expected_ns: AtomicU64,
    /// The budget it was compared with, ns.
    pub last_budget_ns: AtomicU64,
}

impl Waits {
    /// The expected duration of a run of `key`, if known.
    pub fn expected(&self, key: &Key) -> Option<Duration> {
        lock(&self.recent).get(key).and_then(Recent::expected)
    }

    /// Records that a run of `key` took (at least) `d`.
    pub fn record(&self, key: &Key, d: Duration) {
        let mut m = lock(&self.recent);
        if !m.contains_key(key) && m.len() >= MAX_KEYS {
            let old = m.keys().next().cloned();
            if let Some(old) = old {
                m.remove(&old);
            }
        }
        m.entry(key.clone()).or_default().push(d);
    }
}

/// One fresh run of a launch under `Auto`: the child handle the engine runs it under and the
/// forwarding of requests from the caller's handle (see the module's documentation); for a
/// kernel with no estimate yet, only the recording of its duration (it runs under the
/// caller's handle).
pub(crate) struct Gate<'a> {
    key: Key,
    parent: &'a PreemptHandle,
    live: Option<Forward<'a>>,
}

/// The child handle and the forwarding hook on the caller's.
struct Forward<'a> {
    child: PreemptHandle,
    st: Arc<GateState>,
    /// Removes the forwarding hook from the caller's handle (first, in `finish`).
    hook: crate::engine::preempt::HookGuard<'a>,
}

#[derive(Debug)]
struct GateState {
    started: Instant,
    expected: Duration,
    budget: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Requests arriving from now on may be waited (the forwarding hook is attached).
    armed: bool,
    /// A request was waited on.
    waited: bool,
    /// A request was passed on to the child at once (later ones change nothing).
    forwarded: bool,
    /// The budget passed with the launch running, or a request came once it had outrun its
    /// estimate: when (the child was then asked).
    overran: Option<Instant>,
    /// The run ended: the timer asks no more.
    done: bool,
}

impl<'a> Gate<'a> {
    /// A gate for a fresh run of the launch `key` on an engine with `waits` and `budget`
    /// (zero, no estimate or no timer thread: never waited, the run is only timed).
    pub fn new(
        waits: &Arc<Waits>,
        key: Key,
        parent: &'a PreemptHandle,
        budget: Duration,
    ) -> Gate<'a> {
        let expected = waits
            .expected(&key)
            .filter(|_| !budget.is_zero() && timer().is_some());
        let live = expected.map(|expected| {
            let child = parent.child();
            let st = Arc::new(GateState {
                started: Instant::now(),
                expected,
                budget,
                inner: Mutex::default(),
            });
            let (c, s, w) = (child.clone(), st.clone(), waits.clone());
            let hook: crate::engine::preempt::PreemptHook = Arc::new(move || s.on_request(&c, &w));
            // A request pending now is forwarded at once (`armed` is still false).
            let hook = parent.attach(hook);
            lock(&st.inner).armed = true;
            Forward { child, st, hook }
        });
        Gate { key, parent, live }
    }

    /// The handle the engine runs the launch under.
    pub fn handle(&self) -> &PreemptHandle {
        self.live.as_ref().map_or(self.parent, |f| &f.child)
    }

    /// The run ended with `out`: no more requests are forwarded, and a completed run's GPU
    /// time (or, for a waited run that overran, the time it had run when the budget passed:
    /// a lower bound) is recorded for the next estimates.
    pub fn finish(self, waits: &Waits, out: Option<&Outcome>) {
        let overran = self.live.and_then(|f| {
            drop(f.hook);
            let mut g = lock(&f.st.inner);
            g.done = true;
            let from = f.child.running_since().unwrap_or(f.st.started);
            g.overran.map(|at| at.saturating_duration_since(from))
        });
        match (out, overran) {
            (Some(Outcome::Completed { gpu_time }), _) => waits.record(&self.key, *gpu_time),
            (_, Some(ran)) => waits.record(&self.key, ran),
            _ => {}
        }
    }
}

impl GateState {
    /// A request on the caller's handle (called under its hook lock: never blocks long).
    fn on_request(self: &Arc<Self>, child: &PreemptHandle, waits: &Arc<Waits>) {
        let mut g = lock(&self.inner);
        if g.waited || g.forwarded || g.done {
            // Already waited on (the timer forwards it), passed on, or over.
            return;
        }
        // From when the engine started the kernel (its host work before the launch is not
        // the kernel's run); not running yet: all of it remains.
        let ran = child
            .running_since()
            .map_or(Duration::ZERO, |t| t.elapsed());
        if ran
            >= self
                .expected
                .saturating_add(past_tolerance(self.expected, self.budget))
        {
            // Already outrun its estimate: no reason to expect it to end within the budget.
            // Passed on at once (not counted as waited nor as an overrun); what it has run is
            // kept as one of its kernel's durations (a lower bound), as for an overrun.
            g.forwarded = true;
            g.overran = Some(Instant::now());
            drop(g);
            log::debug!(
                "preemption request not waited: the launch ran {} µs, past its estimate {} µs",
                ran.as_micros(),
                self.expected.as_micros()
            );
            child.request();
            return;
        }
        let r = self.expected.saturating_sub(ran);
        match timer() {
            Some(t) if g.armed && r <= self.budget => {
                g.waited = true;
                waits.waited.fetch_add(1, Ordering::Relaxed);
                waits
                    .last_expected_ns
                    .store(r.as_nanos() as u64, Ordering::Relaxed);
                waits
                    .last_budget_ns
                    .store(self.budget.as_nanos() as u64, Ordering::Relaxed);
                drop(g);
                log::debug!(
                    "preemption request waited: expected to end in {} µs ≤ budget {} µs",
                    r.as_micros(),
                    self.budget.as_micros()
                );
                let (s, c, w) = (self.clone(), child.clone(), waits.clone());
                t.at(
                    Instant::now() + self.budget,
                    Box::new(move || s.overrun(&c, &w)),
                );
            }
            _ => {
                g.forwarded = true;
                drop(g);
                child.request();
            }
        }
    }

    /// The budget of a waited request has passed: stop the launch by its own method unless
    /// it ended.
    fn overrun(&self, child: &PreemptHandle, waits: &Waits) {
        let mut g = lock(&self.inner);
        if g.done {
            return;
        }
        g.overran = Some(Instant::now());
        waits.overruns.fetch_add(1, Ordering::Relaxed);
        // Under the gate's lock, so that `finish` cannot count the run as ended in between.
        child.request();
        drop(g);
        log::debug!("waited launch outlasted its estimate: stopped by its method");
    }
}

/// How far past its estimate a launch may have run, by the engine's clock, and still be
/// waited on. `ran` is host time since the engine marked the launch running, just before it
/// submitted the kernel; the estimate is GPU time. On a real GPU the kernel starts a submit
/// latency later (~5-10 µs on an H100/H200) and its end reaches the host later still, so a
/// launch within its estimate on the GPU looks past it on the host for that long: a 10 µs
/// kernel's whole host-visible run is ~20 µs. The allowance is the lesser of the estimate and
/// the budget: a launch that has run twice its estimate (or its estimate and a whole budget) is
/// past it, stopped at once; one within is waited, and stopped by its method once the budget
/// has passed if it has not ended (an overrun), so a waited request never costs more than
/// the budget.
fn past_tolerance(expected: Duration, budget: Duration) -> Duration {
    expected.min(budget)
}

/// What the timer runs when due.
type Due = Box<dyn FnOnce() + Send>;

/// One process-wide thread that runs [`Due`]s at their instants: it sleeps on a condition
/// variable until the earliest is near, then spins (yielding) to it, since a sleep's wake-up
/// slack (tens of µs) is as long as the budgets it serves.
struct Timer {
    q: Mutex<Vec<(Instant, Due)>>,
    cv: Condvar,
}

/// Below this, the timer spins instead of sleeping.
const SPIN: Duration = Duration::from_micros(300);

/// The timer, its thread started on first use; `None` if the thread could not be made (then
/// nothing is waited on: a waited request would never be forwarded).
fn timer() -> Option<&'static Timer> {
    static T: OnceLock<Option<&'static Timer>> = OnceLock::new();
    *T.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            q: Mutex::default(),
            cv: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("pgpu-wait-timer".into())
            .spawn(move || t.run());
        match spawned {
            Ok(_) => Some(t),
            Err(e) => {
                log::warn!("preempt wait: no timer thread ({e}): requests are not waited on");
                None
            }
        }
    })
}

impl Timer {
    fn at(&'static self, when: Instant, f: Due) {
        lock(&self.q).push((when, f));
        self.cv.notify_one();
    }

    fn run(&self) {
        let mut q = lock(&self.q);
        loop {
            let now = Instant::now();
            let Some(first) = q.iter().map(|(t, _)| *t).min() else {
                q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            if first <= now {
                let due: Vec<Due> = {
                    let (mut d, keep): (Vec<_>, Vec<_>) = q.drain(..).partition(|(t, _)| *t <= now);
                    *q = keep;
                    // Several due at once (the thread was late): still in order of time.
                    d.sort_by_key(|(t, _)| *t);
                    d.into_iter().map(|(_, f)| f).collect()
                };
                drop(q);
                due.into_iter().for_each(run_due);
                q = lock(&self.q);
            } else if first - now > SPIN {
                q = self
                    .cv
                    .wait_timeout(q, first - now - SPIN / 2)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            } else {
                drop(q);
                std::thread::yield_now();
                q = lock(&self.q);
            }
        }
    }
}

/// Runs one due task; a panic in it is logged and contained, so that the timer thread lives
/// on (`timer()` stays `Some`: a dead thread would leave later waited requests unforwarded).
fn run_due(f: Due) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        log::error!("preempt wait: a timer task panicked: {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_recent_maximum_once_warm() {
        let w = Waits::default();
        let l = LaunchJob {
            space: crate::engine::SpaceId(1),
            module: crate::engine::ModuleId(2),
            entry: "k".into(),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dynamic_shared: 0,
            params: Vec::new(),
        };
        let k = Key::of(&l);
        assert_eq!(w.expected(&k), None);
        w.record(&k, Duration::from_micros(10));
        assert_eq!(w.expected(&k), None, "one run is not enough");
        w.record(&k, Duration::from_micros(30));
        assert_eq!(w.expected(&k), Some(Duration::from_micros(30)));
        for _ in 0..RECENT {
            w.record(&k, Duration::from_micros(5));
        }
        assert_eq!(
            w.expected(&k),
            Some(Duration::from_micros(5)),
            "old runs age out"
        );
        let other = Key::of(&LaunchJob {
            grid: [2, 1, 1],
            ..l
        });
        assert_eq!(w.expected(&other), None, "another shape is another kernel");
    }

    #[test]
    fn the_map_stays_bounded() {
        let w = Waits::default();
        for i in 0..MAX_KEYS as u64 + 10 {
            let k = Key {
                module: i,
                entry: String::new(),
                shape: [1; 7],
            };
            w.record(&k, Duration::from_micros(1));
        }
        assert_eq!(lock(&w.recent).len(), MAX_KEYS);
    }

    #[test]
    fn the_timer_runs_what_is_due_in_order_of_time() {
        let (tx, rx) = std::sync::mpsc::channel();
        let t0 = Instant::now();
        for (i, us) in [(0, 2000u64), (1, 50), (2, 500)] {
            let tx = tx.clone();
            timer().unwrap().at(
                t0 + Duration::from_micros(us),
                Box::new(move || tx.send((i, Instant::now())).unwrap()),
            );
        }
        let got: Vec<(i32, Instant)> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [1, 2, 0]);
        assert!(got[0].1 >= t0 + Duration::from_micros(50));
        assert!(got[2].1 >= t0 + Duration::from_micros(2000));
    }

    #[test]
    fn a_panicking_task_does_not_stop_the_timer() {
        let (tx, rx) = std::sync::mpsc::channel();
        let t0 = Instant::now();
        timer().unwrap().at(
            t0,
            Box::new(|| panic!("a timer task's panic (expected by this test)")),
        );
        timer().unwrap().at(
            t0 + Duration::from_millis(1),
            Box::new(move || tx.send(()).unwrap()),
        );
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the task after the panicking one ran");
    }
}
