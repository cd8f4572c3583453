//! The VM's host memory budget (`--gpu hostmem=`): the bytes of host memory the device holds
//! on the guest's behalf around its GPU work — loaded modules (decoded code, `.global`/`.const`
//! variables, the PTX text kept by the engine and by the device's module cache) and shadow
//! address spaces (installed mappings and page tables). Every charge goes through here; the
//! caches evict their least recently used idle entries to stay under the limit, and work whose
//! live set does not fit faults with RESOURCE_LIMIT (docs/hardware.md, "Host limits").

use serde::Serialize;

/// What a charge is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A loaded module.
    Module,
    /// A shadow address space.
    Space,
}

/// Accounting of the budget, as `--stats` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HostMemStats {
    /// The limit, bytes.
    pub limit: u64,
    /// Bytes charged now for modules.
    pub modules: u64,
    /// Bytes charged now for shadow spaces.
    pub spaces: u64,
    /// Most bytes ever charged at once.
    pub peak: u64,
    /// Modules loaded into the engine (cache misses).
    pub module_loads: u64,
    /// Modules unloaded to make room.
    pub modules_evicted: u64,
    /// Shadow spaces destroyed to make room.
    pub spaces_evicted: u64,
    /// Work refused with RESOURCE_LIMIT.
    pub refused: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct HostBudget {
    stats: HostMemStats,
    /// Use clock for least-recently-used eviction across both classes.
    clock: u64,
}

impl HostBudget {
    pub fn new(limit: u64) -> Self {
        HostBudget {
            stats: HostMemStats {
                limit,
                ..HostMemStats::default()
            },
            clock: 0,
        }
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.stats.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.stats.modules + self.stats.spaces
    }

    /// Bytes still free.
    pub fn free(&self) -> u64 {
        self.stats.limit.saturating_sub(self.used())
    }

    /// A new use stamp (later stamps are more recent).
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Charges `bytes`; returns false (and charges nothing) if they do not fit.
    pub fn charge(&mut self, class: Class, bytes: u64) -> bool {
        if bytes > self.free() {
            return false;
        }
        match class {
            Class::Module => self.stats.modules += bytes,
            Class::Space => self.stats.spaces += bytes,
        }
        self.stats.peak = self.stats.peak.max(self.used());
        true
    }

    /// Gives back `bytes` charged before.
    pub fn release(&mut self, class: Class, bytes: u64) {
        let c = match class {
            Class::Module => &mut self.stats.modules,
            Class::Space => &mut self.stats.spaces,
        };
        *c = c.saturating_sub(bytes);
    }

    /// Counts an event.
    pub fn count(&mut self, what: fn(&mut HostMemStats) -> &mut u64) {
        *what(&mut self.stats) += 1;
    }

    /// The accounting now.
    pub fn stats(&self) -> HostMemStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stay_under_the_limit() {
        let mut b = HostBudget::new(100);
        assert!(b.charge(Class::Module, 60));
        assert!(!b.charge(Class::Space, 41));
        assert!(b.charge(Class::Space, 40));
        assert_eq!((b.used(), b.free(), b.stats().peak), (100, 0, 100));
        b.release(Class::Module, 60);
        assert_eq!((b.stats().modules, b.stats().spaces, b.free()), (0, 40, 60));
        assert!(b.tick() < b.tick());
    }
}
