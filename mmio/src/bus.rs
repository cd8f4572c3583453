//! A range map from guest addresses (MMIO or port numbers) to device handlers, with overlap
//! rejection at registration, all-ones reads for unknown addresses (logged once each), and
//! read/write counters per named region.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Serialize;

/// A device that owns one or more bus regions. Offsets are relative to the region's base.
pub trait BusDevice: Send {
    /// Guest read of `data.len()` bytes at `offset` into the region.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Guest write of `data` at `offset` into the region.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// What the bus calls on a trap: shared, internally synchronised.
pub trait BusHandler: Send + Sync {
    /// Guest read; see [`BusDevice::read`].
    fn read(&self, offset: u64, data: &mut [u8]);
    /// Guest write; see [`BusDevice::write`].
    fn write(&self, offset: u64, data: &[u8]);
}

impl<T: BusDevice> BusHandler for Mutex<T> {
    fn read(&self, offset: u64, data: &mut [u8]) {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .read(offset, data)
    }
    fn write(&self, offset: u64, data: &[u8]) {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write(offset, data)
    }
}

/// Errors of bus registration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("region {name} [{base:#x}, +{len:#x}) is empty or wraps around")]
    BadRange { name: String, base: u64, len: u64 },
    #[error("region {name} [{base:#x}, +{len:#x}) overlaps {other} at {other_base:#x}")]
    Overlap {
        name: String,
        base: u64,
        len: u64,
        other: String,
        other_base: u64,
    },
    #[error("no region at {0:#x}")]
    NotFound(u64),
}

/// Access counters of one named region (kept across relocations and removals).
#[derive(Debug, Default)]
pub struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
}

impl Counters {
    /// Reads counted so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
    /// Writes counted so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }
}

/// One row of [`Bus::stats`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RegionStats {
    pub name: String,
    /// Current base, or `None` when the region is not mapped now (e.g. a disabled BAR).
    pub base: Option<u64>,
    pub len: u64,
    pub reads: u64,
    pub writes: u64,
}

#[derive(Clone)]
struct Entry {
    len: u64,
    name: Arc<str>,
    handler: Arc<dyn BusHandler>,
    counters: Arc<Counters>,
}

/// Unknown addresses logged individually before the bus stops logging them.
const MAX_LOGGED_UNKNOWN: usize = 64;

#[derive(Default)]
struct Unknown {
    logged: HashSet<u64>,
    reads: u64,
    writes: u64,
}

/// A bus: port I/O or MMIO. Cheap to share (`Arc<Bus>`); all methods take `&self`.
pub struct Bus {
    kind: &'static str,
    map: RwLock<BTreeMap<u64, Entry>>,
    counters: Mutex<BTreeMap<String, (u64, Arc<Counters>)>>,
    unknown: Mutex<Unknown>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Bus {
    /// A new, empty bus; `kind` ("pio" or "mmio") appears in log messages.
    pub fn new(kind: &'static str) -> Self {
        Bus {
            kind,
            map: RwLock::new(BTreeMap::new()),
            counters: Mutex::new(BTreeMap::new()),
            unknown: Mutex::new(Unknown::default()),
        }
    }

    /// Registers `handler` for `[base, base + len)` under `name`. Regions never overlap. A region
    /// registered again under the same name keeps its counters.
    pub fn insert(
        &self,
        name: &str,
        base: u64,
        len: u64,
        handler: Arc<dyn BusHandler>,
    ) -> Result<(), BusError> {
        let end = base.checked_add(len).filter(|_| len > 0);
        let Some(end) = end else {
            return Err(BusError::BadRange {
                name: name.into(),
                base,
                len,
            });
        };
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let clash = map
            .range(..end)
            .next_back()
            .filter(|(b, e)| **b + e.len > base);
        if let Some((other_base, other)) = clash {
            return Err(BusError::Overlap {
                name: name.into(),
                base,
                len,
                other: other.name.to_string(),
                other_base: *other_base,
            });
        }
        let counters = {
            let mut all = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = all
                .entry(name.to_string())
                .or_insert_with(|| (len, Arc::new(Counters::default())));
            slot.0 = len;
            slot.1.clone()
        };
        map.insert(
            base,
            Entry {
                len,
                name: name.into(),
                handler,
                counters,
            },
        );
        Ok(())
    }

    /// Removes the region starting at `base`.
    pub fn remove(&self, base: u64) -> Result<(), BusError> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        map.remove(&base)
            .map(|_| ())
            .ok_or(BusError::NotFound(base))
    }

