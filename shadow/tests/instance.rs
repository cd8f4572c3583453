//! Tests of instance block validation: every rule of the spec's instance block table.

mod common;

use common::*;
use shadow::{Aperture, FaultKind, GuestFault, INSTANCE_BLOCK_SIZE, Instance, Pdb, Rule};

const INST: u64 = 0x20_0000;

fn parse(b: [u8; 32]) -> Result<Instance, GuestFault> {
    Instance::parse(&layout(), INST, &b)
}

fn rule_of(b: [u8; 32]) -> (FaultKind, Rule, u64, u32) {
    let f = parse(b).unwrap_err();
    (f.kind, f.rule, f.addr, f.info)
}

#[test]
fn fault_kind_codes_match_the_spec() {
    assert_eq!(FaultKind::Unmapped.code(), 1);
    assert_eq!(FaultKind::PteVramRange.code(), 3);
    assert_eq!(FaultKind::PteSysmemRange.code(), 4);
    assert_eq!(FaultKind::BadEntry.code(), 5);
    assert_eq!(FaultKind::BadInstance.code(), 6);
    assert_eq!(FaultKind::BadGpfifo.code(), 7);
    assert_eq!(FaultKind::BadChannel.code(), 13);
    assert_eq!(FaultKind::BadRunlist.code(), 15);
    assert_eq!(FaultKind::GpuLost.code(), 16);
    assert_eq!(FaultKind::ResourceLimit.code(), 17);
    for code in 1..=17 {
        assert_eq!(FaultKind::from_code(code).unwrap().code(), code);
    }
    assert_eq!(FaultKind::from_code(0), None);
    assert_eq!(FaultKind::from_code(18), None);
}

#[test]
fn good_instance_parses() {
    let i = parse(good_instance()).unwrap();
    assert_eq!(
        i,
        Instance {
            addr: INST,
            pdb: pdb(),
            gpfifo_base: VA,
            gpfifo_entries: 256,
            engine_ctx: VA + 64 * KIB,
        }
    );
    // Sysmem PDB, no context, smallest and largest rings.
    let b = instance_bytes(0x40_0000 | 2, VA + 8, 2, 0, 0);
    let i = parse(b).unwrap();
    assert_eq!(
        i.pdb,
        Pdb {
            aperture: Aperture::Sysmem,
            addr: 0x40_0000
        }
    );
    assert_eq!(i.engine_ctx, 0);
    assert!(parse(instance_bytes(PD | 1, VA, 65536, 0, 0)).is_ok());
}

#[test]
fn read_from_guest_vram() {
    let mut m = mem();
    m.write(Aperture::Vram, INST, &good_instance()).unwrap();
    let i = Instance::read(&m, &layout(), INST).unwrap();
    assert_eq!(i.gpfifo_entries, 256);
    // The last block of VRAM is fine.
    let last = VRAM - INSTANCE_BLOCK_SIZE;
    m.write(Aperture::Vram, last, &good_instance()).unwrap();
    assert_eq!(Instance::read(&m, &layout(), last).unwrap().addr, last);
}

#[test]
fn instance_address_rules() {
    let l = layout();
    let f = Instance::check_addr(&l, INST + 8).unwrap_err();
    assert_eq!(
        (f.kind, f.rule, f.addr),
        (FaultKind::BadInstance, Rule::InstanceMisaligned, INST + 8)
    );
    for addr in [VRAM, VRAM + 4096, !0xfffu64] {
        let f = Instance::read(&mem(), &l, addr).unwrap_err();
        assert_eq!(
            (f.kind, f.rule, f.addr),
            (FaultKind::BadInstance, Rule::InstanceOutsideVram, addr)
        );
    }
}

