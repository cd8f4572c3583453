//! Tests of channel quotas and shadow channel records (bind, reload, watched instance page).

mod common;

use common::*;
use shadow::{
    Aperture::{Sysmem, Vram},
    ChannelQuota, FaultKind, Pdb, Rule, ShadowChannel, ShadowError, WatchKey, WatchSet,
};

const INST: u64 = 0x30_0000;

#[test]
fn quota_maps_guest_ids_into_the_vm_range() {
    let q = ChannelQuota::new(4, 64..96).unwrap();
    assert_eq!(q.count(), 4);
    assert_eq!(q.phys_range(), 64..68);
    assert_eq!(q.phys(0), Ok(64));
    assert_eq!(q.phys(3), Ok(67));
    assert!(q.contains(3) && !q.contains(4));
    for id in [4, 32, u32::MAX] {
        let f = q.phys(id).unwrap_err();
        assert_eq!(
            (f.kind, f.rule, f.addr, f.info),
            (FaultKind::BadChannel, Rule::ChannelRange, 0, id)
        );
        assert_eq!(f.kind.code(), 13);
    }
    assert!(ChannelQuota::new(32, 0..32).is_ok());
    let (start, end) = (9, 3);
    assert!(ChannelQuota::new(2, start..end).is_err());
    for (n, r) in [(0, 0..8), (33, 0..64), (8, 0..7), (1, 5..5)] {
        assert!(
            matches!(ChannelQuota::new(n, r.clone()), Err(ShadowError::Config(_))),
            "{n} {r:?}"
        );
    }
}

#[test]
fn bind_reads_and_checks_the_instance() {
    let q = ChannelQuota::new(2, 10..12).unwrap();
    let l = layout();
    let mut m = mem();
    m.write(Vram, INST, &good_instance()).unwrap();
    let c = ShadowChannel::bind(&q, &m, &l, 1, INST).unwrap();
    assert_eq!((c.guest_id, c.phys_id, c.inst_addr), (1, 11, INST));
    assert_eq!(c.space_key, pdb());
    assert_eq!(c.instance.gpfifo_entries, 256);
    assert_eq!(c.inst_page, WatchKey::of(Vram, INST));
    let mut w = WatchSet::new();
    w.insert(c.inst_page);
    assert!(w.hits(Vram, INST + 0x10, 4));
    assert!(!w.hits(Sysmem, INST, 4));

    let f = ShadowChannel::bind(&q, &m, &l, 2, INST).unwrap_err();
    assert_eq!((f.kind, f.info), (FaultKind::BadChannel, 2));
    let f = ShadowChannel::bind(&q, &m, &l, 0, INST + 0x1000).unwrap_err();
    assert_eq!(
        (f.kind, f.rule, f.addr),
        (FaultKind::BadInstance, Rule::PdbTarget, INST + 0x1000)
    );
    let f = ShadowChannel::bind(&q, &m, &l, 0, VRAM).unwrap_err();
    assert_eq!(f.rule, Rule::InstanceOutsideVram);
}

#[test]
fn reload_follows_guest_writes() {
    let q = ChannelQuota::new(1, 0..1).unwrap();
    let l = layout();
    let mut m = mem();
    m.write(Vram, INST, &good_instance()).unwrap();
    let mut c = ShadowChannel::bind(&q, &m, &l, 0, INST).unwrap();
    // Same page directory, bigger ring: the channel stays in its space.
    m.write_u32(Vram, INST + 0x10, 1024).unwrap();
    assert_eq!(c.reload(&m, &l), Ok(false));
    assert_eq!(c.instance.gpfifo_entries, 1024);
    // New page directory in system memory: the channel moves.
    m.write_u64(Vram, INST, 0x8000 | 2).unwrap();
    assert_eq!(c.reload(&m, &l), Ok(true));
    assert_eq!(
        c.space_key,
        Pdb {
            aperture: Sysmem,
            addr: 0x8000
        }
    );
    // A broken instance block faults and leaves the record as it was.
    let before = c;
    m.write_u32(Vram, INST + 0x14, 7).unwrap();
    let f = c.reload(&m, &l).unwrap_err();
    assert_eq!(
        (f.kind, f.rule, f.info),
        (FaultKind::BadInstance, Rule::InstanceReserved, 0x14)
    );
    assert_eq!(c, before);
}
