//! memcpy/memmove/memset/memcmp/bcmp: the compiler emits calls to these and there is no libc.
//! Written with `rep movsb`/`rep stosb` and plain byte loops the optimiser cannot turn back
//! into calls to themselves.

use core::arch::asm;

/// # Safety
/// Standard C `memcpy` contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both ranges are valid and do not overlap.
    unsafe {
        asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _, options(nostack, preserves_flags))
    };
    dst
}

/// # Safety
/// Standard C `memmove` contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize).wrapping_add(n) {
        // SAFETY: forward copy is correct when dst does not start inside src.
        return unsafe { memcpy(dst, src, n) };
    }
    // SAFETY: backward copy with the direction flag set, restored before returning.
    unsafe {
        asm!("std", "rep movsb", "cld",
            inout("rcx") n => _, inout("rdi") dst.add(n - 1) => _, inout("rsi") src.add(n - 1) => _,
            options(nostack))
    };
    dst
}

/// # Safety
/// Standard C `memset` contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees the range is valid.
    unsafe {
        asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8, options(nostack, preserves_flags))
    };
    dst
}

/// # Safety
/// Standard C `memcmp` contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n and the caller guarantees both ranges are readable.
        let (x, y) = unsafe {
            (
                core::ptr::read_volatile(a.add(i)),
                core::ptr::read_volatile(b.add(i)),
            )
        };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// # Safety
/// Standard C `bcmp` contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}

/// The prebuilt `alloc` crate refers to the unwinding personality routine; with
/// `panic = "abort"` nothing ever unwinds, so it is never called.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

/// Also referenced by the prebuilt `alloc` (cleanup paths of `format!`); unreachable with
/// `panic = "abort"`. Ends the VM if it is ever reached.
#[unsafe(no_mangle)]
pub extern "C" fn _Unwind_Resume() -> ! {
    crate::exit(guest_abi::exit_codes::PANIC)
}
