//! The VM-wide KVM state: the in-kernel PICs and IOAPIC, the PIT and the KVM clock.

use kvm_bindings::kvm_irqchip;
use kvm_ioctls::VmFd;

use super::state::VmState;

/// Errors reading or writing the VM's KVM state.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {err}")]
pub struct VmStateError {
    pub what: &'static str,
    pub err: kvm_ioctls::Error,
}

fn err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmStateError {
    move |err| VmStateError { what, err }
}

/// Reads the VM's state (vCPUs paused).
pub fn capture(vm: &VmFd) -> Result<VmState, VmStateError> {
    let chip = |id: u32| -> Result<kvm_irqchip, VmStateError> {
        let mut c = kvm_irqchip {
            chip_id: id,
            ..Default::default()
        };
        vm.get_irqchip(&mut c).map_err(err("get irqchip"))?;
        Ok(c)
    };
    let irqchips = [chip(0)?, chip(1)?, chip(2)?];
    let pit = vm.get_pit2().map_err(err("get PIT"))?;
    let clock = vm.get_clock().map_err(err("get KVM clock"))?;
    Ok(VmState {
        irqchips,
        pit,
        clock,
    })
}

/// Loads `s` into a fresh VM with an in-kernel irqchip and PIT. The clock is set without its
/// flags (KVM_SET_CLOCK takes only KVM_CLOCK_REALTIME, which a snapshot does not use).
pub fn apply(vm: &VmFd, s: &VmState) -> Result<(), VmStateError> {
    vm.set_pit2(&s.pit).map_err(err("set PIT"))?;
    let mut clock = s.clock;
    clock.flags = 0;
    vm.set_clock(&clock).map_err(err("set KVM clock"))?;
    for c in &s.irqchips {
        vm.set_irqchip(c).map_err(err("set irqchip"))?;
    }
    Ok(())
}
