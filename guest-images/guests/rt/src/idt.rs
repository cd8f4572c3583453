//! An IDT for the 32 CPU exceptions: each stub records the vector (and a zero error code where
//! the CPU pushes none) and lands in [`rt_exception`], which prints what happened and exits.

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;

/// The frame the stubs build on the exception stack.
#[repr(C)]
#[derive(Debug)]
pub struct ExceptionFrame {
    pub vector: u64,
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

const NAMES: [&str; 32] = [
    "divide error", "debug", "NMI", "breakpoint", "overflow", "bound range", "invalid opcode",
    "device not available", "double fault", "coprocessor overrun", "invalid TSS",
    "segment not present", "stack fault", "general protection", "page fault", "reserved",
    "x87 FP", "alignment check", "machine check", "SIMD FP", "virtualization", "control protection",
    "reserved", "reserved", "reserved", "reserved", "reserved", "reserved", "hypervisor injection",
    "VMM communication", "security", "reserved",
];

extern "C" fn rt_exception(frame: &ExceptionFrame) -> ! {
    let name = NAMES.get(frame.vector as usize).copied().unwrap_or("?");
    let cr2: u64;
    // SAFETY: reading CR2 has no side effects.
    unsafe { asm!("mov {}, cr2", out(reg) cr2, options(nomem, nostack)) };
    crate::println!(
        "guest exception: #{} ({name}) at rip={:#x} error={:#x} cr2={cr2:#x} rsp={:#x}",
        frame.vector, frame.rip, frame.error, frame.rsp
    );
    crate::exit(guest_abi::exit_codes::EXCEPTION)
}

global_asm!(
    r#"
    .section .text
    .irp n, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31
isr_\n:
    push 0
    push \n
    jmp isr_common
    .endr
    .irp n, 8,10,11,12,13,14,17,21,29,30
isr_\n:
    push \n
    jmp isr_common
    .endr
isr_common:
    mov rdi, rsp
    and rsp, -16
    call {handler}
    ud2
    .section .rodata
    .balign 8
    .global __isr_table
__isr_table:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad isr_\n
    .endr
    "#,
    handler = sym rt_exception,
);

unsafe extern "C" {
    static __isr_table: [u64; 32];
}

#[repr(C, align(16))]
struct Idt(UnsafeCell<[u64; 64]>);

// SAFETY: written once by the boot vCPU before anything else runs.
unsafe impl Sync for Idt {}

static IDT: Idt = Idt(UnsafeCell::new([0; 64]));

#[repr(C, packed)]
struct Pointer {
    limit: u16,
    base: u64,
}

/// Installs the exception IDT.
pub(crate) fn init() {
    let cs: u16;
    // SAFETY: reading CS has no side effects.
    unsafe { asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack, preserves_flags)) };
    // SAFETY: only the boot vCPU runs this, once, before interrupts or exceptions can use the IDT.
    let idt = unsafe { &mut *IDT.0.get() };
    for v in 0..32 {
        // SAFETY: __isr_table is a 32-entry table of code addresses defined in the asm above.
        let handler = unsafe { __isr_table[v] };
        let low = (handler & 0xffff) | (u64::from(cs) << 16) | (0x8e << 40) | ((handler >> 16) & 0xffff) << 48;
        idt[2 * v] = low;
        idt[2 * v + 1] = handler >> 32;
    }
    let ptr = Pointer { limit: (32 * 16 - 1) as u16, base: idt.as_ptr() as u64 };
    // SAFETY: the table holds valid 64-bit interrupt gates for vectors 0..32 and lives forever.
    unsafe { asm!("lidt [{}]", in(reg) &ptr, options(readonly, nostack, preserves_flags)) };
}

/// Loads an empty IDT, so the next exception escalates to a triple fault (for tests of the
/// VMM's handling of a guest that crashes hard).
pub fn break_idt() {
    let ptr = Pointer { limit: 0, base: 0 };
    // SAFETY: deliberately makes every exception undeliverable; the caller wants a triple fault.
    unsafe { asm!("lidt [{}]", in(reg) &ptr, options(readonly, nostack, preserves_flags)) };
}
