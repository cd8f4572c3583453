//! The machine state a snapshot holds, and its encoding into (and decoding from) the state
//! file's sections: KVM's structures byte for byte as KVM reports them, counts and lengths
//! checked against fixed limits, every section fully consumed. Device sections are each
//! device's own ([`crate::persist::Persist`]); they are decoded here once to check them.

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use snapfmt::Id;

use super::format::{self, DecodeError, FileWriter, Reader, put_pod, tag};
use crate::persist::{self, DeviceSection, Persist};

/// Most MSRs saved per vCPU.
pub const MAX_MSRS: u32 = kvm_bindings::KVM_MAX_MSR_ENTRIES as u32;
/// Most vCPUs in a snapshot (the `--cpus` limit).
pub const MAX_VCPUS: u32 = 255;
/// Version of the VM section.
pub const VM_VERSION: u32 = 1;
/// Version of a vCPU section.
pub const VCPU_VERSION: u32 = 1;

/// One vCPU's state.
pub struct VcpuState {
    pub id: u32,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub xsave: kvm_xsave,
    pub xcrs: kvm_xcrs,
    pub debugregs: kvm_debugregs,
    pub lapic: kvm_lapic_state,
    pub mp_state: kvm_mp_state,
    pub events: kvm_vcpu_events,
    pub msrs: Vec<kvm_msr_entry>,
}

impl std::fmt::Debug for VcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuState")
            .field("id", &self.id)
            .field("rip", &format_args!("{:#x}", self.regs.rip))
            .field("msrs", &self.msrs.len())
            .finish_non_exhaustive()
    }
}

/// VM-wide KVM state.
#[derive(Clone)]
pub struct VmState {
    /// PIC master, PIC slave, IOAPIC (KVM_GET_IRQCHIP chip ids 0, 1, 2).
    pub irqchips: [kvm_irqchip; 3],
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
}

impl std::fmt::Debug for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmState")
            .field("clock", &self.clock.clock)
            .finish_non_exhaustive()
    }
}

/// Everything in the state file.
#[derive(Debug)]
pub struct MachineState {
    pub vm: VmState,
    pub vcpus: Vec<VcpuState>,
    /// Every device's section (UART, CMOS on Linux boots, PCI root, test device with
    /// `--testdev`, one per disk in the manifest's order), in file order.
    pub devices: Vec<DeviceSection>,
}

fn encode_vcpu(v: &VcpuState) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&v.id.to_le_bytes());
    put_pod(&mut out, &v.regs);
    put_pod(&mut out, &v.sregs);
    put_pod(&mut out, &v.xsave);
    put_pod(&mut out, &v.xcrs);
    put_pod(&mut out, &v.debugregs);
    put_pod(&mut out, &v.lapic);
    put_pod(&mut out, &v.mp_state);
    put_pod(&mut out, &v.events);
    out.extend_from_slice(&(v.msrs.len() as u32).to_le_bytes());
    for m in &v.msrs {
        put_pod(&mut out, m);
    }
    out
}

fn decode_vcpu(p: &[u8]) -> Result<VcpuState, DecodeError> {
    let mut r = Reader::new(p);
    let id = r.u32("vCPU id")?;
    let regs = r.pod("vCPU registers")?;
    let sregs = r.pod("vCPU special registers")?;
    let xsave = r.pod("vCPU XSAVE area")?;
    let xcrs: kvm_xcrs = r.pod("vCPU XCRs")?;
    if xcrs.nr_xcrs as usize > xcrs.xcrs.len() {
        return Err(DecodeError::Invalid {
            what: "vCPU XCRs",
            detail: format!("{} XCRs, at most {}", xcrs.nr_xcrs, xcrs.xcrs.len()),
        });
    }
    let debugregs = r.pod("vCPU debug registers")?;
    let lapic = r.pod("vCPU local APIC")?;
    let mp_state = r.pod("vCPU MP state")?;
    let events = r.pod("vCPU events")?;
    let n = r.count(
        "vCPU MSR count",
        std::mem::size_of::<kvm_msr_entry>(),
        MAX_MSRS,
    )?;
    let msrs = (0..n)
        .map(|_| r.pod("vCPU MSR"))
        .collect::<Result<Vec<kvm_msr_entry>, _>>()?;
    r.end("vCPU section")?;
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
        msrs,
    })
}

