//! One vCPU's state to and from KVM, and the list of MSRs worth saving: KVM's
//! KVM_GET_MSR_INDEX_LIST less those this KVM refuses to read for a vCPU (PVM, for one, lists
//! MSRs it does not let userspace read). The order of the set calls is Firecracker's.

use kvm_bindings::{Msrs, kvm_msr_entry};
use kvm_ioctls::{Kvm, VcpuFd};

use super::state::{MAX_MSRS, VcpuState};

/// Errors reading or writing a vCPU's state.
#[derive(Debug, thiserror::Error)]
pub enum CpuStateError {
    #[error("vCPU {id}: {what}: {err}")]
    Kvm {
        id: u32,
        what: &'static str,
        err: kvm_ioctls::Error,
    },
    #[error("vCPU {id}: KVM refused MSR {index:#x} = {data:#x} ({set} of {total} MSRs set)")]
    MsrRefused {
        id: u32,
        index: u32,
        data: u64,
        set: usize,
        total: usize,
    },
    #[error("vCPU {id}: {n} MSRs is more than the {MAX_MSRS} supported")]
    TooManyMsrs { id: u32, n: usize },
}

fn kvm_err(id: u32, what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> CpuStateError {
    move |err| CpuStateError::Kvm { id, what, err }
}

/// The MSRs KVM says a VMM should save, less those `vcpu` cannot read; also returns the
/// refused ones (for the log and docs/snapshot.md).
pub fn saveable_msrs(kvm: &Kvm, vcpu: &VcpuFd) -> Result<(Vec<u32>, Vec<u32>), CpuStateError> {
    let list = kvm.get_msr_index_list().map_err(|err| CpuStateError::Kvm {
        id: 0,
        what: "KVM_GET_MSR_INDEX_LIST",
        err,
    })?;
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for &index in list.as_slice() {
        let mut one = msrs_of(&[index], 0)?;
        match vcpu.get_msrs(&mut one) {
            Ok(1) => ok.push(index),
            _ => refused.push(index),
        }
    }
    Ok((ok, refused))
}

fn msrs_of(indices: &[u32], id: u32) -> Result<Msrs, CpuStateError> {
    let entries: Vec<kvm_msr_entry> = indices
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    Msrs::from_entries(&entries).map_err(|_| CpuStateError::TooManyMsrs {
        id,
        n: indices.len(),
    })
}

/// Reads vCPU `id`'s state (the vCPU is out of KVM_RUN with its last exit completed).
pub fn capture(vcpu: &VcpuFd, id: u32, msr_list: &[u32]) -> Result<VcpuState, CpuStateError> {
    let mp_state = vcpu.get_mp_state().map_err(kvm_err(id, "get MP state"))?;
    let regs = vcpu.get_regs().map_err(kvm_err(id, "get registers"))?;
    let sregs = vcpu
        .get_sregs()
        .map_err(kvm_err(id, "get special registers"))?;
    let xsave = vcpu.get_xsave().map_err(kvm_err(id, "get XSAVE"))?;
    let xcrs = vcpu.get_xcrs().map_err(kvm_err(id, "get XCRs"))?;
    let debugregs = vcpu
        .get_debug_regs()
        .map_err(kvm_err(id, "get debug registers"))?;
    let lapic = vcpu.get_lapic().map_err(kvm_err(id, "get local APIC"))?;
    let mut msrs = msrs_of(msr_list, id)?;
    let n = vcpu.get_msrs(&mut msrs).map_err(kvm_err(id, "get MSRs"))?;
    if n != msr_list.len() {
        let index = msr_list.get(n).copied().unwrap_or(0);
        return Err(CpuStateError::Kvm {
            id,
            what: if index == 0 { "get MSRs" } else { "get an MSR" },
            err: kvm_ioctls::Error::new(libc::EIO),
        });
    }
    let events = vcpu
        .get_vcpu_events()
        .map_err(kvm_err(id, "get vCPU events"))?;
    Ok(VcpuState {
        id,
        regs,
        sregs,
        xsave,
        xcrs,
        debugregs,
        lapic,
        mp_state,
        events,
        msrs: msrs.as_slice().to_vec(),
    })
}

/// Loads `s` into a fresh vCPU that already has its CPUID.
pub fn apply(vcpu: &VcpuFd, s: &VcpuState) -> Result<(), CpuStateError> {
    let id = s.id;
    vcpu.set_mp_state(s.mp_state)
        .map_err(kvm_err(id, "set MP state"))?;
    vcpu.set_regs(&s.regs)
        .map_err(kvm_err(id, "set registers"))?;
    vcpu.set_sregs(&s.sregs)
        .map_err(kvm_err(id, "set special registers"))?;
    // SAFETY: a legacy 4 KiB kvm_xsave (no trailing FAM entries), which is all KVM reads.
    unsafe { vcpu.set_xsave(&s.xsave) }.map_err(kvm_err(id, "set XSAVE"))?;
    vcpu.set_xcrs(&s.xcrs).map_err(kvm_err(id, "set XCRs"))?;
    vcpu.set_debug_regs(&s.debugregs)
        .map_err(kvm_err(id, "set debug registers"))?;
    vcpu.set_lapic(&s.lapic)
        .map_err(kvm_err(id, "set local APIC"))?;
    if s.msrs.len() > MAX_MSRS as usize {
        return Err(CpuStateError::TooManyMsrs {
            id,
            n: s.msrs.len(),
        });
    }
    let msrs = Msrs::from_entries(&s.msrs).map_err(|_| CpuStateError::TooManyMsrs {
        id,
        n: s.msrs.len(),
    })?;
    let set = vcpu.set_msrs(&msrs).map_err(kvm_err(id, "set MSRs"))?;
    if set != s.msrs.len() {
        let m = s.msrs[set];
        return Err(CpuStateError::MsrRefused {
            id,
            index: m.index,
            data: m.data,
            set,
            total: s.msrs.len(),
        });
    }
    vcpu.set_vcpu_events(&s.events)
        .map_err(kvm_err(id, "set vCPU events"))?;
    Ok(())
}
