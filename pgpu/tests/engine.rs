//! Engine-level tests of the sim backend: windows, mappings through the `Engine` API, host
//! regions, VRAM access, host copies and error cases.

mod common;

use common::*;
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

fn map(
    e: &SimEngine,
    s: SpaceId,
    va: u64,
    len: u64,
    pa: u64,
    perm: Perm,
    ps: PageSize,
) -> Result<(), EngineError> {
    e.map(
        s,
        &Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm,
            page_size: ps,
        },
    )
}

#[test]
fn info_reports_configuration() {
    let e = engine();
    let i = e.info();
    assert_eq!(i.name, "sim");
    assert_eq!(i.vram_size, 64 * MIB);
    assert_eq!(i.page_sizes, vec![PageSize::Size4K, PageSize::Size2M]);
    assert_eq!(i.largest_page(), PageSize::Size2M);
}

#[test]
fn windows_are_validated() {
    let e = engine();
    let bad = [
        VaWindow {
            base: BASE,
            size: 0,
        },
        VaWindow {
            base: BASE + 4096,
            size: 2 * MIB,
        },
        VaWindow {
            base: BASE,
            size: 3 * MIB,
        },
        VaWindow {
            base: u64::MAX - 2 * MIB + 1 - (2 * MIB - 1),
            size: 4 * MIB,
        },
        VaWindow {
            base: 0,
            size: 1 << 41,
        },
    ];
    for w in bad {
        assert!(
            matches!(e.create_space(w), Err(EngineError::BadWindow { .. })),
            "{w:?}"
        );
    }
    let a = e
        .create_space(VaWindow {
            base: 0,
            size: 2 * MIB,
        })
        .unwrap();
    let b = e
        .create_space(VaWindow {
            base: 0,
            size: 2 * MIB,
        })
        .unwrap();
    assert_ne!(a, b);
    e.destroy_space(a).unwrap();
    assert_eq!(e.destroy_space(a), Err(EngineError::UnknownSpace(a)));
    assert_eq!(e.lookup(a, 0), Err(EngineError::UnknownSpace(a)));
}

#[test]
fn vram_maps_4k_and_2m_and_copies_go_through_them() {
    let e = engine();
    let s = space(&e);
    map(
        &e,
        s,
        BASE,
        0x2000,
        0x5000,
        Perm::ReadWrite,
        PageSize::Size4K,
    )
    .unwrap();
    map(
        &e,
        s,
        BASE + 2 * MIB,
        2 * MIB,
        4 * MIB,
        Perm::ReadWrite,
        PageSize::Size2M,
    )
    .unwrap();
    // Two 4K pages at PA 0x5000: a write across their boundary lands contiguously.
    e.copy_to_space(s, BASE + 0xffe, b"abcd").unwrap();
    let mut b = [0u8; 4];
    e.vram_read(0x5ffe, &mut b).unwrap();
    assert_eq!(&b, b"abcd");
    e.vram_write(4 * MIB + 123, b"xyz").unwrap();
    let mut b = [0u8; 3];
    e.copy_from_space(s, BASE + 2 * MIB + 123, &mut b).unwrap();
    assert_eq!(&b, b"xyz");
    let t = e.lookup(s, BASE + 2 * MIB + 123).unwrap().unwrap();
    assert_eq!(t.target, MapTarget::Vram { pa: 4 * MIB + 123 });
    assert_eq!(t.page_size, PageSize::Size2M);
    assert_eq!(
        e.lookup(s, BASE + 0x1001).unwrap().unwrap().target,
        MapTarget::Vram { pa: 0x6001 }
    );
    assert_eq!(e.lookup(s, BASE + 0x2000).unwrap(), None);
    assert_eq!(e.unmap(s, BASE, 4 * MIB).unwrap(), 0x2000 + 2 * MIB);
    let err = e.copy_from_space(s, BASE, &mut b).unwrap_err();
    let EngineError::CopyFault(f) = err else {
        panic!("{err:?}")
    };
    assert_eq!(
        (f.kind, f.va, f.access),
        (FaultKind::Unmapped, BASE, Some(AccessKind::Read))
    );
}

