//! BAR remap (GPUvm's optimization): the VRAM aperture (BAR1) is mapped straight into the guest
//! through memory slots, so aperture accesses stop trapping — except the pages that hold GPU
//! structures (instance blocks, page directories, page tables), which stay trapped so the device
//! notices the guest's writes to them. A page is trapped again the moment it becomes one (the
//! device calls [`Remap::trap`] from the trapped register write or the rebuild that reveals it).
//! Trapped pages stay trapped until the aperture is rebuilt (conservative: a page that stopped
//! holding a table only costs traps, never correctness).

use std::collections::BTreeSet;
use std::sync::Arc;

/// Maps host memory into the guest's physical address space; implemented by the VMM with
/// memory slots.
pub trait ApertureMapper: Send + Sync {
    /// Makes guest-physical `[gpa, gpa + len)` ordinary memory backed by host `[host, host +
    /// len)`; returns a handle for [`ApertureMapper::unmap`].
    ///
    /// # Safety
    /// `[host, host + len)` must be valid, writable memory until the mapping is unmapped.
    unsafe fn map(&self, gpa: u64, host: *mut u8, len: u64) -> Result<u32, String>;
    /// Undoes a `map`: accesses trap again.
    fn unmap(&self, handle: u32);
}

const PAGE: u64 = 4096;

/// The aperture's mapped ranges (in guest VRAM pages) and trapped pages.
pub struct Remap {
    mapper: Arc<dyn ApertureMapper>,
    /// Host address of guest VRAM address 0.
    host: *mut u8,
    pages: u64,
    bar: Option<u64>,
    trapped: BTreeSet<u64>,
    /// Live mappings: (first page, end page, handle).
    live: Vec<(u64, u64, u32)>,
    /// Map calls made so far (for `--stats`).
    pub maps: u64,
    /// Everything traps while set (a live snapshot logs VRAM writes, and the guest's own
    /// writes through a mapped aperture would bypass the log).
    suspended: bool,
}

// SAFETY: `host` points into VRAM owned by the engine, which outlives the device holding this;
// it is only passed to the mapper, never dereferenced here.
unsafe impl Send for Remap {}

impl Remap {
    /// `host` is the host address of guest VRAM 0, `size` the guest VRAM size.
    pub fn new(mapper: Arc<dyn ApertureMapper>, host: *mut u8, size: u64) -> Self {
        Remap {
            mapper,
            host,
            pages: size / PAGE,
            bar: None,
            trapped: BTreeSet::new(),
            live: Vec::new(),
            maps: 0,
            suspended: false,
        }
    }

    /// Unmaps the whole aperture (`true`: every access traps) or maps it again (`false`).
    pub fn suspend(&mut self, on: bool) {
        if self.suspended != on {
            self.suspended = on;
            self.rebuild();
        }
    }

    /// The BAR now decodes at `addr` (or nowhere).
    pub fn bar_moved(&mut self, addr: Option<u64>) {
        self.bar = addr;
        self.rebuild();
    }

    /// Keeps the pages holding guest VRAM addresses `addrs` trapped; returns whether any page
    /// was newly trapped.
    pub fn trap(&mut self, addrs: impl IntoIterator<Item = u64>) -> bool {
        let mut new = Vec::new();
        for a in addrs {
            let p = a / PAGE;
            if p < self.pages && self.trapped.insert(p) {
                new.push(p);
            }
        }
        for p in &new {
            self.split_at(*p);
        }
        !new.is_empty()
    }

    /// Whether the page holding `addr` is trapped.
    pub fn is_trapped(&self, addr: u64) -> bool {
        self.trapped.contains(&(addr / PAGE))
    }

    /// Number of pages kept trapping.
    pub fn trapped_pages(&self) -> usize {
        self.trapped.len()
    }

