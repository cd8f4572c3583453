//! A bump allocator over the RAM between the end of the image and the top of low memory.
//! Freeing the most recent allocation gives it back; other frees are leaks, which suits
//! short-lived test programs.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};

unsafe extern "C" {
    static __image_end: u8;
}

struct Bump {
    next: AtomicUsize,
    end: AtomicUsize,
}

#[global_allocator]
static HEAP: Bump = Bump {
    next: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
};

/// Heap stays below this (the identity map covers 4 GiB; the PCI hole starts at 3 GiB).
const HEAP_LIMIT: u64 = 0xc000_0000;

pub(crate) fn init() {
    let start = (&raw const __image_end) as usize;
    let top = crate::boot_info().mem_below_4g.min(HEAP_LIMIT) as usize;
    HEAP.next
        .store(start.next_multiple_of(4096), Ordering::Relaxed);
    HEAP.end.store(top, Ordering::Relaxed);
}

/// The address the next allocation starts at: the guest RAM in use (image and heap) lies below
/// it (the bump heap only grows, except for freeing its last allocation).
pub fn top() -> usize {
    HEAP.next.load(Ordering::Relaxed)
}

/// Bytes left on the heap.
pub fn free_bytes() -> usize {
    HEAP.end
        .load(Ordering::Relaxed)
        .saturating_sub(HEAP.next.load(Ordering::Relaxed))
}

// SAFETY: allocations never overlap: each takes a disjoint range by compare-and-swap on `next`.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let end = self.end.load(Ordering::Relaxed);
        let mut cur = self.next.load(Ordering::Relaxed);
        loop {
            let Some(start) = cur.checked_next_multiple_of(layout.align()) else {
                return core::ptr::null_mut();
            };
            let Some(new) = start.checked_add(layout.size()).filter(|n| *n <= end) else {
                return core::ptr::null_mut();
            };
            match self
                .next
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return start as *mut u8,
                Err(now) => cur = now,
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let end = ptr as usize + layout.size();
        let _ = self
            .next
            .compare_exchange(end, ptr as usize, Ordering::Relaxed, Ordering::Relaxed);
    }
}
