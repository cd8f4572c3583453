//! The machine state a snapshot holds, and its encoding into (and decoding from) the state
//! file's sections: KVM's structures byte for byte as KVM reports them, counts and lengths
//! checked against fixed limits, every section fully consumed.

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use mmio::pci::{FunctionState, PciRootState};
use vm_superio::serial::SerialState;

use super::format::{self, DecodeError, FileWriter, Reader, put_pod, tag};

/// Most MSRs saved per vCPU.
pub const MAX_MSRS: u32 = kvm_bindings::KVM_MAX_MSR_ENTRIES as u32;
/// Most vCPUs in a snapshot (the `--cpus` limit).
pub const MAX_VCPUS: u32 = 255;
/// The UART's receive FIFO (vm-superio's).
pub const SERIAL_FIFO: u32 = 64;
/// Most PCI functions on bus 0.
const MAX_FUNCTIONS: u32 = 256;
/// Longest PCI function name.
const MAX_NAME: u32 = 64;

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
    pub serial: SerialState,
    /// The CMOS index register (Linux boots).
    pub cmos: Option<u8>,
    pub pci: PciRootState,
    /// The PCI test device's scratch and read-counter registers (`--testdev`).
    pub testdev: Option<(u32, u32)>,
    /// Each disk's device state (`crate::disk::state`'s bytes, decoded when the disk is
    /// rebuilt), in the manifest's order.
    pub disks: Vec<Vec<u8>>,
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

fn encode_serial(s: &SerialState) -> Vec<u8> {
    let mut out = vec![
        s.baud_divisor_low,
        s.baud_divisor_high,
        s.interrupt_enable,
        s.interrupt_identification,
        s.line_control,
        s.line_status,
        s.modem_control,
        s.modem_status,
        s.scratch,
    ];
    out.extend_from_slice(&(s.in_buffer.len() as u32).to_le_bytes());
    out.extend_from_slice(&s.in_buffer);
    out
}

fn decode_serial(p: &[u8]) -> Result<SerialState, DecodeError> {
    let mut r = Reader::new(p);
    let regs = r.bytes("UART registers", 9)?;
    let n = r.count("UART receive FIFO", 1, SERIAL_FIFO)?;
    let in_buffer = r.bytes("UART receive FIFO", n as usize)?.to_vec();
    r.end("UART section")?;
    Ok(SerialState {
        baud_divisor_low: regs[0],
        baud_divisor_high: regs[1],
        interrupt_enable: regs[2],
        interrupt_identification: regs[3],
        line_control: regs[4],
        line_status: regs[5],
        modem_control: regs[6],
        modem_status: regs[7],
        scratch: regs[8],
        in_buffer,
    })
}

fn encode_pci(s: &PciRootState) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&s.address.to_le_bytes());
    out.extend_from_slice(&(s.functions.len() as u32).to_le_bytes());
    for f in &s.functions {
        out.push(f.devfn);
        out.extend_from_slice(&(f.name.len() as u32).to_le_bytes());
        out.extend_from_slice(f.name.as_bytes());
        out.extend_from_slice(&f.config);
    }
    out
}

fn decode_pci(p: &[u8]) -> Result<PciRootState, DecodeError> {
    let mut r = Reader::new(p);
    let address = r.u32("PCI config address")?;
    let n = r.count("PCI functions", 1 + 4 + 256, MAX_FUNCTIONS)?;
    let mut functions = Vec::new();
    for _ in 0..n {
        let devfn = r.u8("PCI devfn")?;
        let len = r.count("PCI function name", 1, MAX_NAME)?;
        let name = std::str::from_utf8(r.bytes("PCI function name", len as usize)?)
            .map_err(|e| DecodeError::Invalid {
                what: "PCI function name",
                detail: e.to_string(),
            })?
            .to_owned();
        let mut config = [0u8; 256];
        config.copy_from_slice(r.bytes("PCI config space", 256)?);
        if functions
            .last()
            .is_some_and(|f: &FunctionState| f.devfn >= devfn)
        {
            return Err(DecodeError::Invalid {
                what: "PCI functions",
                detail: "not in ascending devfn order".into(),
            });
        }
        functions.push(FunctionState {
            devfn,
            name,
            config,
        });
    }
    r.end("PCI section")?;
    Ok(PciRootState { address, functions })
}