#[test]
fn pdb_target_rules() {
    for t in [0, 3] {
        assert_eq!(
            rule_of(instance_bytes(PD | t, VA, 256, 0, 0)),
            (FaultKind::BadInstance, Rule::PdbTarget, INST, 0)
        );
    }
    for bit in [2, 3, 4, 11] {
        assert_eq!(
            rule_of(instance_bytes(PD | 1 | 1 << bit, VA, 256, 0, 0)),
            (FaultKind::BadInstance, Rule::PdbReserved, INST, 0),
            "bit {bit}"
        );
    }
    let mut l = layout();
    l.sysmem = false;
    let f = Instance::parse(&l, INST, &instance_bytes(PD | 2, VA, 256, 0, 0)).unwrap_err();
    assert_eq!(
        (f.kind, f.rule),
        (FaultKind::BadInstance, Rule::SysmemUnsupported)
    );
}

#[test]
fn page_directory_must_fit() {
    // A 4 GiB window: 2048 PDEs, 16 KiB of page directory.
    let mut l = layout();
    l.va.size = 4 << 30;
    let p = |pdb| Instance::parse(&l, INST, &instance_bytes(pdb, VA, 256, 0, 0));
    assert!(p((VRAM - 16 * KIB) | 1).is_ok());
    let f = p((VRAM - 8 * KIB) | 1).unwrap_err();
    assert_eq!(
        (f.kind, f.rule),
        (FaultKind::BadInstance, Rule::PdOutsideVram)
    );
    assert_eq!(
        p(0xffff_ffff_ffff_f001).unwrap_err().rule,
        Rule::PdOutsideVram
    );
    // System memory: inside one region, not in a gap, not across two adjacent regions.
    assert!(p((16 * MIB - 16 * KIB) | 2).is_ok());
    for pdb in [
        16 * MIB - 8 * KIB,
        20 * MIB,
        35 * MIB - 8 * KIB,
        40 * MIB - 4 * KIB,
    ] {
        let f = p(pdb | 2).unwrap_err();
        assert_eq!(
            (f.kind, f.rule),
            (FaultKind::BadInstance, Rule::PdOutsideRam),
            "{pdb:#x}"
        );
    }
}

#[test]
fn gpfifo_rules() {
    let fifo = |gp, entries| rule_of(instance_bytes(PD | 1, gp, entries, 0, 0));
    assert_eq!(
        fifo(VA + 4, 256),
        (FaultKind::BadGpfifo, Rule::GpfifoMisaligned, INST, 0x08)
    );
    for entries in [0, 1, 3, 96, 131072, u32::MAX] {
        assert_eq!(
            fifo(VA, entries),
            (FaultKind::BadGpfifo, Rule::GpfifoEntries, INST, 0x10),
            "{entries}"
        );
    }
    // The ring must lie inside the VA window.
    let end = VA + VA_SIZE;
    assert!(parse(instance_bytes(PD | 1, end - 256 * 8, 256, 0, 0)).is_ok());
    for gp in [0, VA - 8, end - 255 * 8, end, u64::MAX - 7] {
        assert_eq!(
            fifo(gp, 256),
            (FaultKind::BadGpfifo, Rule::GpfifoOutsideWindow, INST, 0x08),
            "{gp:#x}"
        );
    }
}

#[test]
fn reserved_field_must_be_zero() {
    assert_eq!(
        rule_of(instance_bytes(PD | 1, VA, 256, 1 << 31, 0)),
        (FaultKind::BadInstance, Rule::InstanceReserved, INST, 0x14)
    );
}

#[test]
fn engine_ctx_rules() {
    let end = VA + VA_SIZE;
    assert!(parse(instance_bytes(PD | 1, VA, 256, 0, end - 4096)).is_ok());
    for ctx in [8, VA - 4096, end - 4095, end, u64::MAX] {
        assert_eq!(
            rule_of(instance_bytes(PD | 1, VA, 256, 0, ctx)),
            (
                FaultKind::BadInstance,
                Rule::EngineCtxOutsideWindow,
                INST,
                0x18
            ),
            "{ctx:#x}"
        );
    }
}
