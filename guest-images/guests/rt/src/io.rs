//! Port I/O and MMIO access helpers.

use core::arch::asm;

/// Writes a byte to an I/O port.
pub fn outb(port: u16, v: u8) {
    // SAFETY: port I/O has no memory effects visible to Rust; the guest owns the machine.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags))
    }
}

/// Reads a byte from an I/O port.
pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: as for `outb`.
    unsafe {
        asm!("in al, dx", out("al") v, in("dx") port, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Writes a 32-bit value to an I/O port.
pub fn outl(port: u16, v: u32) {
    // SAFETY: as for `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") v, options(nomem, nostack, preserves_flags))
    }
}

/// Reads a 32-bit value from an I/O port.
pub fn inl(port: u16) -> u32 {
    let v: u32;
    // SAFETY: as for `outb`.
    unsafe {
        asm!("in eax, dx", out("eax") v, in("dx") port, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Reads a 32-bit MMIO register at physical (= identity-mapped virtual) address `addr`.
///
/// # Safety
/// `addr` must be a 4-byte aligned device register or memory the caller may read.
pub unsafe fn mmio_read32(addr: u64) -> u32 {
    // SAFETY: the caller guarantees the address is readable; volatile keeps every access.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

/// Writes a 32-bit MMIO register.
///
/// # Safety
/// `addr` must be a 4-byte aligned device register or memory the caller may write.
pub unsafe fn mmio_write32(addr: u64, v: u32) {
    // SAFETY: the caller guarantees the address is writable; volatile keeps every access.
    unsafe { core::ptr::write_volatile(addr as *mut u32, v) }
}
