//! The host work of a launch that no request reaches (issue 23: a transformed kernel never
//! preempted should cost at most 5% over the untransformed launch): when a checkpointed launch
//! must clear its flag word ([`needs_clear`]) and whether its buffer's flag is down after it
//! ([`raised_after`]), and the driver calls of completed runs, counted on the launching thread
//! (`driver::calls`): checkpointed ones in `CkptStats::unrequested_*`, sliced or whole ones
//! here ([`RunCalls`]), so a test or a report can set one against the other.
//!
//! A never-preempted checkpointed run needs no status read: its flag was down when the kernel
//! started (cleared on the job stream before it, or known down: never raised since the buffer
//! was zeroed or last cleared, with no write to it pending) and no request raised it while
//! the hook was attached (the hook list's lock makes removing the hook wait for a request
//! calling it, so `fired` is final once it is gone). A transformed thread leaves before its
//! end only when a poll reads the flag raised, and the kernel only reads the flag: every
//! thread ran to its end, and the kernel's end event came after it on its stream.

use std::sync::atomic::{AtomicU64, Ordering};

use super::ckmem::FlagWrite;

/// Whether a launch must clear its buffer's device flag before the kernel: only if it may be
/// raised (`DevBuf::flag_raised`), and not when the kernel's flag is a host-mapped word (the
/// device word is then unused; the host word is cleared by a plain store).
pub(crate) fn needs_clear(raised: bool, host_word: bool) -> bool {
    raised && !host_word
}

/// Whether the buffer's device flag may be raised after a run that ended (its hook gone):
/// it stays as it was unless the run cleared it, and a request that fired (by any method: a
/// host-mapped launch without a free word writes the device flag) or an armed write (which
/// always runs, its gate opened at the end) raises it.
pub(crate) fn raised_after(raised: bool, cleared: bool, fired: bool, method: FlagWrite) -> bool {
    (raised && !cleared) || fired || method == FlagWrite::Armed
}

/// Whether a run whose kernel reads the status mirror's address in its buffer's header writes
/// it before the kernel (two `cuMemsetD32Async`): its own mirror (`mirror` non-zero), or 0 over
/// the address an earlier run of another status read left there (`set`: `DevBuf::mirror_set`),
/// unless the flag's clear — 16 bytes, the flag and the address — zeroed it (`clear`). A run
/// that takes no mirror on a buffer no mirror run used writes nothing.
pub(crate) fn writes_mirror(mirror: u64, set: bool, clear: bool) -> bool {
    mirror != 0 || (set && !clear)
}

/// `DevBuf::mirror_set` after such a run: its own mirror's address is there, or 0 (written,
/// cleared, or never set); after an error, whichever it may be.
pub(crate) fn mirror_set_after(set: bool, mirror: u64, ok: bool) -> bool {
    mirror != 0 || (!ok && set)
}

/// Completed runs of one kind and the driver calls they made.
#[derive(Debug, Default)]
pub struct RunCalls {
    runs: AtomicU64,
    calls: AtomicU64,
}

impl RunCalls {
    /// One completed run that made `calls` driver calls.
    pub(crate) fn record(&self, calls: u64) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.calls.fetch_add(calls, Ordering::Relaxed);
    }

    /// (runs, driver calls) so far.
    pub fn get(&self) -> (u64, u64) {
        (
            self.runs.load(Ordering::Relaxed),
            self.calls.load(Ordering::Relaxed),
        )
    }
}

impl super::engine::CudaEngine {
    /// Launches run sliced or whole (not transformed) from their first block to completion in
    /// one run, and the driver calls those runs made on the launching thread: the baseline
    /// of `CkptStats::unrequested_driver_calls`.
    pub fn plain_run_calls(&self) -> (u64, u64) {
        self.plain_calls.get()
    }

    /// Request-path event pairs created so far (a launch takes an idle one: `ckevents`).
    #[doc(hidden)]
    pub fn ck_event_pairs_made(&self) -> u64 {
        self.ck_events.made()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_cleared_only_when_it_may_be_raised_on_the_device() {
        assert!(!needs_clear(false, false), "down since zeroed: no memset");
        assert!(needs_clear(true, false));
        assert!(
            !needs_clear(true, true),
            "host-mapped word: the device flag is unused"
        );
    }

    #[test]
    fn the_flag_state_follows_clears_requests_and_armed_writes() {
        use FlagWrite::*;
        for m in [WriteValue, Memcpy, WriteValuePriority, HostMapped] {
            // Never requested: down stays down, a clear takes it down.
            assert!(!raised_after(false, false, false, m), "{m}");
            assert!(!raised_after(true, true, false, m), "{m}");
            // Not cleared (host-mapped launch): whatever it was.
            assert!(raised_after(true, false, false, m), "{m}");
            // A request raised it, whatever came before.
            assert!(raised_after(false, false, true, m), "{m}");
            assert!(raised_after(true, true, true, m), "{m}");
        }
        // The armed write always lands in the flag.
        assert!(raised_after(false, false, false, Armed));
        assert!(raised_after(false, true, false, Armed));
    }

    /// Runs of one engine may take different status reads (`ckchoice`): a run without a
    /// mirror must never leave its kernel an earlier run's mirror address.
    #[test]
    fn a_stale_mirror_address_is_always_overwritten_or_cleared() {
        let m = 0x7f00_0000_1000;
        // A mirror run writes its own, whatever was there.
        for (set, clear) in [(false, false), (true, false), (false, true), (true, true)] {
            assert!(writes_mirror(m, set, clear));
            assert!(mirror_set_after(set, m, true));
        }
        // A run without one: 0 over a stale address, unless the clear zeroed it.
        assert!(writes_mirror(0, true, false));
        assert!(!writes_mirror(0, true, true));
        assert!(
            !writes_mirror(0, false, false),
            "nothing to overwrite: no call"
        );
        assert!(!mirror_set_after(true, 0, true));
        // After an error the stale one may still be there.
        assert!(mirror_set_after(true, 0, false));
        assert!(!mirror_set_after(false, 0, false));
        // The sequence a pooled buffer sees: mirror run, fixed run, fixed run.
        let mut set = false;
        let mut writes = Vec::new();
        for (mirror, clear) in [(m, false), (0, false), (0, false)] {
            writes.push(writes_mirror(mirror, set, clear));
            set = mirror_set_after(set, mirror, true);
        }
        assert_eq!(writes, [true, true, false]);
        assert!(!set);
    }

    #[test]
    fn checked_calls_are_counted_on_their_own_thread() {
        use super::super::driver::{calls, ck, count_call};
        use super::super::sys::CUresult;
        let c0 = calls();
        assert!(ck("a", CUresult::CUDA_SUCCESS).is_ok());
        assert!(ck("b", CUresult::CUDA_ERROR_NOT_READY).is_err());
        count_call();
        assert_eq!(calls() - c0, 3, "successes, failures and unchecked queries");
        let other = std::thread::spawn(|| {
            let c = calls();
            let _ = ck("c", CUresult::CUDA_SUCCESS);
            calls() - c
        })
        .join()
        .unwrap();
        assert_eq!(other, 1);
        assert_eq!(calls() - c0, 3, "another thread's calls are its own");
    }

    #[test]
    fn run_calls_add_up() {
        let c = RunCalls::default();
        assert_eq!(c.get(), (0, 0));
        c.record(7);
        c.record(5);
        assert_eq!(c.get(), (2, 12));
    }
}
