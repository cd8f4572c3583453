//! Which request path each checkpointed run takes (issue 23): the engine-wide
//! [`CkPathChoice`] is `Fixed` (every run takes the configured `flag_write` / `end_wait` /
//! `status_read`, the [`CkPath`] of `CudaConfig::fixed_path`) or `Adaptive`: a run whose
//! kernel has no duration estimate yet, or one of at least `fast_from`, takes [`CkPath::FAST`]
//! (`armed` / `notice` / `mirror`: no synchronous driver call between a request and the
//! context, ~3× faster to stop on an H200), every other run the fixed path, which costs less
//! host work when no request comes (an armed launch that ends unrequested opens its gate and
//! waits for the armed write's completion word; one more stream and four more enqueues per
//! launch, and the mirror's address written before it).
//!
//! The estimate is the engine's recent maximum GPU time of the kernel and shape
//! (`crate::ckwait::Waits::expected`; the key has no parameters, so a kernel that runs longer
//! with other arguments keeps the path of its recent maximum until a longer run is recorded):
//! kept by `auto`'s wait gate, and by the engine itself under the other methods when the
//! choice is adaptive (`CkptCounters::record_unwaited`: completed fresh runs, and preempted
//! ones that outran the estimate). A resumed run chooses again by the same key: the same
//! answer unless runs of the kernel completed in between (the newer estimate is the better
//! one), and a context rebuilt from bytes (snapshot, migration) has no record of its path.
//! Both paths read and write the same save area and status words, so runs of one launch may
//! take different paths.

use std::time::Duration;

use super::ckmem::FlagWrite;
use super::ckpath::{EndWait, StatusRead};
use super::context::LaunchState;

/// The three parts of one run's request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CkPath {
    pub flag_write: FlagWrite,
    pub end_wait: EndWait,
    pub status_read: StatusRead,
}

impl CkPath {
    /// The path with no synchronous driver call (docs/architecture.md, "The path with no
    /// synchronous driver call"); its fallbacks are the parts' own (no
    /// `cuStreamWaitValue32_v2` or no free host word: `write-value`; no word: an event spin).
    pub const FAST: CkPath = CkPath {
        flag_write: FlagWrite::Armed,
        end_wait: EndWait::Notice,
        status_read: StatusRead::Mirror,
    };
}

/// `Adaptive`'s default threshold: 1 ms. Issue 23's stop target (request → GPU free p99 ≤ 40
/// µs) is for kernels of at least 1 ms, so each of them takes the fast path (H200, 2026-11-27:
/// p50 26-34 µs against 76-89 µs on the fixed default, 72 against 156 µs on `long_atomic`).
/// The fast path's extra host work on a run no request reaches — two mirror-address writes
/// before the kernel, four enqueues after it (overlapping the kernel), the armed write's
/// completion waited for after it — is a few driver calls and one PCIe round trip, ~5-20 µs
/// by the request path's measured call costs (the three calls of a `write-value` request took
/// 24-35 µs): at most ~2% of a 1 ms kernel, within the 5% never-preempted budget with room
/// for the transformation's own cost. Shorter kernels: those `auto` waits on (estimate ≤ the
/// 40 µs wait budget) never need a stop; the others stop on the fixed path in ~80-110 µs, at
/// most a tenth of their own run. Lower it (`adaptive:US`) once the fast path's never-preempted
/// cost is measured (`gpu_ckcost`, `vgpu-bench preempt`).
pub const DEFAULT_FAST_FROM: Duration = Duration::from_millis(1);

/// Largest `adaptive:US` threshold (10 s: a job's time limit is at most 600 s, and no
/// estimate of a kernel anyone preempts is longer).
pub const MAX_FAST_FROM_US: u64 = 10_000_000;

