//! A first-fit range allocator with alignment, for guest VRAM, GPU VA and pool sub-allocation.

use alloc::vec::Vec;

/// Hands out disjoint, aligned sub-ranges of [base, base + size). Freed ranges merge with
/// their neighbours.
#[derive(Clone, Debug)]
pub struct RangeAllocator {
    /// Free ranges (start, end), sorted and disjoint, none empty.
    free: Vec<(u64, u64)>,
    base: u64,
    end: u64,
}

impl RangeAllocator {
    /// An allocator over [base, base + size) (clamped at the top of the address space).
    pub fn new(base: u64, size: u64) -> Self {
        let end = base.saturating_add(size);
        let free = if end > base {
            alloc::vec![(base, end)]
        } else {
            Vec::new()
        };
        Self { free, base, end }
    }

    /// Allocates `size` bytes (> 0) at a multiple of `align` (a power of two); the lowest fit.
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        if size == 0 || !align.is_power_of_two() {
            return None;
        }
        for i in 0..self.free.len() {
            let (s, e) = self.free[i];
            let Some(start) = s.checked_next_multiple_of(align) else {
                continue;
            };
            let Some(end) = start.checked_add(size) else {
                continue;
            };
            if end > e {
                continue;
            }
            self.free.remove(i);
            let mut at = i;
            if start > s {
                self.free.insert(at, (s, start));
                at += 1;
            }
            if end < e {
                self.free.insert(at, (end, e));
            }
            return Some(start);
        }
        None
    }

    /// Takes exactly [start, start + size) if it is free; false otherwise.
    pub fn reserve(&mut self, start: u64, size: u64) -> bool {
        let Some(end) = start.checked_add(size) else {
            return false;
        };
        if size == 0 {
            return false;
        }
        let Some(i) = self.free.iter().position(|&(s, e)| s <= start && end <= e) else {
            return false;
        };
        let (s, e) = self.free.remove(i);
        let mut at = i;
        if start > s {
            self.free.insert(at, (s, start));
            at += 1;
        }
        if end < e {
            self.free.insert(at, (end, e));
        }
        true
    }

    /// Gives [start, start + size) back. Ranges outside the allocator or overlapping free
    /// space are refused (false), so a double free cannot corrupt the free list.
    pub fn free(&mut self, start: u64, size: u64) -> bool {
        let Some(end) = start.checked_add(size) else {
            return false;
        };
        if size == 0 || start < self.base || end > self.end {
            return false;
        }
        let i = self.free.partition_point(|&(s, _)| s < start);
        if i > 0 && self.free[i - 1].1 > start {
            return false;
        }
        if i < self.free.len() && self.free[i].0 < end {
            return false;
        }
        let merge_prev = i > 0 && self.free[i - 1].1 == start;
        let merge_next = i < self.free.len() && self.free[i].0 == end;
        match (merge_prev, merge_next) {
            (true, true) => {
                self.free[i - 1].1 = self.free[i].1;
                self.free.remove(i);
            }
            (true, false) => self.free[i - 1].1 = end,
            (false, true) => self.free[i].0 = start,
            (false, false) => self.free.insert(i, (start, end)),
        }
        true
    }

    /// Bytes free in total.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_first_fit_and_merge() {
        let mut a = RangeAllocator::new(0x1000, 0x10000);
        let x = a.alloc(0x100, 0x1000).unwrap();
        assert_eq!(x, 0x1000);
        let y = a.alloc(0x100, 0x1000).unwrap();
        assert_eq!(y, 0x2000);
        let z = a.alloc(0x3000, 0x4000).unwrap();
        assert_eq!(z, 0x4000);
        assert!(a.alloc(0x20000, 1).is_none());
        assert!(a.free(y, 0x100));
        assert!(!a.free(y, 0x100), "double free refused");
        assert!(a.free(x, 0x100));
        assert!(a.free(z, 0x3000));
        assert_eq!(a.free_bytes(), 0x10000);
        assert_eq!(a.alloc(0x10000, 0x1000), Some(0x1000));
        assert_eq!(a.alloc(1, 1), None);
    }

    #[test]
    fn reserve_and_bad_frees() {
        let mut a = RangeAllocator::new(0, 0x1000);
        assert!(a.reserve(0x100, 0x100));
        assert!(!a.reserve(0x180, 0x10));
        assert!(!a.free(0x2000, 0x10), "outside");
        assert!(!a.free(0x0, 0x10), "already free");
        assert_eq!(a.alloc(0x100, 0x100), Some(0));
        assert_eq!(a.alloc(0x100, 0x100), Some(0x200));
        assert!(a.alloc(0, 1).is_none());
        assert!(a.alloc(1, 3).is_none());
        assert!(RangeAllocator::new(u64::MAX, 10).alloc(1, 1).is_none());
    }
}