fn encode_vm(v: &VmState) -> Vec<u8> {
    let mut out = Vec::new();
    for c in &v.irqchips {
        put_pod(&mut out, c);
    }
    put_pod(&mut out, &v.pit);
    put_pod(&mut out, &v.clock);
    out
}

fn decode_vm(p: &[u8]) -> Result<VmState, DecodeError> {
    let mut r = Reader::new(p);
    let mut chip = |want: u32| -> Result<kvm_irqchip, DecodeError> {
        let c: kvm_irqchip = r.pod("irqchip")?;
        if c.chip_id != want {
            return Err(DecodeError::Invalid {
                what: "irqchip",
                detail: format!("chip id {}, expected {want}", c.chip_id),
            });
        }
        Ok(c)
    };
    let irqchips = [chip(0)?, chip(1)?, chip(2)?];
    let pit = r.pod("PIT")?;
    let clock = r.pod("KVM clock")?;
    r.end("VM section")?;
    Ok(VmState {
        irqchips,
        pit,
        clock,
    })
}

impl MachineState {
    /// The state file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = FileWriter::default();
        w.section(tag::VM, VM_VERSION, &encode_vm(&self.vm));
        for v in &self.vcpus {
            w.section(tag::VCPU, VCPU_VERSION, &encode_vcpu(v));
        }
        let mut devices: Vec<&DeviceSection> = self.devices.iter().collect();
        devices.sort_by_key(|d| order(d.id));
        for d in devices {
            w.section(d.id, d.version, &d.payload);
        }
        w.finish()
    }

    /// Whether there is a section `id`.
    pub fn has(&self, id: Id) -> bool {
        self.devices.iter().any(|d| d.id == id)
    }

    /// How many sections `id` there are (the disks').
    pub fn count(&self, id: Id) -> usize {
        self.devices.iter().filter(|d| d.id == id).count()
    }

    /// Device `T`'s state, if the file has its section.
    pub fn device<T: Persist>(&self) -> Result<Option<T::State>, DecodeError> {
        self.devices
            .iter()
            .find(|d| d.id == T::SECTION)
            .map(|d| persist::decode::<T>(d.version, &d.payload))
            .transpose()
    }

    /// Sets device `T`'s section to `state`.
    pub fn set_device<T: Persist>(&mut self, state: &T::State) {
        self.devices.retain(|d| d.id != T::SECTION);
        self.devices.push(DeviceSection {
            id: T::SECTION,
            version: T::VERSION,
            payload: persist::encode::<T>(state),
        });
    }

    /// Decodes a state file: every section present exactly as often as it must be (the VM
    /// section and the UART and PCI root once, at least one vCPU, ids 0..n in order, at most
    /// `disk::MAX_DISKS` disks, other devices at most once), every device section decoded by
    /// its device's codec.
    pub fn decode(file: &[u8]) -> Result<Self, DecodeError> {
        let mut vm = None;
        let mut vcpus = Vec::new();
        let mut devices: Vec<DeviceSection> = Vec::new();
        // Sections come in one order (that of `tag::ORDER`, vCPUs together), so that a state
        // has one encoding.
        let mut last = 0;
        for s in format::sections(file)? {
            let at = order(s.id);
            if at == usize::MAX {
                return Err(DecodeError::UnknownTag(s.name()));
            }
            if at < last {
                return Err(DecodeError::Invalid {
                    what: "state file",
                    detail: format!(
                        "section {} after section {}",
                        s.name(),
                        snapfmt::id_name(tag::ORDER[last])
                    ),
                });
            }
            let repeats = s.id == tag::VCPU || s.id == tag::DISK;
            if at == last && !repeats && (s.id != tag::VM || vm.is_some()) {
                return Err(DecodeError::Invalid {
                    what: "state file",
                    detail: format!("section {} appears twice", s.name()),
                });
            }
            last = at;
            match s.id {
                tag::VM => vm = Some(decode_vm(s.payload_v(VM_VERSION)?)?),
                tag::VCPU => {
                    let v = decode_vcpu(s.payload_v(VCPU_VERSION)?)?;
                    if v.id as usize != vcpus.len() || v.id >= MAX_VCPUS {
                        return Err(DecodeError::Invalid {
                            what: "vCPU section",
                            detail: format!("vCPU id {} where {} was due", v.id, vcpus.len()),
                        });
                    }
                    vcpus.push(v);
                }
                _ => {
                    let d = DeviceSection {
                        id: s.id,
                        version: s.version,
                        payload: s.payload.to_vec(),
                    };
                    persist::check_section(&d)?;
                    let disks = devices.iter().filter(|d| d.id == tag::DISK).count();
                    if d.id == tag::DISK && disks == crate::disk::MAX_DISKS {
                        return Err(DecodeError::Invalid {
                            what: "disk sections",
                            detail: format!("more than {}", crate::disk::MAX_DISKS),
                        });
                    }
                    devices.push(d);
                }
            }
        }
        let missing = |what: &'static str| DecodeError::Invalid {
            what,
            detail: "section missing".into(),
        };
        if vcpus.is_empty() {
            return Err(missing("vCPU section"));
        }
        let st = MachineState {
            vm: vm.ok_or_else(|| missing("VM section"))?,
            vcpus,
            devices,
        };
        if !st.has(tag::SERIAL) {
            return Err(missing("UART section"));
        }
        if !st.has(tag::PCI) {
            return Err(missing("PCI section"));
        }
        Ok(st)
    }
}