/// The default of every engine's choice (`CudaConfig::default`, a VM's `--gpu ck_path=`, the
/// library's `VGPU_CUDA_CK_PATH`, `vgpu-bench preempt --ck-path`): adaptive since session 13,
/// when on an H200 it stopped the long kernels ~3x faster (p99), gave 16 vgpud VMs a
/// preemption p99 of 64 µs against 358 and cost the application suite nothing measurable
/// never preempted (docs/performance.md, "session 13"). The vgpu crate's `--gpu` key declares
/// the same default (`vgpu/src/config/keys.rs`), and the snapshot manifest omits it there.
pub const DEFAULT_CK_PATH: CkPathChoice = CkPathChoice::adaptive();

/// How each checkpointed run's request path is chosen (`CudaConfig::ck_path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CkPathChoice {
    /// Every run takes `CudaConfig::fixed_path` (`write-value` / `sync` / `strided` unless
    /// the three parts are set otherwise).
    Fixed,
    /// A run whose kernel's estimate is unknown or at least `fast_from` takes [`CkPath::FAST`];
    /// the others the fixed path. `fast_from` zero: every run takes the fast path.
    Adaptive { fast_from: Duration },
}

impl Default for CkPathChoice {
    fn default() -> Self {
        DEFAULT_CK_PATH
    }
}

impl CkPathChoice {
    /// `Adaptive` with the default threshold ([`DEFAULT_FAST_FROM`]).
    pub const fn adaptive() -> CkPathChoice {
        CkPathChoice::Adaptive {
            fast_from: DEFAULT_FAST_FROM,
        }
    }

    /// Whether the choice reads kernel estimates (and so whether the engine keeps them).
    pub fn is_adaptive(self) -> bool {
        matches!(self, CkPathChoice::Adaptive { .. })
    }

    /// The path of one run: `fixed` unless adaptive and the run's kernel is expected to run
    /// at least the threshold, or has no estimate (`estimate` None).
    pub fn path(self, fixed: CkPath, estimate: Option<Duration>) -> CkPath {
        match self {
            CkPathChoice::Fixed => fixed,
            CkPathChoice::Adaptive { fast_from } => match estimate {
                Some(e) if e < fast_from => fixed,
                _ => CkPath::FAST,
            },
        }
    }

    /// Every path a run may take (the fixed one first): what preparing a module or a job
    /// must make ready.
    pub fn paths(self, fixed: CkPath) -> impl Iterator<Item = CkPath> {
        let fast = (self.is_adaptive() && fixed != CkPath::FAST).then_some(CkPath::FAST);
        std::iter::once(fixed).chain(fast)
    }
}

impl std::fmt::Display for CkPathChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CkPathChoice::Fixed => f.write_str("fixed"),
            CkPathChoice::Adaptive { fast_from } if *fast_from == DEFAULT_FAST_FROM => {
                f.write_str("adaptive")
            }
            CkPathChoice::Adaptive { fast_from } => {
                write!(f, "adaptive:{}", fast_from.as_micros())
            }
        }
    }
}

impl std::str::FromStr for CkPathChoice {
    type Err = String;
    /// `fixed`, `adaptive` (threshold [`DEFAULT_FAST_FROM`]) or `adaptive:US` (the threshold
    /// in µs, 0 to [`MAX_FAST_FROM_US`]).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown request path choice {s:?} (fixed|adaptive|adaptive:US, US 0 to {MAX_FAST_FROM_US})"
            )
        };
        match s.split_once(':') {
            None if s == "fixed" => Ok(CkPathChoice::Fixed),
            None if s == "adaptive" => Ok(CkPathChoice::adaptive()),
            Some(("adaptive", us)) => {
                let us: u64 = us
                    .parse()
                    .ok()
                    .filter(|&u| u <= MAX_FAST_FROM_US)
                    .ok_or_else(bad)?;
                Ok(CkPathChoice::Adaptive {
                    fast_from: Duration::from_micros(us),
                })
            }
            _ => Err(bad()),
        }
    }
}

