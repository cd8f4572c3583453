//! A first-fit range allocator over `u64` offsets with coalescing frees: physical VRAM
//! extents of the process's engine, a context's device memory inside its extents, the VAs of
//! its host buffers.

use std::collections::BTreeMap;

/// Free ranges, start → length; adjacent ranges are always merged.
#[derive(Debug, Default)]
pub struct RangeAlloc {
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
}

impl RangeAlloc {
    /// An allocator over `[start, start + len)`.
    pub fn new(start: u64, len: u64) -> Self {
        let mut a = Self::default();
        a.free(start, len);
        a
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// `len` bytes (> 0) at a multiple of `align` (a power of two), first fit.
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        if len == 0 || !align.is_power_of_two() {
            return None;
        }
        let (start, flen, at) = self.free.iter().find_map(|(&s, &l)| {
            let at = s.checked_next_multiple_of(align)?;
            (at.checked_add(len)? <= s + l).then_some((s, l, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + len;
        if end < start + flen {
            self.free.insert(end, start + flen - end);
        }
        self.free_bytes -= len;
        Some(at)
    }

    /// Returns `[start, start + len)` (which must have been allocated, or be new space).
    pub fn free(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back()
            && ps + pl == start
        {
            self.free.remove(&ps);
            s = ps;
            l += pl;
        }
        if let Some(nl) = self.free.remove(&(start + len)) {
            l += nl;
        }
        self.free.insert(s, l);
        self.free_bytes += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_aligned_and_coalescing() {
        let mut a = RangeAlloc::new(0, 4096);
        let x = a.alloc(100, 256).unwrap();
        let y = a.alloc(100, 256).unwrap();
        assert_eq!((x, y), (0, 256));
        assert_eq!(a.free_bytes(), 4096 - 200);
        assert!(a.alloc(8192, 256).is_none());
        a.free(x, 100);
        assert_eq!(a.alloc(50, 256), Some(0));
        a.free(0, 50);
        a.free(y, 100);
        assert_eq!(a.free_bytes(), 4096);
        assert_eq!(a.alloc(4096, 4096), Some(0));
        assert!(a.alloc(1, 1).is_none());
    }
}
