//! Online estimates for filling: a running mean and mean absolute deviation per kernel identity,
//! in a table bounded per VM (the least recently used identity is evicted).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::types::KernelKey;

/// Weight of a new sample once the estimate has this many samples (before: a plain mean).
const HORIZON: u32 = 8;
/// Deviations added to / taken from the mean for a conservative prediction.
const SPREAD: f64 = 2.0;

/// Running mean and mean absolute deviation of a duration, in nanoseconds; the first samples
/// are averaged exactly, then each new one has weight `1 / HORIZON` (follows drift).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimate {
    n: u32,
    mean: f64,
    dev: f64,
}

fn to_duration(ns: f64) -> Duration {
    // `as` saturates (negative and NaN give 0).
    Duration::from_nanos(ns as u64)
}

impl Estimate {
    pub fn add(&mut self, sample: Duration) {
        let x = sample.as_nanos() as f64;
        self.n = self.n.saturating_add(1);
        let w = 1.0 / f64::from(self.n.min(HORIZON));
        let d = x - self.mean;
        if self.n == 1 {
            self.mean = x;
            return;
        }
        self.mean += w * d;
        self.dev += w * (d.abs() - self.dev);
    }
    #[cfg(test)]
    pub fn mean(&self) -> Duration {
        to_duration(self.mean)
    }
    /// Mean plus twice the deviation: how long it will likely take at most.
    pub fn high(&self) -> Duration {
        to_duration(self.mean + SPREAD * self.dev)
    }
    /// Mean less twice the deviation (≥ 0): how long it will likely last at least (gaps
    /// used it; see `Window`).
    #[cfg(test)]
    pub fn low(&self) -> Duration {
        to_duration(self.mean - SPREAD * self.dev)
    }
}

/// Samples a window keeps.
const WINDOW: usize = 16;

/// The last `WINDOW` samples of a duration, for quantiles: idle gaps are skewed (a VM slowed by
/// a loaded host returns late, never early), and a mean less two deviations of such a sample
/// lands far below where most of them are. Memory is fixed (128 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    ring: [u64; WINDOW],
    next: usize,
    len: usize,
    total: u32,
}

impl Window {
    pub fn add(&mut self, sample: Duration) {
        self.ring[self.next] = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX);
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
        self.total = self.total.saturating_add(1);
    }
    /// The `num / den` quantile of the kept samples (the lower one between two); zero without
    /// samples.
    fn quantile(&self, num: usize, den: usize) -> Duration {
        let mut v = self.ring;
        let kept = &mut v[..self.len];
        kept.sort_unstable();
        let i = (self.len.saturating_sub(1) * num) / den.max(1);
        Duration::from_nanos(kept.get(i).copied().unwrap_or(0))
    }
    /// About the 10th percentile (the 2nd smallest of 16): when the VM is likely back at the
    /// earliest.
    pub fn low(&self) -> Duration {
        self.quantile(1, 10)
    }
    /// The third quartile: by when it is back three times in four.
    pub fn upper(&self) -> Duration {
        self.quantile(3, 4)
    }
}

/// What a table keeps per identity.
pub trait Sampled: Default + Copy {
    fn add(&mut self, sample: Duration);
    fn samples(&self) -> u32;
}

impl Sampled for Estimate {
    fn add(&mut self, sample: Duration) {
        Estimate::add(self, sample);
    }
    fn samples(&self) -> u32 {
        self.n
    }
}

impl Sampled for Window {
    fn add(&mut self, sample: Duration) {
        Window::add(self, sample);
    }
    fn samples(&self) -> u32 {
        self.total
    }
}

/// Estimates per kernel identity (`None`: launches without an identity), at most `cap` of them;
/// inserting a new identity into a full table evicts the least recently used one, so a VM that
/// sends many identities only loses its own predictions.
#[derive(Debug, Clone)]
pub struct Table<T = Estimate> {
    cap: usize,
    tick: u64,
    entries: BTreeMap<Option<KernelKey>, (T, u64)>,
}