/// A section id's place in the file (`usize::MAX`: not a state file section).
fn order(id: Id) -> usize {
    tag::ORDER
        .iter()
        .position(|&t| t == id)
        .unwrap_or(usize::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::devices::serial::SerialDevice;
    use crate::devices::testdev::TestDev;
    use crate::linux::cmos::Cmos;
    use mmio::pci::{FunctionState, PciRoot, PciRootState};
    use vm_superio::serial::SerialState;
    use zerocopy::FromZeros;

    /// A state with one vCPU, two MSRs and one PCI function besides the bridge.
    pub(crate) fn sample() -> MachineState {
        let chip = |id| {
            let mut c = kvm_irqchip::new_zeroed();
            c.chip_id = id;
            c
        };
        let vm = VmState {
            irqchips: [chip(0), chip(1), chip(2)],
            pit: kvm_pit_state2::new_zeroed(),
            clock: kvm_clock_data {
                clock: 12345,
                ..Default::default()
            },
        };
        let mut regs = kvm_regs::new_zeroed();
        regs.rip = 0x10_0000;
        let vcpu = VcpuState {
            id: 0,
            regs,
            sregs: kvm_sregs::new_zeroed(),
            xsave: kvm_xsave::new_zeroed(),
            xcrs: kvm_xcrs::new_zeroed(),
            debugregs: kvm_debugregs::new_zeroed(),
            lapic: kvm_lapic_state::new_zeroed(),
            mp_state: kvm_mp_state::new_zeroed(),
            events: kvm_vcpu_events::new_zeroed(),
            msrs: vec![
                kvm_msr_entry {
                    index: 0x10,
                    data: 99,
                    ..Default::default()
                };
                2
            ],
        };
        let mut st = MachineState {
            vm,
            vcpus: vec![vcpu],
            devices: Vec::new(),
        };
        st.set_device::<SerialDevice>(&SerialState {
            in_buffer: b"ab".to_vec(),
            ..Default::default()
        });
        st.set_device::<Cmos>(&0x0b);
        st.set_device::<PciRoot>(&PciRootState {
            address: 0x8000_0810,
            functions: vec![FunctionState {
                devfn: 0,
                name: "host-bridge".into(),
                config: [7; 256],
            }],
        });
        st.set_device::<TestDev>(&(0x1234, 5));
        let disk = crate::disk::state::DiskState {
            regs: crate::disk::device::Regs {
                status: 0xf,
                driver_features: 1 << 32,
                device_features_sel: 0,
                driver_features_sel: 1,
                queue_sel: 0,
                interrupt_status: 1,
                config_generation: 0,
            },
            queue: virtio_queue::QueueState {
                max_size: crate::disk::device::QUEUE_SIZE,
                size: 128,
                next_avail: 3,
                next_used: 3,
                ready: true,
                desc_table: 0x1_0000,
                avail_ring: 0x1_1000,
                used_ring: 0x1_2000,
                ..Default::default()
            },
        };
        for _ in 0..2 {
            st.devices.push(DeviceSection {
                id: tag::DISK,
                version: 1,
                payload: persist::encode::<crate::disk::device::BlockDevice>(&disk),
            });
        }
        st
    }

    #[test]
    fn round_trip() {
        let s = sample();
        let f = s.encode();
        let d = MachineState::decode(&f).unwrap();
        assert_eq!(d.encode(), f);
        assert_eq!(d.vcpus[0].regs.rip, 0x10_0000);
        assert_eq!(d.vcpus[0].msrs.len(), 2);
        let serial = d.device::<SerialDevice>().unwrap().unwrap();
        assert_eq!(serial.in_buffer, b"ab");
        assert_eq!(d.device::<Cmos>().unwrap(), Some(0x0b));
        assert_eq!(
            d.device::<PciRoot>().unwrap(),
            s.device::<PciRoot>().unwrap()
        );
        assert_eq!(d.vm.clock.clock, 12345);
        assert_eq!(d.device::<TestDev>().unwrap(), Some((0x1234, 5)));
        assert_eq!(d.count(tag::DISK), 2);
        assert_eq!(d.devices, s.devices);
    }

    #[test]
    fn bad_sections_are_refused() {
        // A vCPU section claiming an absurd MSR count, checksummed correctly.
        let s = sample();
        let mut v = encode_vcpu(&s.vcpus[0]);
        let at = v.len() - 2 * std::mem::size_of::<kvm_msr_entry>() - 4;
        v[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut w = FileWriter::default();
        w.section(tag::VM, VM_VERSION, &encode_vm(&s.vm));
        w.section(tag::VCPU, VCPU_VERSION, &v);
        let e = MachineState::decode(&w.finish()).unwrap_err();
        assert!(e.to_string().contains("at most 256"), "{e}");
        let dev = |id| {
            s.devices
                .iter()
                .find(|d| d.id == id)
                .unwrap()
                .payload
                .clone()
        };
        // No vCPU at all; an unknown tag; a vCPU id out of order.
        let mut w = FileWriter::default();
        w.section(tag::VM, VM_VERSION, &encode_vm(&s.vm));
        w.section(tag::SERIAL, 1, &dev(tag::SERIAL));
        w.section(tag::PCI, 1, &dev(tag::PCI));
        assert!(MachineState::decode(&w.finish()).is_err());
        let mut w = FileWriter::default();
        w.section(*b"XXXX", 1, &[]);
        assert_eq!(
            MachineState::decode(&w.finish()).unwrap_err(),
            DecodeError::UnknownTag("XXXX".into())
        );
        let mut s2 = sample();
        s2.vcpus[0].id = 1;
        assert!(MachineState::decode(&s2.encode()).is_err());
        // Sections out of order.
        let mut w = FileWriter::default();
        w.section(tag::SERIAL, 1, &dev(tag::SERIAL));
        w.section(tag::VM, VM_VERSION, &encode_vm(&s.vm));
        let e = MachineState::decode(&w.finish()).unwrap_err();
        assert!(e.to_string().contains("after section UART"), "{e}");
        // A UART FIFO larger than the UART's; a CMOS index above 0x7f; a device section of
        // another version.
        let mut s3 = sample();
        s3.set_device::<SerialDevice>(&SerialState {
            in_buffer: vec![0; 65],
            ..Default::default()
        });
        assert!(MachineState::decode(&s3.encode()).is_err());
        let mut s4 = sample();
        s4.set_device::<Cmos>(&0x80);
        let e = MachineState::decode(&s4.encode()).unwrap_err();
        assert!(e.to_string().contains("not below 0x80"), "{e}");
        let mut s5 = sample();
        s5.devices.iter_mut().for_each(|d| d.version = 2);
        let e = MachineState::decode(&s5.encode()).unwrap_err();
        assert!(
            e.to_string()
                .contains("version 2; this build reads version 1"),
            "{e}"
        );
    }
}
