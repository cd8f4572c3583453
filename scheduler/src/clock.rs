//! The injected clock: policies take explicit timestamps; these produce them.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// A source of timestamps (time since an origin) for the scheduler's events.
pub trait Clock {
    fn now(&self) -> Duration;
}

/// Real time: the time since the clock was made (a daemon's clock).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock moved by hand (tests, simulation).
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Cell<Duration>,
}

impl ManualClock {
    pub fn new(start: Duration) -> Self {
        Self {
            now: Cell::new(start),
        }
    }
    pub fn set(&self, now: Duration) {
        self.now.set(now);
    }
    pub fn advance(&self, by: Duration) {
        self.now.set(self.now.get().saturating_add(by));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        self.now.get()
    }
}
