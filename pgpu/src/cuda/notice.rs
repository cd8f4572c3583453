//! The end notice of a checkpointed launch (`EndWait::Notice`, issue 23): the job stream's
//! front end stores a fresh value into a host-pinned word behind the kernel
//! (`cuStreamWriteValue32`, enqueued at launch; its default memory barrier orders the kernel's
//! stores — save area in VRAM, status mirror in host memory — before the word), and the
//! waiting thread spins on that word: no driver call between a request and the end noticed.
//!
//! Every wait is bounded by a fallback, logged: the end event is queried every
//! [`EVENT_PERIOD`] while no request is younger than [`LATE_AFTER`] (rarely enough that the
//! query seldom overlaps a stop), and an end event that completed without the word for
//! [`LOST_AFTER`] is taken as the end; an armed request (`FlagWrite::Armed`) whose kernel has
//! not ended [`LATE_AFTER`] after it raises the flag again through the driver (`late`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::ckpath::HostWord;
use super::driver::DrvError;
use super::stream::Stream;

/// Period of the end-event query while spinning.
pub const EVENT_PERIOD: Duration = Duration::from_millis(4);
/// A request whose kernel has not ended after this is raised again by the driver.
pub const LATE_AFTER: Duration = Duration::from_millis(2);
/// An end event complete this long without the notice word: the word is taken as lost.
pub const LOST_AFTER: Duration = Duration::from_millis(1);
/// Bound of the spin for the armed write's completion word before `cuStreamSynchronize`.
pub const ARMED_BOUND: Duration = Duration::from_millis(20);

/// Further bound, on the armed write's event, before its stream, slot and buffer are retired.
pub const ARMED_STUCK: Duration = Duration::from_secs(1);

/// Whether `ev` (recorded) completes within `bound` (`cuEventQuery` every 50 µs).
pub fn event_within(ev: super::sys::CUevent, bound: Duration) -> bool {
    let start = Instant::now();
    loop {
        // SAFETY: a live event of the caller's.
        let r = unsafe { super::sys::cuEventQuery(ev) };
        if r != super::sys::CUresult::CUDA_ERROR_NOT_READY {
            return r == super::sys::CUresult::CUDA_SUCCESS;
        }
        if start.elapsed() >= bound {
            return false;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// How the end was noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noticed {
    /// The word.
    Word,
    /// The end event (the word never came: logged).
    Event,
}

/// What one wait needs.
pub struct Wait<'a> {
    pub word: HostWord,
    pub value: u32,
    pub stream: &'a Stream,
    pub deadline: Option<Instant>,
    pub fired: &'a AtomicBool,
    /// Raises the flag (a time slice's deadline).
    pub fire: &'a dyn Fn(),
    /// The driver's flag write after a late armed request (`None`: nothing to retry).
    pub late: Option<&'a dyn Fn()>,
}

/// Spins until the notice word holds the value (see the module doc for the bounds); returns
/// when the end was noticed and how, and whether `late` was called.
pub fn wait(w: &Wait) -> Result<(Instant, Noticed, bool), DrvError> {
    let start = Instant::now();
    let mut next_query = start + EVENT_PERIOD;
    let mut seen_fired: Option<Instant> = None;
    let mut event_done: Option<Instant> = None;
    let mut late_called = false;
    loop {
        if w.word.load() == w.value {
            return Ok((Instant::now(), Noticed::Word, late_called));
        }
        let now = Instant::now();
        if let Some(d) = w.deadline
            && now >= d
            && !w.fired.swap(true, Ordering::SeqCst)
        {
            (w.fire)();
        }
        if seen_fired.is_none() && w.fired.load(Ordering::SeqCst) {
            seen_fired = Some(now);
        }
        let young_request = seen_fired.is_some_and(|t| now - t < LATE_AFTER);
        if let (Some(t), Some(late)) = (seen_fired, w.late)
            && !late_called
            && now - t >= LATE_AFTER
        {
            late_called = true;
            log::warn!(
                "cuda: armed checkpoint flag not acted on {} µs after the request: raised by the driver",
                LATE_AFTER.as_micros()
            );
            late();
        }
        if !young_request && now >= next_query {
            next_query = now + EVENT_PERIOD;
            if event_done.is_none() && w.stream.end_done()? {
                event_done = Some(Instant::now());
            }
        }
        if let Some(t) = event_done
            && now.saturating_duration_since(t) >= LOST_AFTER
        {
            if w.word.load() == w.value {
                return Ok((Instant::now(), Noticed::Word, late_called));
            }
            log::warn!(
                "cuda: the kernel's end event completed but its notice word did not come within {} µs: taken as the end",
                LOST_AFTER.as_micros()
            );
            return Ok((Instant::now(), Noticed::Event, late_called));
        }
        std::hint::spin_loop();
    }
}

/// Spins until `word` holds `value` for at most `bound`; `false` if it did not.
pub fn spin_for(word: HostWord, value: u32, bound: Duration) -> bool {
    let start = Instant::now();
    loop {
        if word.load() == value {
            return true;
        }
        if start.elapsed() >= bound {
            return word.load() == value;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_for_sees_a_store_from_another_thread_and_gives_up_after_its_bound() {
        let mut cell = Box::new(0u32);
        let word = HostWord::for_test(&mut cell);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            word.store(7);
        });
        assert!(spin_for(word, 7, Duration::from_secs(5)));
        t.join().expect("joins");
        let t0 = Instant::now();
        assert!(!spin_for(word, 8, Duration::from_millis(3)));
        assert!(t0.elapsed() >= Duration::from_millis(3));
    }
}
