//! The local APIC, just enough to sleep on a device's MSI: gates for a device vector and a
//! timer vector whose CPL0 handlers send EOI, the APIC software-enabled, and a one-shot timer
//! as a backstop so [`wait`] never sleeps forever.

use core::arch::global_asm;
use core::sync::atomic::{AtomicBool, Ordering};

/// xAPIC registers (physical = identity-mapped virtual).
const BASE: u64 = 0xfee0_0000;
const TPR: u64 = 0x80;
const SVR: u64 = 0xf0;
const LVT_TIMER: u64 = 0x320;
const TIMER_INITIAL: u64 = 0x380;
const TIMER_DIVIDE: u64 = 0x3e0;

/// Vector of device interrupts (program the device's MSI data with it).
pub const DEVICE_VECTOR: u8 = 0x40;
/// Vector of the backstop timer.
pub const TIMER_VECTOR: u8 = 0x41;
/// Spurious-interrupt vector.
pub const SPURIOUS_VECTOR: u8 = 0xff;
/// Destination address of an MSI to APIC id 0.
pub const MSI_ADDRESS: u64 = 0xfee0_0000;

static ENABLED: AtomicBool = AtomicBool::new(false);

global_asm!(
    r#"
    .section .text
    .global __rt_irq_eoi
__rt_irq_eoi:
    push rax
    mov rax, 0xfee000b0
    mov dword ptr [rax], 0
    pop rax
    iretq
    .global __rt_irq_spurious
__rt_irq_spurious:
    iretq
    "#
);

unsafe extern "C" {
    fn __rt_irq_eoi();
    fn __rt_irq_spurious();
}

fn write(reg: u64, v: u32) {
    // SAFETY: the local APIC's MMIO page, identity-mapped (uncached) by the VMM.
    unsafe { crate::io::mmio_write32(BASE + reg, v) }
}

/// Installs the gates and software-enables the APIC (idempotent).
pub fn enable() {
    if ENABLED.swap(true, Ordering::Relaxed) {
        return;
    }
    crate::idt::set_gate(DEVICE_VECTOR, __rt_irq_eoi as *const () as u64);
    crate::idt::set_gate(TIMER_VECTOR, __rt_irq_eoi as *const () as u64);
    crate::idt::set_gate(SPURIOUS_VECTOR, __rt_irq_spurious as *const () as u64);
    write(TPR, 0);
    write(SVR, 0x100 | u32::from(SPURIOUS_VECTOR));
    write(TIMER_DIVIDE, 0xb);
    write(LVT_TIMER, 1 << 16);
}

/// Whether [`enable`] ran.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Sleeps (`hlt`) until an interrupt: the device's, or the backstop timer after about `ns`
/// (KVM's APIC timer counts nanoseconds at divide-by-1). A device interrupt that arrived
/// since interrupts were last open is delivered at once (`sti; hlt` in the #GP handler).
pub fn wait(ns: u64) {
    if !enabled() {
        core::hint::spin_loop();
        return;
    }
    write(LVT_TIMER, u32::from(TIMER_VECTOR));
    write(TIMER_INITIAL, ns.clamp(1000, u64::from(u32::MAX)) as u32);
    crate::cpu::halt();
}