impl MachineState {
    /// The state file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = FileWriter::default();
        w.section(tag::VM, encode_vm(&self.vm));
        for v in &self.vcpus {
            w.section(tag::VCPU, encode_vcpu(v));
        }
        w.section(tag::SERIAL, encode_serial(&self.serial));
        if let Some(i) = self.cmos {
            w.section(tag::CMOS, vec![i]);
        }
        w.section(tag::PCI, encode_pci(&self.pci));
        if let Some((scratch, reads)) = self.testdev {
            let mut p = scratch.to_le_bytes().to_vec();
            p.extend_from_slice(&reads.to_le_bytes());
            w.section(tag::TESTDEV, p);
        }
        for d in &self.disks {
            w.section(tag::DISK, d.clone());
        }
        w.finish()
    }

    /// Decodes a state file: every section present exactly as often as it must be, vCPU ids
    /// 0..n in order.
    pub fn decode(file: &[u8]) -> Result<Self, DecodeError> {
        let mut vm = None;
        let mut vcpus = Vec::new();
        let mut serial = None;
        let mut cmos = None;
        let mut pci = None;
        let mut testdev = None;
        let mut disks = Vec::new();
        let dup = |what: &'static str| DecodeError::Invalid {
            what,
            detail: "section appears twice".into(),
        };
        // Sections come in one order (tags ascending, vCPUs together), so that a state has
        // one encoding.
        let mut last_tag = 0;
        for s in format::sections(file)? {
            if s.tag < last_tag {
                return Err(DecodeError::Invalid {
                    what: "state file",
                    detail: format!("section tag {} after tag {last_tag}", s.tag),
                });
            }
            last_tag = s.tag;
            match s.tag {
                tag::VM if vm.is_none() => vm = Some(decode_vm(s.payload)?),
                tag::VM => return Err(dup("VM section")),
                tag::VCPU => {
                    let v = decode_vcpu(s.payload)?;
                    if v.id as usize != vcpus.len() || v.id >= MAX_VCPUS {
                        return Err(DecodeError::Invalid {
                            what: "vCPU section",
                            detail: format!("vCPU id {} where {} was due", v.id, vcpus.len()),
                        });
                    }
                    vcpus.push(v);
                }
                tag::SERIAL if serial.is_none() => serial = Some(decode_serial(s.payload)?),
                tag::SERIAL => return Err(dup("UART section")),
                tag::CMOS if cmos.is_none() => match s.payload {
                    [i] if *i < 0x80 => cmos = Some(*i),
                    _ => {
                        return Err(DecodeError::Invalid {
                            what: "CMOS section",
                            detail: "not one index byte below 0x80".into(),
                        });
                    }
                },
                tag::CMOS => return Err(dup("CMOS section")),
                tag::PCI if pci.is_none() => pci = Some(decode_pci(s.payload)?),
                tag::PCI => return Err(dup("PCI section")),
                tag::TESTDEV if testdev.is_none() => {
                    let mut r = Reader::new(s.payload);
                    testdev = Some((r.u32("test device")?, r.u32("test device")?));
                    r.end("test device section")?;
                }
                tag::TESTDEV => return Err(dup("test device section")),
                tag::DISK if disks.len() < crate::disk::MAX_DISKS => disks.push(s.payload.to_vec()),
                tag::DISK => {
                    return Err(DecodeError::Invalid {
                        what: "disk sections",
                        detail: format!("more than {}", crate::disk::MAX_DISKS),
                    });
                }
                other => return Err(DecodeError::UnknownTag(other)),
            }
        }
        let missing = |what: &'static str| DecodeError::Invalid {
            what,
            detail: "section missing".into(),
        };
        if vcpus.is_empty() {
            return Err(missing("vCPU section"));
        }
        Ok(MachineState {
            vm: vm.ok_or_else(|| missing("VM section"))?,
            vcpus,
            serial: serial.ok_or_else(|| missing("UART section"))?,
            cmos,
            pci: pci.ok_or_else(|| missing("PCI section"))?,
            testdev,
            disks,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
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
        MachineState {
            vm,
            vcpus: vec![vcpu],
            serial: SerialState {
                in_buffer: b"ab".to_vec(),
                ..Default::default()
            },
            cmos: Some(0x0b),
            pci: PciRootState {
                address: 0x8000_0810,
                functions: vec![FunctionState {
                    devfn: 0,
                    name: "host-bridge".into(),
                    config: [7; 256],
                }],
            },
            testdev: Some((0x1234, 5)),
            disks: vec![vec![7; 3]],
        }
    }

    #[test]
    fn round_trip() {
        let s = sample();
        let f = s.encode();
        let d = MachineState::decode(&f).unwrap();
        assert_eq!(d.encode(), f);
        assert_eq!(d.vcpus[0].regs.rip, 0x10_0000);
        assert_eq!(d.vcpus[0].msrs.len(), 2);
        assert_eq!(d.serial.in_buffer, b"ab");
        assert_eq!(d.cmos, Some(0x0b));
        assert_eq!(d.pci, s.pci);
        assert_eq!(d.vm.clock.clock, 12345);
        assert_eq!(d.testdev, Some((0x1234, 5)));
        assert_eq!(d.disks, vec![vec![7u8; 3]]);
    }

    #[test]
    fn bad_sections_are_refused() {
        // A vCPU section claiming an absurd MSR count, checksummed correctly.
        let s = sample();
        let mut v = encode_vcpu(&s.vcpus[0]);
        let at = v.len() - 2 * std::mem::size_of::<kvm_msr_entry>() - 4;
        v[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut w = FileWriter::default();
        w.section(tag::VM, encode_vm(&s.vm));
        w.section(tag::VCPU, v);
        let e = MachineState::decode(&w.finish()).unwrap_err();
        assert!(e.to_string().contains("at most 256"), "{e}");
        // No vCPU at all; an unknown tag; a vCPU id out of order.
        let mut w = FileWriter::default();
        w.section(tag::VM, encode_vm(&s.vm));
        w.section(tag::SERIAL, encode_serial(&s.serial));
        w.section(tag::PCI, encode_pci(&s.pci));
        assert!(MachineState::decode(&w.finish()).is_err());
        let mut w = FileWriter::default();
        w.section(99, vec![]);
        assert_eq!(
            MachineState::decode(&w.finish()).unwrap_err(),
            DecodeError::UnknownTag(99)
        );
        let mut s2 = sample();
        s2.vcpus[0].id = 1;
        assert!(MachineState::decode(&s2.encode()).is_err());
        // Sections out of order.
        let mut w = FileWriter::default();
        w.section(tag::SERIAL, encode_serial(&s.serial));
        w.section(tag::VM, encode_vm(&s.vm));
        let e = MachineState::decode(&w.finish()).unwrap_err();
        assert!(e.to_string().contains("after tag 3"), "{e}");
        // A UART FIFO larger than the UART's.
        let mut s3 = sample();
        s3.serial.in_buffer = vec![0; 65];
        assert!(MachineState::decode(&s3.encode()).is_err());
    }
}