#[test]
fn read_only_and_out_of_window_faults_in_host_copies() {
    let e = engine();
    let s = space(&e);
    map(&e, s, BASE, 0x1000, 0, Perm::ReadOnly, PageSize::Size4K).unwrap();
    let mut b = [0u8; 8];
    e.copy_from_space(s, BASE, &mut b).unwrap();
    let EngineError::CopyFault(f) = e.copy_to_space(s, BASE + 8, b"no").unwrap_err() else {
        panic!()
    };
    assert_eq!(
        (f.kind, f.va, f.access),
        (FaultKind::ReadOnly, BASE + 8, Some(AccessKind::Write))
    );
    let EngineError::CopyFault(f) = e.copy_from_space(s, BASE - 8, &mut b).unwrap_err() else {
        panic!()
    };
    assert_eq!(f.kind, FaultKind::OutOfWindow);
    assert_eq!(
        e.copy_to_space(s, u64::MAX - 2, b"wrap"),
        Err(EngineError::BadCopy("range wraps around"))
    );
}

#[test]
fn bad_maps_are_rejected_and_leave_nothing() {
    let e = engine();
    let s = space(&e);
    let r = map(
        &e,
        s,
        BASE,
        0x2000,
        64 * MIB - 0x1000,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert!(
        matches!(
            r,
            Err(EngineError::BadMapping(MapError::TargetRange { .. }))
        ),
        "PA outside VRAM"
    );
    let r = map(
        &e,
        s,
        BASE + (1 << 30),
        0x1000,
        0,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert!(matches!(
        r,
        Err(EngineError::BadMapping(MapError::OutOfWindow { .. }))
    ));
    map(&e, s, BASE, 0x1000, 0, Perm::ReadWrite, PageSize::Size4K).unwrap();
    let r = map(
        &e,
        s,
        BASE,
        0x1000,
        0x1000,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert_eq!(r, Err(EngineError::BadMapping(MapError::Overlap(BASE))));
    assert_eq!(
        e.lookup(s, BASE).unwrap().unwrap().target,
        MapTarget::Vram { pa: 0 },
        "not replaced"
    );
    let r = e.map(
        s,
        &Mapping {
            va: BASE + 0x1000,
            len: 0x1000,
            target: MapTarget::Host {
                region: HostRegionId(99),
                offset: 0,
            },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size4K,
        },
    );
    assert_eq!(r, Err(EngineError::UnknownHostRegion(HostRegionId(99))));
    let bogus = SpaceId(12345);
    assert_eq!(
        map(
            &e,
            bogus,
            BASE,
            0x1000,
            0,
            Perm::ReadWrite,
            PageSize::Size4K
        ),
        Err(EngineError::UnknownSpace(bogus))
    );
    assert_eq!(
        e.vram_write(64 * MIB - 1, b"ab"),
        Err(EngineError::VramRange {
            pa: 64 * MIB - 1,
            len: 2
        })
    );
    let r = e.vram_fill(63 * MIB, 2 * MIB, 0);
    assert_eq!(
        r,
        Err(EngineError::VramRange {
            pa: 63 * MIB,
            len: 2 * MIB
        })
    );
    e.vram_write(5 * MIB, b"secret").unwrap();
    e.vram_fill(5 * MIB + 1, 4, 0).unwrap();
    let mut b = [0u8; 6];
    e.vram_read(5 * MIB, &mut b).unwrap();
    assert_eq!(&b, b"s\0\0\0\0t");
}

#[test]
fn engine_with_only_2m_pages_rejects_4k() {
    let cfg = SimConfig {
        vram_size: 8 * MIB,
        workers: 1,
        page_sizes: vec![PageSize::Size2M],
        ..SimConfig::default()
    };
    let e = SimEngine::new(cfg).unwrap();
    let s = space(&e);
    let r = map(&e, s, BASE, 0x1000, 0, Perm::ReadWrite, PageSize::Size4K);
    assert_eq!(
        r,
        Err(EngineError::BadMapping(MapError::UnsupportedPageSize(
            PageSize::Size4K
        )))
    );
    map(&e, s, BASE, 2 * MIB, 0, Perm::ReadWrite, PageSize::Size2M).unwrap();
}

#[test]
fn host_regions_map_copy_and_refuse_unregister_while_mapped() {
    let e = engine();
    let s = space(&e);
    let ram = HostBuf::new(4 * MIB as usize);
    // SAFETY: `ram` outlives the registration (unregistered below before it drops).
    let r = unsafe { e.register_host_region(ram.ptr(), ram.len()) }.unwrap();
    // SAFETY: invalid arguments are rejected before anything is kept.
    let bad = unsafe { e.register_host_region(ram.ptr().wrapping_add(1), 4096) };
    assert!(matches!(bad, Err(EngineError::BadHostRegion(_))));
    let m = |va, offset, len, ps| Mapping {
        va,
        len,
        target: MapTarget::Host { region: r, offset },
        perm: Perm::ReadWrite,
        page_size: ps,
    };
    e.map(s, &m(BASE, 0x3000, 0x1000, PageSize::Size4K))
        .unwrap();
    e.map(s, &m(BASE + 2 * MIB, 2 * MIB, 2 * MIB, PageSize::Size2M))
        .unwrap();
    assert!(matches!(
        e.map(s, &m(BASE + 8 * MIB, 4 * MIB, 2 * MIB, PageSize::Size2M)),
        Err(EngineError::BadMapping(MapError::TargetRange { .. }))
    ));
    e.copy_to_space(s, BASE + 5, b"guest").unwrap();
    assert_eq!(ram.read(0x3005, 5), b"guest");
    ram.write(2 * MIB as usize + 77, b"ram!");
    let mut b = [0u8; 4];
    e.copy_from_space(s, BASE + 2 * MIB + 77, &mut b).unwrap();
    assert_eq!(&b, b"ram!");
    assert_eq!(
        e.lookup(s, BASE + 7).unwrap().unwrap().target,
        MapTarget::Host {
            region: r,
            offset: 0x3007
        }
    );
    assert_eq!(
        e.unregister_host_region(r),
        Err(EngineError::HostRegionInUse(r))
    );
    e.unmap(s, BASE, 0x1000).unwrap();
    assert_eq!(
        e.unregister_host_region(r),
        Err(EngineError::HostRegionInUse(r))
    );
    e.unmap(s, BASE + 2 * MIB, 2 * MIB).unwrap();
    e.unregister_host_region(r).unwrap();
    assert_eq!(
        e.unregister_host_region(r),
        Err(EngineError::UnknownHostRegion(r))
    );
}

#[test]
fn host_region_limit() {
    let cfg = SimConfig {
        vram_size: 2 * MIB,
        workers: 1,
        limits: EngineLimits {
            max_host_regions: 1,
            ..EngineLimits::default()
        },
        ..SimConfig::default()
    };
    let a = HostBuf::new(4096);
    let e = SimEngine::new(cfg).unwrap();
    // SAFETY: `a` outlives the engine (declared first, dropped last).
    let _r = unsafe { e.register_host_region(a.ptr(), a.len()) }.unwrap();
    // SAFETY: as above.
    let r2 = unsafe { e.register_host_region(a.ptr(), a.len()) };
    assert_eq!(r2, Err(EngineError::TooMany("host regions")));
}

#[test]
fn engines_on_partitions_of_shared_vram_are_confined_to_them() {
    use pgpu::sim::vram::VramRegion;
    let daemon = VramRegion::shared(8 * MIB).unwrap();
    let fd = daemon.fd().unwrap();
    let cfg = || SimConfig {
        workers: 1,
        ..SimConfig::default()
    };
    let vm0 = SimEngine::with_vram(cfg(), VramRegion::from_fd(fd, 0, 4 * MIB).unwrap()).unwrap();
    let vm1 =
        SimEngine::with_vram(cfg(), VramRegion::from_fd(fd, 4 * MIB, 4 * MIB).unwrap()).unwrap();
    assert_eq!(vm1.info().vram_size, 4 * MIB);
    let s0 = space(&vm0);
    let s1 = space(&vm1);
    for (e, s) in [(&vm0, s0), (&vm1, s1)] {
        let m = Mapping {
            va: BASE,
            len: 4 * MIB,
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        };
        e.map(s, &m).unwrap();
    }
    vm0.copy_to_space(s0, BASE + 8, b"zero").unwrap();
    vm1.copy_to_space(s1, BASE + 8, b"one!").unwrap();
    let mut b = [0u8; 4];
    daemon.read(8, &mut b).unwrap();
    assert_eq!(&b, b"zero");
    daemon.read(4 * MIB + 8, &mut b).unwrap();
    assert_eq!(&b, b"one!");
    // A VM's engine cannot name physical memory past its partition.
    let m = Mapping {
        va: BASE + 4 * MIB,
        len: 2 * MIB,
        target: MapTarget::Vram { pa: 4 * MIB },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size2M,
    };
    assert!(matches!(
        vm0.map(s0, &m),
        Err(EngineError::BadMapping(MapError::TargetRange { .. }))
    ));
}

#[test]
fn map_batch_is_all_or_nothing() {
    let e = engine();
    let s = space(&e);
    let m = |va, pa, ps| Mapping {
        va,
        len: PageSize::bytes(ps),
        target: MapTarget::Vram { pa },
        perm: Perm::ReadWrite,
        page_size: ps,
    };
    map(
        &e,
        s,
        BASE + 8 * MIB,
        0x1000,
        0,
        Perm::ReadOnly,
        PageSize::Size4K,
    )
    .unwrap();
    let batch = [
        m(BASE, 0, PageSize::Size4K),
        m(BASE + 2 * MIB, 2 * MIB, PageSize::Size2M),
        m(BASE + 8 * MIB, 0x1000, PageSize::Size4K), // overlaps the existing page
    ];
    let r = e.map_batch(s, &batch);
    let Err(EngineError::BatchEntry { index, source }) = r else {
        panic!("{r:?}")
    };
    assert_eq!(index, 2);
    assert_eq!(
        *source,
        EngineError::BadMapping(MapError::Overlap(BASE + 8 * MIB))
    );
    assert_eq!(e.lookup(s, BASE).unwrap(), None, "first entry undone");
    assert_eq!(
        e.lookup(s, BASE + 2 * MIB).unwrap(),
        None,
        "second entry undone"
    );
    assert!(
        e.lookup(s, BASE + 8 * MIB).unwrap().is_some(),
        "what was there stays"
    );
    // Duplicates inside one batch are refused too.
    let r = e.map_batch(
        s,
        &[
            m(BASE, 0, PageSize::Size4K),
            m(BASE, 0x1000, PageSize::Size4K),
        ],
    );
    assert!(matches!(r, Err(EngineError::BatchEntry { index: 1, .. })));
    assert_eq!(e.lookup(s, BASE).unwrap(), None);
    let bad_target = Mapping {
        target: MapTarget::Vram { pa: 64 * MIB },
        ..m(BASE, 0, PageSize::Size4K)
    };
    assert!(matches!(
        e.map_batch(s, &[bad_target]),
        Err(EngineError::BatchEntry { index: 0, .. })
    ));
    e.map_batch(s, &batch[..2]).unwrap();
    assert!(e.lookup(s, BASE + 3 * MIB).unwrap().is_some());
}

#[test]
fn engine_allocated_host_regions_back_guest_ram() {
    let e = engine();
    let s = space(&e);
    assert!(matches!(
        e.alloc_host_region(4096),
        Err(EngineError::BadHostRegion(_))
    ));
    let (r, ptr) = e.alloc_host_region(2 * MIB).unwrap();
    let m = Mapping {
        va: BASE,
        len: 2 * MIB,
        target: MapTarget::Host {
            region: r,
            offset: 0,
        },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size2M,
    };
    e.map(s, &m).unwrap();
    e.copy_to_space(s, BASE + 40, b"gpu wrote").unwrap();
    // SAFETY: the region is registered and 2 MiB long; no job runs meanwhile.
    let seen = unsafe { std::slice::from_raw_parts(ptr.as_ptr().add(40), 9) };
    assert_eq!(seen, b"gpu wrote");
    assert_eq!(
        e.unregister_host_region(r),
        Err(EngineError::HostRegionInUse(r))
    );
    e.unmap(s, BASE, 2 * MIB).unwrap();
    e.unregister_host_region(r).unwrap();
}