impl super::engine::CudaEngine {
    /// The request path of one run of `l` (fresh or resumed: see the module's documentation).
    pub(crate) fn run_path(&self, l: &LaunchState) -> CkPath {
        let fixed = self.cfg.fixed_path();
        if !self.cfg.ck_path.is_adaptive() {
            return fixed;
        }
        let estimate = self.ckpt.waits.expected(&key(l));
        self.cfg.ck_path.path(fixed, estimate)
    }
}

/// The estimate key of a launch's run (`crate::ckwait::Key`: module, entry, shape).
pub(crate) fn key(l: &LaunchState) -> crate::ckwait::Key {
    crate::ckwait::Key::new(l.module, &l.entry, l.grid, l.block, l.dynamic_shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: CkPath = CkPath {
        flag_write: FlagWrite::WriteValue,
        end_wait: EndWait::Sync,
        status_read: StatusRead::Strided,
    };

    #[test]
    fn fixed_always_takes_the_configured_path() {
        for e in [None, Some(Duration::ZERO), Some(Duration::from_secs(1))] {
            assert_eq!(CkPathChoice::Fixed.path(DEFAULT, e), DEFAULT, "{e:?}");
        }
        assert_eq!(
            CkPathChoice::Fixed.paths(DEFAULT).collect::<Vec<_>>(),
            [DEFAULT]
        );
    }

    #[test]
    fn adaptive_takes_the_fast_path_for_unknown_and_long_kernels_only() {
        let a = CkPathChoice::adaptive();
        assert_eq!(a.path(DEFAULT, None), CkPath::FAST, "no estimate yet");
        assert_eq!(
            a.path(DEFAULT, Some(Duration::from_micros(999))),
            DEFAULT,
            "short"
        );
        assert_eq!(a.path(DEFAULT, Some(Duration::from_micros(20))), DEFAULT);
        assert_eq!(
            a.path(DEFAULT, Some(DEFAULT_FAST_FROM)),
            CkPath::FAST,
            "at the threshold"
        );
        assert_eq!(
            a.path(DEFAULT, Some(Duration::from_millis(10))),
            CkPath::FAST
        );
        let zero = CkPathChoice::Adaptive {
            fast_from: Duration::ZERO,
        };
        assert_eq!(zero.path(DEFAULT, Some(Duration::ZERO)), CkPath::FAST);
        // The fixed path of another configuration is what short kernels get.
        let queued = CkPath {
            status_read: StatusRead::Queued,
            ..DEFAULT
        };
        assert_eq!(a.path(queued, Some(Duration::from_micros(5))), queued);
        assert_eq!(a.paths(queued).collect::<Vec<_>>(), [queued, CkPath::FAST]);
        assert_eq!(
            a.paths(CkPath::FAST).collect::<Vec<_>>(),
            [CkPath::FAST],
            "one path when the fixed one is the fast one"
        );
    }

    #[test]
    fn choices_parse_print_back_and_refuse_bad_values() {
        for s in [
            "fixed",
            "adaptive",
            "adaptive:0",
            "adaptive:250",
            "adaptive:10000000",
        ] {
            let c: CkPathChoice = s.parse().unwrap();
            assert_eq!(c.to_string(), s, "{s}");
        }
        assert_eq!("adaptive".parse(), Ok(CkPathChoice::adaptive()));
        assert_eq!(
            "adaptive:1000".parse::<CkPathChoice>().unwrap().to_string(),
            "adaptive",
            "the default threshold prints as plain adaptive"
        );
        assert_eq!(
            "adaptive:250".parse(),
            Ok(CkPathChoice::Adaptive {
                fast_from: Duration::from_micros(250)
            })
        );
        for bad in [
            "",
            "fast",
            "Adaptive",
            "adaptive:",
            "adaptive:-1",
            "adaptive:1ms",
            "adaptive:10000001",
            "fixed:5",
            "adaptive:5:6",
        ] {
            let e = bad.parse::<CkPathChoice>().unwrap_err();
            assert!(e.contains("fixed|adaptive|adaptive:US"), "{bad}: {e}");
        }
        assert_eq!(CkPathChoice::default(), CkPathChoice::adaptive());
    }
}
