//! x86-64 vCPU set-up for direct 64-bit entry: GDT, identity page tables, long-mode special
//! registers, CPUID, FPU/SSE state, and local APIC LINT wiring.

mod cpu;
mod tables;

pub use cpu::{CpuError, setup_boot_vcpu, setup_cpuid, setup_lapic};
pub use tables::write_boot_tables;
