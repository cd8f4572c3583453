//! CPU set-up at entry, in assembly: the runtime prepares the machine at CPL0 (enables SSE, loads its own GDT with user segments and a TSS, builds the IDT) and then
//! runs the program at CPL3 with IOPL=3, so port I/O, MMIO, `cli`/`sti`, `rdtsc` and SSE all
//! work from the program.
//!
//! Why CPL3: under KVM on hosts without hardware virtualization (PVM, a pagetable-based KVM),
//! CPL0 code of a non-PVM guest goes through KVM's instruction emulator, which has no SSE and
//! is slow; CPL3 code runs natively there. For the same reason .bss is not cleared here: the
//! VMM guarantees RAM outside the image is zero (see `guest_abi::BootInfo`). On VMX/SVM hosts both run natively, so the choice
//! costs nothing. The CPL0 parts here use only instructions that emulator supports.
//!
//! Software interrupts from CPL3 are not delivered under PVM, so the program asks for CPL0
//! work with instructions that raise #GP at CPL3 on every host (`hlt`, and `in`/`out` where IOPL
//! is not honoured), which the #GP handler performs (see [`crate::idt`]). CPU exceptions are
//! caught at CPL0, which copies the frame (and CR2) and continues at CPL3 in the reporting
//! code on a separate stack.

use core::arch::{asm, global_asm};

/// Selectors of the runtime's GDT.
pub const KERNEL_CS: u16 = 0x08;
pub const KERNEL_DS: u16 = 0x10;
pub const USER_DS: u16 = 0x18 | 3;
pub const USER_CS: u16 = 0x20 | 3;
pub const TSS_SEL: u16 = 0x28;

/// Waits for an interrupt. `hlt` faults at CPL3 on every host; the #GP handler halts at CPL0
/// for the program (see [`crate::idt`]).
pub fn halt() {
    // SAFETY: hlt has no memory effects; the runtime's #GP handler performs it and returns.
    unsafe { asm!("hlt", options(nomem, nostack, preserves_flags)) };
}

global_asm!(
    r#"
    .section .text.boot, "ax"
    .global _start
_start:
    cli
    cld
    mov r12, rdi
    lea rsp, [rip + __kstack_top]

    mov rax, cr0
    and rax, ~(1 << 2)
    or rax, (1 << 1)
    mov cr0, rax
    mov rax, cr4
    or rax, (1 << 9) | (1 << 10)
    mov cr4, rax

    lea rax, [rip + __kstack_top]
    mov [rip + __tss + 4], rax
    mov word ptr [rip + __tss + 102], 104
    lea rax, [rip + __tss]
    mov rcx, rax
    and rcx, 0xffffff
    shl rcx, 16
    or rcx, 103
    mov rsi, 0x89
    shl rsi, 40
    or rcx, rsi
    mov rsi, rax
    shr rsi, 24
    and rsi, 0xff
    shl rsi, 56
    or rcx, rsi
    mov [rip + __gdt + 0x28], rcx
    shr rax, 32
    mov [rip + __gdt + 0x30], rax
    lgdt [rip + __gdt_ptr]
    push 0x08
    lea rax, [rip + 1f]
    push rax
    retfq
1:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov fs, ax
    mov gs, ax
    mov ax, 0x28
    ltr ax

    lea rsi, [rip + __isr_table]
    lea rdi, [rip + __idt]
    xor ecx, ecx
2:
    mov rax, [rsi + rcx * 8]
    mov r8, 0x00008e0000080000
    call 9f
    inc ecx
    cmp ecx, 32
    jb 2b
    lidt [rip + __idt_ptr]

    push 0x1b
    // As if entered by `call`: rsp ≡ 8 (mod 16) at the first instruction (SSE spills need it).
    lea rax, [rip + __stack_top - 8]
    push rax
    push 0x3002
    push 0x23
    lea rax, [rip + {start}]
    push rax
    mov rdi, r12
    iretq

    // Writes the gate for handler rax, type/selector bits r8, at IDT entry rcx (rdi = IDT).
9:
    mov rdx, rax
    and edx, 0xffff
    mov r9, rax
    shr r9, 16
    and r9, 0xffff
    shl r9, 48
    or rdx, r9
    or rdx, r8
    mov r9, rcx
    shl r9, 4
    mov [rdi + r9], rdx
    mov rdx, rax
    shr rdx, 32
    mov [rdi + r9 + 8], rdx
    ret

    .section .data
    .balign 16
__gdt:
    .quad 0
    .quad 0x00af9b000000ffff
    .quad 0x00cf93000000ffff
    .quad 0x00cff3000000ffff
    .quad 0x00affb000000ffff
    .quad 0, 0
__gdt_end:
    .balign 16
__gdt_ptr:
    .word __gdt_end - __gdt - 1
    .quad __gdt
    .balign 16
__idt_ptr:
    .word 256 * 16 - 1
    .quad __idt

    .section .bss
    .balign 16
    .global __tss
__tss:
    .skip 104
    .balign 4096
    .global __idt
__idt:
    .skip 256 * 16
    "#,
    start = sym crate::rt_start,
);
