//! CPU exceptions: one stub per vector records the vector (and a zero error code where the
//! CPU pushes none); the common CPL0 part saves the frame and CR2, then continues at CPL3 in
//! [`rt_exception`] on the exception stack, which prints what happened and exits.

use core::arch::global_asm;

/// What the CPL0 part saves for [`rt_exception`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ExceptionFrame {
    pub vector: u64,
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
    pub cr2: u64,
}

const NAMES: [&str; 32] = [
    "divide error",
    "debug",
    "NMI",
    "breakpoint",
    "overflow",
    "bound range",
    "invalid opcode",
    "device not available",
    "double fault",
    "coprocessor overrun",
    "invalid TSS",
    "segment not present",
    "stack fault",
    "general protection",
    "page fault",
    "reserved",
    "x87 FP",
    "alignment check",
    "machine check",
    "SIMD FP",
    "virtualization",
    "control protection",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "hypervisor injection",
    "VMM communication",
    "security",
    "reserved",
];

extern "C" fn rt_exception(frame: &ExceptionFrame) -> ! {
    let name = NAMES.get(frame.vector as usize).copied().unwrap_or("?");
    crate::println!(
        "guest exception: #{} ({name}) at rip={:#x} error={:#x} cr2={:#x} rsp={:#x} cpl={}",
        frame.vector,
        frame.rip,
        frame.error,
        frame.cr2,
        frame.rsp,
        frame.cs & 3
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
    .irp n, 8,10,11,12,14,17,21,29,30
isr_\n:
    push \n
    jmp isr_common
    .endr
    // #GP: `hlt` from CPL3 (always privileged), or an `in`/`out` through DX from CPL3 on hosts
    // that do not honour IOPL for the guest (PVM): perform it here at CPL0 and step over it.
    // Anything else is reported.
isr_13:
    push r8
    push r9
    mov r8, [rsp + 24]
    movzx r9d, byte ptr [r8]
    cmp r9d, 0x66
    jne 61f
    movzx r9d, byte ptr [r8 + 1]
    cmp r9d, 0xed
    je 66f
    cmp r9d, 0xef
    je 67f
    jmp 69f
61:
    cmp r9d, 0xec
    je 62f
    cmp r9d, 0xed
    je 63f
    cmp r9d, 0xee
    je 64f
    cmp r9d, 0xef
    je 65f
    cmp r9d, 0xf4
    je 68f
69:
    pop r9
    pop r8
    push 13
    jmp isr_common
62:
    in al, dx
    jmp 70f
63:
    in eax, dx
    jmp 70f
64:
    out dx, al
    jmp 70f
65:
    out dx, eax
    jmp 70f
68:
    sti
    hlt
    cli
    jmp 70f
66:
    in ax, dx
    jmp 71f
67:
    out dx, ax
    jmp 71f
70:
    add qword ptr [rsp + 24], 1
    jmp 72f
71:
    add qword ptr [rsp + 24], 2
72:
    pop r9
    pop r8
    add rsp, 8
    iretq

isr_common:
    lea rdi, [rip + __exc_frame]
    mov rcx, 7
    mov rsi, rsp
    rep movsq
    mov rax, cr2
    mov [rip + __exc_frame + 56], rax
    push 0x1b
    lea rax, [rip + __exc_stack_top - 8]
    push rax
    push 0x3002
    push 0x23
    lea rax, [rip + {handler}]
    push rax
    lea rdi, [rip + __exc_frame]
    iretq

    .section .rodata
    .balign 8
    .global __isr_table
__isr_table:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad isr_\n
    .endr

    .section .bss
    .balign 16
__exc_frame:
    .skip 64
    "#,
    handler = sym rt_exception,
);

unsafe extern "C" {
    static mut __tss: [u8; 104];
    static mut __idt: [u64; 512];
}

/// Points IDT vector `vector` at `handler` (an interrupt gate to CPL0 code in the kernel code
/// segment). The IDT is in ordinary (user-accessible) memory, so the program can do this.
pub fn set_gate(vector: u8, handler: u64) {
    let low = (handler & 0xffff)
        | u64::from(crate::cpu::KERNEL_CS) << 16
        | 0x8e << 40
        | ((handler >> 16) & 0xffff) << 48;
    let i = usize::from(vector) * 2;
    // SAFETY: the runtime's IDT (256 16-byte gates) in .bss; only whole gates are written and
    // no other code touches it after start-up.
    unsafe {
        let idt = (&raw mut __idt).cast::<u64>();
        core::ptr::write_volatile(idt.add(i + 1), handler >> 32);
        core::ptr::write_volatile(idt.add(i), low);
    }
}

/// Makes the CPU shut down: points the TSS's ring-0 stack at unmapped memory and raises an
/// exception, which cannot be delivered (#DF cannot either): a triple fault. For tests of how
/// the VMM reports a guest that crashes hard.
pub fn triple_fault() -> ! {
    const UNMAPPED: u64 = 0x7f_0000_0000;
    // SAFETY: the TSS is the runtime's own; corrupting RSP0 is the point, the VM ends here.
    unsafe {
        core::ptr::write_volatile((&raw mut __tss).cast::<u8>().add(4).cast::<u64>(), UNMAPPED);
        core::arch::asm!("ud2", options(noreturn));
    }
}