    /// Moves the region at `old` to `new` (same length, handler and counters).
    pub fn relocate(&self, old: u64, new: u64) -> Result<(), BusError> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let entry = map.remove(&old).ok_or(BusError::NotFound(old))?;
        let name = entry.name.to_string();
        let len = entry.len;
        let end = new.checked_add(len);
        let clash = end.and_then(|end| {
            map.range(..end)
                .next_back()
                .filter(|(b, e)| **b + e.len > new)
                .map(|(b, e)| (*b, e.name.to_string()))
        });
        if end.is_none() || clash.is_some() {
            map.insert(old, entry);
            return Err(match clash {
                Some((other_base, other)) => BusError::Overlap {
                    name,
                    base: new,
                    len,
                    other,
                    other_base,
                },
                None => BusError::BadRange {
                    name,
                    base: new,
                    len,
                },
            });
        }
        map.insert(new, entry);
        Ok(())
    }

    fn lookup(&self, addr: u64, size: usize) -> Option<(u64, Entry)> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let (base, entry) = map.range(..=addr).next_back()?;
        let off = addr - base;
        (off < entry.len && (size as u64) <= entry.len - off).then(|| (off, entry.clone()))
    }

    /// Dispatches a guest read. Unknown addresses read as all-ones. Returns whether a device
    /// handled it.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.lookup(addr, data.len()) {
            Some((off, e)) => {
                e.counters.reads.fetch_add(1, Ordering::Relaxed);
                e.handler.read(off, data);
                true
            }
            None => {
                data.fill(0xff);
                self.note_unknown(addr, data.len(), false);
                false
            }
        }
    }

    /// Dispatches a guest write. Writes to unknown addresses are dropped. Returns whether a
    /// device handled it.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.lookup(addr, data.len()) {
            Some((off, e)) => {
                e.counters.writes.fetch_add(1, Ordering::Relaxed);
                e.handler.write(off, data);
                true
            }
            None => {
                self.note_unknown(addr, data.len(), true);
                false
            }
        }
    }

    fn note_unknown(&self, addr: u64, size: usize, write: bool) {
        let mut u = self.unknown.lock().unwrap_or_else(PoisonError::into_inner);
        if write {
            u.writes += 1;
        } else {
            u.reads += 1;
        }
        if u.logged.len() < MAX_LOGGED_UNKNOWN && u.logged.insert(addr) {
            let what = if write { "write to" } else { "read of" };
            log::warn!(
                "{} bus: {what} unknown address {addr:#x} ({size} bytes)",
                self.kind
            );
            if u.logged.len() == MAX_LOGGED_UNKNOWN {
                log::warn!(
                    "{} bus: further unknown addresses are not logged",
                    self.kind
                );
            }
        }
    }

    /// Counters of every region ever registered, plus one `unknown` row.
    pub fn stats(&self) -> Vec<RegionStats> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        let mut rows: Vec<RegionStats> = counters
            .iter()
            .map(|(name, (len, c))| RegionStats {
                name: name.clone(),
                base: map.iter().find(|(_, e)| &*e.name == name).map(|(b, _)| *b),
                len: *len,
                reads: c.reads(),
                writes: c.writes(),
            })
            .collect();
        let u = self.unknown.lock().unwrap_or_else(PoisonError::into_inner);
        rows.push(RegionStats {
            name: "unknown".into(),
            base: None,
            len: 0,
            reads: u.reads,
            writes: u.writes,
        });
        rows
    }

    /// Base of the region registered under `name`, if it is mapped now.
    pub fn base_of(&self, name: &str) -> Option<u64> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.iter().find(|(_, e)| &*e.name == name).map(|(b, _)| *b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Reg {
        last: Option<(u64, Vec<u8>)>,
    }
    impl BusDevice for Reg {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last = Some((offset, data.to_vec()));
        }
    }

    fn dev() -> Arc<Mutex<Reg>> {
        Arc::new(Mutex::new(Reg::default()))
    }

    #[test]
    fn dispatch_offsets_and_counts() {
        let bus = Bus::new("mmio");
        let d = dev();
        bus.insert("a", 0x1000, 0x100, d.clone()).unwrap();
        let mut b = [0u8; 4];
        assert!(bus.read(0x1010, &mut b));
        assert_eq!(b, [0x10; 4]);
        assert!(bus.write(0x10fc, &[1, 2, 3, 4]));
        assert_eq!(d.lock().unwrap().last, Some((0xfc, vec![1, 2, 3, 4])));
        let s = bus.stats();
        assert_eq!((s[0].reads, s[0].writes, s[0].base), (1, 1, Some(0x1000)));
    }

    #[test]
    fn unknown_reads_all_ones_and_straddling_is_unknown() {
        let bus = Bus::new("pio");
        bus.insert("a", 0x10, 4, dev()).unwrap();
        let mut b = [0u8; 4];
        assert!(!bus.read(0x20, &mut b));
        assert_eq!(b, [0xff; 4]);
        // Starts inside but runs past the end of the region.
        assert!(!bus.read(0x12, &mut b));
        assert!(!bus.write(0x9, &[0]));
        let u = bus.stats().pop().unwrap();
        assert_eq!((u.name.as_str(), u.reads, u.writes), ("unknown", 2, 1));
    }

    #[test]
    fn overlap_rejected() {
        let bus = Bus::new("mmio");
        bus.insert("a", 0x1000, 0x100, dev()).unwrap();
        for (base, len) in [
            (0x1000, 1),
            (0xfff, 2),
            (0x10ff, 1),
            (0x800, 0x1000),
            (0x1080, 0x10),
        ] {
            assert!(
                matches!(
                    bus.insert("b", base, len, dev()),
                    Err(BusError::Overlap { .. })
                ),
                "{base:#x}+{len:#x}"
            );
        }
        bus.insert("b", 0x1100, 0x10, dev()).unwrap();
        bus.insert("c", 0xff0, 0x10, dev()).unwrap();
        assert!(matches!(
            bus.insert("z", 0, 0, dev()),
            Err(BusError::BadRange { .. })
        ));
        assert!(matches!(
            bus.insert("z", u64::MAX, 2, dev()),
            Err(BusError::BadRange { .. })
        ));
    }

    #[test]
    fn relocate_keeps_counters_and_rejects_overlap() {
        let bus = Bus::new("mmio");
        bus.insert("a", 0x1000, 0x100, dev()).unwrap();
        bus.insert("b", 0x3000, 0x100, dev()).unwrap();
        let mut b = [0u8; 1];
        bus.read(0x1000, &mut b);
        bus.relocate(0x1000, 0x2000).unwrap();
        assert!(!bus.read(0x1000, &mut b));
        assert!(bus.read(0x2000, &mut b));
        assert_eq!(bus.stats()[0].reads, 2);
        assert!(matches!(
            bus.relocate(0x2000, 0x2f80),
            Err(BusError::Overlap { .. })
        ));
        assert_eq!(bus.base_of("a"), Some(0x2000));
        bus.remove(0x2000).unwrap();
        assert_eq!(bus.stats()[0].base, None);
        assert_eq!(bus.remove(0x2000), Err(BusError::NotFound(0x2000)));
    }
}
