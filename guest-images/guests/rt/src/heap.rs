//! The heap for `alloc`: the RAM between the end of the image and the top of low memory, managed
//! by `talc`, a general-purpose allocator: every freed block is reused, so a guest that
//! allocates and frees per kernel launch (pushbuffers, parameter blocks, messages) runs for as
//! long as it likes in the memory it holds at once. (A bump heap before it reused only the
//! most recent allocation and ran out after ~80k launches of the `fairness` guest.)
//!
//! [`top`] is the heap's high-water mark, what `--memory` must hold.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};

use talc::{ErrOnOom, Span, Talc, Talck};

unsafe extern "C" {
    static __image_end: u8;
}

/// `talc` behind a spinlock, and the highest address an allocation has reached.
struct Heap {
    talc: Talck<spinning_top::RawSpinlock, ErrOnOom>,
    /// The end of the highest allocation so far (the start of the heap before the first).
    top: AtomicUsize,
}

#[global_allocator]
static HEAP: Heap = Heap {
    talc: Talc::new(ErrOnOom).lock(),
    top: AtomicUsize::new(0),
};

/// Heap stays below this (the identity map covers 4 GiB; the PCI hole starts at 3 GiB).
const HEAP_LIMIT: u64 = 0xc000_0000;

/// Gives the allocator the RAM above the image (called once, before the program runs).
pub(crate) fn init() {
    let start = ((&raw const __image_end) as usize).next_multiple_of(4096);
    let end = crate::boot_info().mem_below_4g.min(HEAP_LIMIT) as usize;
    HEAP.top.store(start, Ordering::Relaxed);
    if end <= start {
        crate::println!("guest-rt: no RAM above the image for a heap");
        return;
    }
    // SAFETY: [start, end) is identity-mapped guest RAM (below the top of low memory the VMM
    // reported) that nothing else uses: the image, its stacks and the VMM's boot structures lie
    // below `__image_end`, and BARs start at 3 GiB (HEAP_LIMIT). It is claimed once.
    let claimed = unsafe {
        HEAP.talc
            .lock()
            .claim(Span::new(start as *mut u8, end as *mut u8))
    };
    if claimed.is_err() {
        crate::println!("guest-rt: the heap's {} bytes are too few", end - start);
    }
}

/// The highest address the heap has used (the end of its highest allocation so far): the RAM
/// the program used, image and heap, lies below it.
pub fn top() -> usize {
    HEAP.top.load(Ordering::Relaxed)
}

impl Heap {
    /// Records that `[ptr, ptr + size)` is in use (a null `ptr`, a failed allocation, is not).
    fn reached(&self, ptr: *mut u8, size: usize) -> *mut u8 {
        if !ptr.is_null() {
            self.top
                .fetch_max((ptr as usize).saturating_add(size), Ordering::Relaxed);
        }
        ptr
    }
}

// SAFETY: every call is passed on to talc's `GlobalAlloc` with the caller's own arguments
// (which meet the trait's contract); the high-water mark only reads the result.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as the trait requires.
        self.reached(unsafe { self.talc.alloc(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract).
        unsafe { self.talc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's block, layout and new size, as the trait requires.
        self.reached(
            unsafe { self.talc.realloc(ptr, layout, new_size) },
            new_size,
        )
    }
}
