//! The in-process preemption method (`VGPU_CUDA_PREEMPT`) and its test knob,
//! `VGPU_CUDA_PREEMPT_TEST=SEED[:N]`: every kernel launch is preempted up to `N` times (default
//! 3) at seeded random moments and resumed, so that an unmodified program's kernels are stopped
//! and continued as a VM's would be under a scheduler, with the program's own check then saying
//! whether the method kept its results right (apps/tests/preempt.rs).
//!
//! A run is armed in one of two ways: a request before it starts (it stops at its first
//! preemption point), or a deadline on the launch's handle at a random moment within about
//! twice the recent length of a launch (the engines stop at their next point after it: the
//! sim interpreter between instructions, a transformed kernel at its checkpoints). Every
//! second preemption goes through the context's bytes (`SavedContext::into_bytes` and
//! `from_bytes`), as a snapshot would. The counters are in the library's report
//! (`VGPU_CUDA_STATS`, `"preempt"`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpu::{PreemptHandle, PreemptMethod};

/// Most forced preemptions per launch `N` may ask for.
pub const MAX_PER_LAUNCH: u32 = 64;

/// Forced preemptions made and seen, process-wide.
#[derive(Debug, Default)]
pub struct Counters {
    /// Runs armed (a request or a deadline set before them).
    pub armed: AtomicU64,
    /// Runs of a launch that ended preempted (forced or not) and were resumed.
    pub preempted: AtomicU64,
    /// Of those, resumed from the context's bytes.
    pub from_bytes: AtomicU64,
}

/// The knob's settings and state.
#[derive(Debug)]
pub struct Forced {
    seed: u64,
    per_launch: u32,
    rng: Mutex<u64>,
    /// Recent length of one run of a launch, in nanoseconds (moving average).
    span_ns: AtomicU64,
    pub counters: Counters,
}

/// The preemption method named by `VGPU_CUDA_PREEMPT` (default: the engine's own, `slice`).
pub fn method_from_env() -> Result<PreemptMethod, String> {
    match std::env::var("VGPU_CUDA_PREEMPT") {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|e| format!("VGPU_CUDA_PREEMPT: {e}")),
        Err(_) => Ok(PreemptMethod::Slice),
    }
}

/// `VGPU_CUDA_PREPARE_MODULES` (`1` or `0`): whether a module load also prepares its runs
/// (`Engine::prepare_module`: on cuda each entry's functions loaded onto the device in every
/// form, the streams and the checkpoint method's signal stream), so that the program's first
/// timed launch of a kernel does not. Default: on under a method that transforms modules
/// (`checkpoint`, `restart`, `auto`), off under `slice` (the baseline, unchanged).
pub fn prepare_from_env(method: PreemptMethod) -> Result<bool, String> {
    match std::env::var("VGPU_CUDA_PREPARE_MODULES") {
        Ok(v) => match v.trim() {
            "1" => Ok(true),
            "0" => Ok(false),
            _ => Err(format!("VGPU_CUDA_PREPARE_MODULES={v:?}: expected 1 or 0")),
        },
        Err(_) => Ok(method.transforms()),
    }
}

/// `VGPU_CUDA_CK_PATH` (`fixed`, `adaptive` or `adaptive:US`): how the cuda engine chooses each
/// checkpointed run's preemption request path (`pgpu::cuda::CkPathChoice`, as a VM's `--gpu
/// ck_path=`). Default: the engine's (`adaptive`).
pub fn ck_path_from_env() -> Result<pgpu::cuda::CkPathChoice, String> {
    parse_ck_path(std::env::var("VGPU_CUDA_CK_PATH").ok().as_deref())
}

/// [`ck_path_from_env`] of the variable's value (`None`: unset).
pub fn parse_ck_path(v: Option<&str>) -> Result<pgpu::cuda::CkPathChoice, String> {
    match v {
        Some(v) => v
            .trim()
            .parse()
            .map_err(|e| format!("VGPU_CUDA_CK_PATH: {e}")),
        None => Ok(pgpu::cuda::DEFAULT_CK_PATH),
    }
}

/// `VGPU_CUDA_CKPT_POLL`: the transformation's poll interval (a thread reads the flag at every
/// this many points; 1 stops threads mid-kernel, saving their registers, where the default, 64,
/// lets a small kernel's threads mostly finish and stops CTAs at their entry). `None`: the
/// engine's default.
pub fn poll_from_env() -> Result<Option<u32>, String> {
    match std::env::var("VGPU_CUDA_CKPT_POLL") {
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if (1..=1 << 20).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "VGPU_CUDA_CKPT_POLL={v:?}: expected a number of points, 1 to {}",
                1 << 20
            )),
        },
        Err(_) => Ok(None),
    }
}