impl<T: Sampled> Table<T> {
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            tick: 0,
            entries: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Adds a sample for `key`.
    pub fn add(&mut self, key: Option<KernelKey>, sample: Duration) {
        self.tick += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.cap {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        let e = self.entries.entry(key).or_default();
        e.0.add(sample);
        e.1 = self.tick;
    }

    /// The estimate of `key` if it has at least `samples` samples.
    pub fn get(&self, key: Option<KernelKey>, samples: u32) -> Option<T> {
        self.entries
            .get(&key)
            .map(|(e, _)| *e)
            .filter(|e| e.samples() >= samples.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn steady_samples_predict_themselves() {
        let mut e = Estimate::default();
        for _ in 0..5 {
            e.add(us(300));
        }
        assert_eq!((e.mean(), e.low(), e.high()), (us(300), us(300), us(300)));
    }

    #[test]
    fn jitter_widens_the_prediction_both_ways() {
        let mut e = Estimate::default();
        for x in [100, 300, 100, 300, 100, 300] {
            e.add(us(x));
        }
        assert!(e.low() < us(150), "{:?}", e.low());
        assert!(e.high() > us(250), "{:?}", e.high());
        assert!(e.mean() > us(150) && e.mean() < us(250));
    }

    #[test]
    fn drift_is_followed() {
        let mut e = Estimate::default();
        for _ in 0..20 {
            e.add(us(100));
        }
        for _ in 0..40 {
            e.add(us(1000));
        }
        assert!(e.mean() > us(990), "{:?}", e.mean());
    }

    #[test]
    fn window_quantiles_ignore_a_late_tail() {
        let mut w = Window::default();
        assert_eq!((w.low(), w.upper()), (Duration::ZERO, Duration::ZERO));
        // Mostly 2.2-2.4 ms, a quarter of them late (a loaded host): the low quantile stays
        // near the usual return, where mean - 2 deviations would fall to about 1.5 ms.
        for x in [
            2200, 2250, 2300, 6000, 2350, 2400, 2280, 4000, 2320, 2260, 5000, 2240,
        ] {
            w.add(us(x));
        }
        assert!(w.low() >= us(2200) && w.low() <= us(2260), "{:?}", w.low());
        // 12 samples: the 9th smallest (2400 µs); the late ones above it.
        assert_eq!(w.upper(), us(2400));
        let mut e = Estimate::default();
        for x in [
            2200, 2250, 2300, 6000, 2350, 2400, 2280, 4000, 2320, 2260, 5000, 2240,
        ] {
            e.add(us(x));
        }
        assert!(e.low() < us(2000), "{:?}", e.low());
    }

    #[test]
    fn window_keeps_the_last_samples_only() {
        let mut w = Window::default();
        for _ in 0..40 {
            w.add(us(100));
        }
        for _ in 0..16 {
            w.add(us(900));
        }
        assert_eq!((w.low(), w.upper()), (us(900), us(900)));
        assert_eq!(Sampled::samples(&w), 56);
        // Hostile values saturate instead of wrapping.
        w.add(Duration::MAX);
        assert_eq!(w.low(), us(900));
    }

    #[test]
    fn table_is_bounded_and_evicts_least_recently_used() {
        let mut t: Table = Table::new(2);
        let k = |n| Some(KernelKey(n));
        t.add(k(1), us(10));
        t.add(k(2), us(20));
        t.add(k(1), us(10)); // 1 used after 2
        t.add(k(3), us(30)); // evicts 2
        assert_eq!(t.len(), 2);
        assert!(t.get(k(2), 1).is_none());
        assert_eq!(t.get(k(1), 2).map(|e| e.mean()), Some(us(10)));
        assert_eq!(t.get(k(3), 1).map(|e| e.mean()), Some(us(30)));
        assert!(t.get(k(3), 2).is_none(), "one sample is not enough for 2");
    }
}