    /// Mapped ranges as (guest-physical address, length), for tests and stats.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let Some(bar) = self.bar else {
            return Vec::new();
        };
        self.live
            .iter()
            .map(|(s, e, _)| (bar + s * PAGE, (e - s) * PAGE))
            .collect()
    }

    fn map_run(&mut self, start: u64, end: u64) {
        let Some(bar) = self.bar else { return };
        if start >= end || self.suspended {
            return;
        }
        // SAFETY: start < pages, so the offset stays inside the VRAM mapping `host` points into.
        let host = unsafe { self.host.add((start * PAGE) as usize) };
        // SAFETY: the range lies inside guest VRAM, which the engine keeps alive longer than this
        // `Remap` (owned by the device, which holds the engine), and every mapping is undone in
        // `unmap_all` at the latest on drop.
        match unsafe {
            self.mapper
                .map(bar + start * PAGE, host, (end - start) * PAGE)
        } {
            Ok(h) => {
                self.maps += 1;
                self.live.push((start, end, h));
                self.live.sort_unstable_by_key(|r| r.0);
            }
            Err(e) => log::warn!(
                "vgpu: remap of aperture pages {start:#x}..{end:#x} failed ({e}); they keep trapping"
            ),
        }
    }

    fn split_at(&mut self, p: u64) {
        if let Some(i) = self.live.iter().position(|(s, e, _)| (*s..*e).contains(&p)) {
            let (s, e, h) = self.live.remove(i);
            self.mapper.unmap(h);
            self.map_run(s, p);
            self.map_run(p + 1, e);
        }
    }

    fn unmap_all(&mut self) {
        for (_, _, h) in self.live.drain(..) {
            self.mapper.unmap(h);
        }
    }

    fn rebuild(&mut self) {
        self.unmap_all();
        if self.bar.is_none() || self.suspended {
            return;
        }
        let mut start = 0;
        let trapped: Vec<u64> = self.trapped.iter().copied().collect();
        for t in trapped {
            self.map_run(start, t);
            start = t + 1;
        }
        self.map_run(start, self.pages);
    }
}

impl Drop for Remap {
    fn drop(&mut self) {
        self.unmap_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Fake {
        live: Mutex<HashMap<u32, (u64, u64, usize)>>,
        next: Mutex<u32>,
    }

    impl ApertureMapper for Fake {
        unsafe fn map(&self, gpa: u64, host: *mut u8, len: u64) -> Result<u32, String> {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            self.live
                .lock()
                .unwrap()
                .insert(*n, (gpa, len, host as usize));
            Ok(*n)
        }
        fn unmap(&self, handle: u32) {
            assert!(
                self.live.lock().unwrap().remove(&handle).is_some(),
                "unmapped twice"
            );
        }
    }

    fn sorted(f: &Fake) -> Vec<(u64, u64, usize)> {
        let mut v: Vec<_> = f.live.lock().unwrap().values().copied().collect();
        v.sort();
        v
    }

    const HOST: usize = 0x7f00_0000_0000;
    const BAR: u64 = 0x100_0000_0000;

    #[test]
    fn aperture_is_mapped_except_trapped_pages_and_follows_the_bar() {
        let f = Arc::new(Fake::default());
        let mut r = Remap::new(f.clone(), HOST as *mut u8, 16 * PAGE);
        assert!(sorted(&f).is_empty(), "nothing until the BAR decodes");
        r.bar_moved(Some(BAR));
        assert_eq!(sorted(&f), vec![(BAR, 16 * PAGE, HOST)]);
        // Page 5 becomes an instance block: trapped at once, the rest stays mapped.
        assert!(r.trap([5 * PAGE + 8]));
        assert_eq!(
            sorted(&f),
            vec![
                (BAR, 5 * PAGE, HOST),
                (BAR + 6 * PAGE, 10 * PAGE, HOST + 6 * PAGE as usize)
            ]
        );
        assert!(r.is_trapped(5 * PAGE) && !r.is_trapped(4 * PAGE));
        assert!(!r.trap([5 * PAGE]), "already trapped: no change");
        // Edges and out-of-range addresses.
        assert!(r.trap([0, 15 * PAGE, 99 * PAGE]));
        assert_eq!(
            sorted(&f),
            vec![
                (BAR + PAGE, 4 * PAGE, HOST + PAGE as usize),
                (BAR + 6 * PAGE, 9 * PAGE, HOST + 6 * PAGE as usize)
            ]
        );
        // The guest moves the BAR: the same layout at the new address.
        r.bar_moved(Some(BAR + (1 << 30)));
        assert_eq!(
            r.ranges(),
            vec![
                (BAR + (1 << 30) + PAGE, 4 * PAGE),
                (BAR + (1 << 30) + 6 * PAGE, 9 * PAGE)
            ]
        );
        assert_eq!(sorted(&f).len(), 2);
        // Decode off: nothing mapped; a page trapped meanwhile is honoured when it comes back.
        r.bar_moved(None);
        assert!(sorted(&f).is_empty());
        r.trap([8 * PAGE]);
        r.bar_moved(Some(BAR));
        assert_eq!(sorted(&f).len(), 3);
        drop(r);
        assert!(sorted(&f).is_empty(), "dropping unmaps everything");
    }
}
