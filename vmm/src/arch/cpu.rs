//! Register state for 64-bit entry, CPUID and local APIC set-up of each vCPU.

use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_fpu, kvm_regs, kvm_segment};
use kvm_ioctls::{Kvm, VcpuFd};

use super::tables::GDT;
use crate::layout::{
    BOOT_STACK_POINTER, CODE_SELECTOR, DATA_SELECTOR, GDT_ADDR, IDT_ADDR, PML4_ADDR, TSS_SELECTOR,
};

/// Errors setting up a vCPU.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("get supported CPUID: {0}")]
    GetCpuid(kvm_ioctls::Error),
    #[error("set CPUID: {0}")]
    SetCpuid(kvm_ioctls::Error),
    #[error("get/set special registers: {0}")]
    Sregs(kvm_ioctls::Error),
    #[error("set registers: {0}")]
    Regs(kvm_ioctls::Error),
    #[error("set FPU: {0}")]
    Fpu(kvm_ioctls::Error),
    #[error("get/set local APIC: {0}")]
    Lapic(kvm_ioctls::Error),
}

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// A segment register loaded from GDT entry `index`.
fn segment(index: u16, selector: u16) -> kvm_segment {
    let e = GDT[index as usize];
    kvm_segment {
        base: ((e >> 16) & 0xff_ffff) | ((e >> 32) & 0xff00_0000),
        limit: {
            let raw = ((e & 0xffff) | ((e >> 32) & 0xf_0000)) as u32;
            if (e >> 55) & 1 == 1 {
                (raw << 12) | 0xfff
            } else {
                raw
            }
        },
        selector,
        type_: ((e >> 40) & 0xf) as u8,
        present: ((e >> 47) & 1) as u8,
        dpl: ((e >> 45) & 3) as u8,
        db: ((e >> 54) & 1) as u8,
        s: ((e >> 44) & 1) as u8,
        l: ((e >> 53) & 1) as u8,
        g: ((e >> 55) & 1) as u8,
        avl: ((e >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

/// Puts the boot vCPU in 64-bit mode at `entry` with `rdi = arg` (paging through the identity
/// map, SSE enabled, interrupts off).
pub fn setup_boot_vcpu(vcpu: &VcpuFd, entry: u64, arg: u64) -> Result<(), CpuError> {
    let mut sregs = vcpu.get_sregs().map_err(CpuError::Sregs)?;
    let code = segment(1, CODE_SELECTOR);
    let data = segment(2, DATA_SELECTOR);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(3, TSS_SELECTOR);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.efer = EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(CpuError::Sregs)?;

    let regs = kvm_regs {
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rdi: arg,
        rflags: 0x2,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(CpuError::Regs)?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(CpuError::Fpu)
}

/// Gives vCPU `id` of `count` the host's supported CPUID with its own APIC id.
pub fn setup_cpuid(kvm: &Kvm, vcpu: &VcpuFd, id: u8, count: u8) -> Result<(), CpuError> {
    let mut cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(CpuError::GetCpuid)?;
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x00ff_ffff) | (u32::from(id) << 24);
                e.ebx = (e.ebx & 0xff00_ffff) | (u32::from(count) << 16);
                e.ecx |= 1 << 31; // running under a hypervisor
            }
            0xb | 0x1f => e.edx = u32::from(id),
            _ => {}
        }
    }
    vcpu.set_cpuid2(&cpuid).map_err(CpuError::SetCpuid)
}

/// Local APIC LINT0 = ExtINT (the PIC), LINT1 = NMI, as firmware leaves them.
pub fn setup_lapic(vcpu: &VcpuFd) -> Result<(), CpuError> {
    const LVT_LINT0: usize = 0x350;
    const LVT_LINT1: usize = 0x360;
    const DM_EXTINT: u32 = 0b111 << 8;
    const DM_NMI: u32 = 0b100 << 8;
    let mut lapic = vcpu.get_lapic().map_err(CpuError::Lapic)?;
    let mut set = |off: usize, mode: u32| {
        let bytes: Vec<u8> = lapic.regs[off..off + 4].iter().map(|b| *b as u8).collect();
        let v = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let v = (v & !(0b111 << 8) & !(1 << 16)) | mode;
        for (i, b) in v.to_le_bytes().iter().enumerate() {
            lapic.regs[off + i] = *b as _;
        }
    };
    set(LVT_LINT0, DM_EXTINT);
    set(LVT_LINT1, DM_NMI);
    vcpu.set_lapic(&lapic).map_err(CpuError::Lapic)
}