impl Forced {
    /// From `VGPU_CUDA_PREEMPT_TEST` (`None` when unset).
    pub fn from_env() -> Result<Option<Forced>, String> {
        match std::env::var("VGPU_CUDA_PREEMPT_TEST") {
            Ok(v) => Forced::parse(&v).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// `SEED` or `SEED:N` (decimal; `N` at most [`MAX_PER_LAUNCH`]).
    pub fn parse(v: &str) -> Result<Forced, String> {
        let bad = || {
            format!(
                "VGPU_CUDA_PREEMPT_TEST={v:?}: expected SEED or SEED:N (decimal, N 1 to {MAX_PER_LAUNCH})"
            )
        };
        let (seed, n) = match v.trim().split_once(':') {
            Some((s, n)) => (s, n.parse::<u32>().map_err(|_| bad())?),
            None => (v.trim(), 3),
        };
        let seed: u64 = seed.parse().map_err(|_| bad())?;
        if !(1..=MAX_PER_LAUNCH).contains(&n) {
            return Err(bad());
        }
        Ok(Forced {
            seed,
            per_launch: n,
            // xorshift's state must not be zero.
            rng: Mutex::new(seed ^ 0x9e37_79b9_7f4a_7c15),
            span_ns: AtomicU64::new(1_000_000),
            counters: Counters::default(),
        })
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn per_launch(&self) -> u32 {
        self.per_launch
    }

    fn next(&self) -> u64 {
        let mut s = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        // xorshift64*: enough for spreading moments, reproducible from the seed.
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        s.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Arms run `run` (0: the launch's first) of a launch on `h`: `true` when armed (the first
    /// `N` runs are).
    pub fn arm(&self, h: &PreemptHandle, run: u32) -> bool {
        if run >= self.per_launch {
            return false;
        }
        self.counters.armed.fetch_add(1, Ordering::Relaxed);
        let r = self.next();
        if r.is_multiple_of(8) {
            h.request();
        } else {
            let span = self
                .span_ns
                .load(Ordering::Relaxed)
                .clamp(1_000, 50_000_000);
            let at = (r >> 8) % (2 * span);
            h.set_deadline(Some(Instant::now() + Duration::from_nanos(at)));
        }
        true
    }

    /// Disarms `h` after a run that took `took`, and learns the runs' length.
    pub fn disarm(&self, h: &PreemptHandle, took: Duration) {
        h.set_deadline(None);
        h.clear();
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.span_ns.load(Ordering::Relaxed);
        self.span_ns
            .store(old - old / 4 + ns / 4, Ordering::Relaxed);
    }

    /// Whether the `count`-th preemption (1-based) is resumed from its bytes.
    pub fn through_bytes(count: u64) -> bool {
        count.is_multiple_of(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_ones_are_refused() {
        let f = Forced::parse("42").unwrap();
        assert_eq!((f.seed(), f.per_launch()), (42, 3));
        assert_eq!(Forced::parse("7:10").unwrap().per_launch(), 10);
        for bad in ["", "x", "1:0", "1:65", "1:y", "-3"] {
            assert!(Forced::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_request_path_choice_parses_and_bad_ones_are_refused() {
        use pgpu::cuda::CkPathChoice;
        assert_eq!(parse_ck_path(None), Ok(CkPathChoice::adaptive()));
        assert_eq!(parse_ck_path(Some("fixed")), Ok(CkPathChoice::Fixed));
        assert_eq!(
            parse_ck_path(Some(" adaptive\n")),
            Ok(CkPathChoice::adaptive())
        );
        assert_eq!(
            parse_ck_path(Some("adaptive:300")),
            Ok(CkPathChoice::Adaptive {
                fast_from: Duration::from_micros(300)
            })
        );
        for bad in ["", "fast", "adaptive:x", "adaptive:99999999999"] {
            let e = parse_ck_path(Some(bad)).unwrap_err();
            assert!(
                e.starts_with("VGPU_CUDA_CK_PATH: ") && e.contains("fixed|adaptive"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_first_runs_are_armed_and_disarming_clears_the_handle() {
        let f = Forced::parse("5:2").unwrap();
        let h = PreemptHandle::new();
        let mut requested_or_deadline = 0;
        for _ in 0..32 {
            assert!(f.arm(&h, 0));
            if h.is_requested() || h.deadline().is_some() {
                requested_or_deadline += 1;
            }
            f.disarm(&h, Duration::from_micros(100));
            assert!(!h.is_requested() && h.deadline().is_none());
        }
        assert_eq!(requested_or_deadline, 32);
        assert!(f.arm(&h, 1));
        f.disarm(&h, Duration::ZERO);
        assert!(!f.arm(&h, 2), "only N runs of a launch are armed");
        assert_eq!(f.counters.armed.load(Ordering::Relaxed), 33);
        // Same seed, same moments.
        let (a, b) = (Forced::parse("9").unwrap(), Forced::parse("9").unwrap());
        assert_eq!((a.next(), a.next()), (b.next(), b.next()));
    }
}
