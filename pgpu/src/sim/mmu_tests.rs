//! Unit tests of the sim MMU page table.

use super::*;

const BASE: u64 = 0x4_0000_0000;
const MIB: u64 = 1 << 20;

fn mmu() -> Mmu {
    Mmu::new(VaWindow {
        base: BASE,
        size: 4 << 30,
    })
}

fn vram() -> TargetMem {
    // A fake, never dereferenced host range: the MMU only does arithmetic on it.
    TargetMem {
        slot: 0,
        host_base: 0x7000_0000_0000,
        size: 64 * MIB,
    }
}

#[test]
fn map_4k_translate_and_page_rest() {
    let mut m = mmu();
    m.map(
        BASE + 0x3000,
        0x2000,
        vram(),
        0x10000,
        Perm::ReadWrite,
        PageSize::Size4K,
    )
    .unwrap();
    let (h, rest) = m.translate(BASE + 0x3010, AccessKind::Read).unwrap();
    assert_eq!(h, 0x7000_0000_0000 + 0x10010);
    assert_eq!(rest, 0x1000 - 0x10);
    let (h, rest) = m.translate(BASE + 0x4ff8, AccessKind::Write).unwrap();
    assert_eq!(h, 0x7000_0000_0000 + 0x11ff8);
    assert_eq!(rest, 8);
    assert_eq!(
        m.translate(BASE + 0x5000, AccessKind::Read),
        Err(FaultKind::Unmapped)
    );
    assert_eq!(
        m.translate(BASE + 0x2fff, AccessKind::Read),
        Err(FaultKind::Unmapped)
    );
    assert_eq!(m.mapped_bytes(), 0x2000);
}

#[test]
fn map_2m_translate() {
    let mut m = mmu();
    m.map(
        BASE + 2 * MIB,
        4 * MIB,
        vram(),
        8 * MIB,
        Perm::ReadOnly,
        PageSize::Size2M,
    )
    .unwrap();
    let (h, rest) = m.translate(BASE + 5 * MIB + 7, AccessKind::Read).unwrap();
    assert_eq!(h as u64, 0x7000_0000_0000 + 11 * MIB + 7);
    assert_eq!(rest as u64, MIB - 7);
    let r = m.resolve(BASE + 3 * MIB).unwrap();
    assert_eq!(r.page_size, PageSize::Size2M);
    assert_eq!(r.perm, Perm::ReadOnly);
}

#[test]
fn permission_faults() {
    let mut m = mmu();
    m.map(BASE, 0x1000, vram(), 0, Perm::ReadOnly, PageSize::Size4K)
        .unwrap();
    m.map(
        BASE + 2 * MIB,
        2 * MIB,
        vram(),
        2 * MIB,
        Perm::ReadOnly,
        PageSize::Size2M,
    )
    .unwrap();
    for va in [BASE + 8, BASE + 2 * MIB + 8] {
        assert!(m.translate(va, AccessKind::Read).is_ok());
        assert_eq!(m.translate(va, AccessKind::Write), Err(FaultKind::ReadOnly));
        assert_eq!(
            m.translate(va, AccessKind::Atomic),
            Err(FaultKind::ReadOnly)
        );
    }
}

#[test]
fn out_of_window_is_rejected_and_faults() {
    let mut m = mmu();
    let e = m.map(
        BASE - 0x1000,
        0x1000,
        vram(),
        0,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert!(matches!(e, Err(MmuError::OutOfWindow { .. })));
    let e = m.map(
        BASE + (4 << 30) - 0x1000,
        0x2000,
        vram(),
        0,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert!(matches!(e, Err(MmuError::OutOfWindow { .. })));
    let e = m.map(
        u64::MAX - 0xfff,
        0x1000,
        vram(),
        0,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert!(matches!(e, Err(MmuError::OutOfWindow { .. })));
    assert_eq!(
        m.translate(BASE - 1, AccessKind::Read),
        Err(FaultKind::OutOfWindow)
    );
    assert_eq!(
        m.translate(BASE + (4 << 30), AccessKind::Read),
        Err(FaultKind::OutOfWindow)
    );
    assert_eq!(
        m.translate(0, AccessKind::Read),
        Err(FaultKind::OutOfWindow)
    );
}

#[test]
fn target_outside_memory_is_rejected() {
    let mut m = mmu();
    let e = m.map(
        BASE,
        2 * MIB,
        vram(),
        63 * MIB,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert!(matches!(e, Err(MmuError::TargetRange { .. })));
    let e = m.map(
        BASE,
        0x1000,
        vram(),
        !0xfff,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert!(matches!(e, Err(MmuError::TargetRange { .. })));
    assert_eq!(m.mapped_bytes(), 0);
}

#[test]
fn misaligned_and_empty_maps_are_rejected() {
    let mut m = mmu();
    let t = vram();
    assert_eq!(
        m.map(BASE, 0, t, 0, Perm::ReadWrite, PageSize::Size4K),
        Err(MmuError::ZeroLength)
    );
    assert!(matches!(
        m.map(
            BASE + 0x1000,
            2 * MIB,
            t,
            0,
            Perm::ReadWrite,
            PageSize::Size2M
        ),
        Err(MmuError::Misaligned { what: "VA", .. })
    ));
    assert!(matches!(
        m.map(BASE, 0x1800, t, 0, Perm::ReadWrite, PageSize::Size4K),
        Err(MmuError::Misaligned { what: "length", .. })
    ));
    assert!(matches!(
        m.map(BASE, 2 * MIB, t, 0x1000, Perm::ReadWrite, PageSize::Size2M),
        Err(MmuError::Misaligned {
            what: "target offset",
            ..
        })
    ));
}

#[test]
fn overlapping_maps_are_rejected_atomically() {
    let mut m = mmu();
    let t = vram();
    m.map(
        BASE + 0x5000,
        0x1000,
        t,
        0,
        Perm::ReadWrite,
        PageSize::Size4K,
    )
    .unwrap();
    // A 4K map whose last page hits the existing one: nothing of it is installed.
    let e = m.map(BASE, 0x6000, t, 0x10000, Perm::ReadWrite, PageSize::Size4K);
    assert_eq!(e, Err(MmuError::Overlap(BASE + 0x5000)));
    assert_eq!(
        m.translate(BASE, AccessKind::Read),
        Err(FaultKind::Unmapped)
    );
    // A 2M page over a table with a 4K page in it.
    let e = m.map(BASE, 2 * MIB, t, 0, Perm::ReadWrite, PageSize::Size2M);
    assert_eq!(e, Err(MmuError::Overlap(BASE)));
    // A 4K page inside an existing 2M page.
    m.map(
        BASE + 2 * MIB,
        2 * MIB,
        t,
        0,
        Perm::ReadWrite,
        PageSize::Size2M,
    )
    .unwrap();
    let e = m.map(
        BASE + 3 * MIB,
        0x1000,
        t,
        0,
        Perm::ReadWrite,
        PageSize::Size4K,
    );
    assert_eq!(e, Err(MmuError::Overlap(BASE + 3 * MIB)));
    assert_eq!(m.mapped_bytes(), 0x1000 + 2 * MIB);
}

#[test]
fn unmap_skips_holes_and_refuses_to_split_large_pages() {
    let mut m = mmu();
    let t = vram();
    m.map(BASE, 0x3000, t, 0, Perm::ReadWrite, PageSize::Size4K)
        .unwrap();
    m.map(
        BASE + 4 * MIB,
        2 * MIB,
        t,
        2 * MIB,
        Perm::ReadWrite,
        PageSize::Size2M,
    )
    .unwrap();
    assert_eq!(
        m.unmap(BASE + 4 * MIB, MIB),
        Err(MmuError::SplitsLargePage(BASE + 4 * MIB))
    );
    assert_eq!(
        m.unmap(BASE + 5 * MIB, 2 * MIB),
        Err(MmuError::SplitsLargePage(BASE + 4 * MIB))
    );
    assert!(m.translate(BASE + 4 * MIB, AccessKind::Read).is_ok());
    assert_eq!(m.unmap(BASE + 0x1000, 0x1000), Ok(0x1000));
    assert!(m.translate(BASE, AccessKind::Read).is_ok());
    assert_eq!(
        m.translate(BASE + 0x1000, AccessKind::Read),
        Err(FaultKind::Unmapped)
    );
    // The whole range: the remaining 4K pages and the 2M page, across holes.
    assert_eq!(m.unmap(BASE, 8 * MIB), Ok(0x2000 + 2 * MIB));
    assert_eq!(m.mapped_bytes(), 0);
    assert!(
        m.dirs.iter().all(Option::is_none),
        "empty directories are freed"
    );
    assert_eq!(m.unmap(BASE, 8 * MIB), Ok(0));
    assert!(matches!(
        m.unmap(BASE + 0x800, 0x1000),
        Err(MmuError::Misaligned { .. })
    ));
    assert!(matches!(
        m.unmap(BASE + (4 << 30), 0x1000),
        Err(MmuError::OutOfWindow { .. })
    ));
}

#[test]
fn remap_after_unmap_and_slot_accounting() {
    let mut m = mmu();
    let host = TargetMem {
        slot: 3,
        host_base: 0x6000_0000_0000,
        size: 16 * MIB,
    };
    m.map(BASE, 2 * MIB, host, 0, Perm::ReadWrite, PageSize::Size2M)
        .unwrap();
    m.map(
        BASE + 2 * MIB,
        0x1000,
        vram(),
        0,
        Perm::ReadWrite,
        PageSize::Size4K,
    )
    .unwrap();
    assert_eq!(m.bytes_on_slot(3), 2 * MIB);
    assert_eq!(m.bytes_on_slot(0), 0x1000);
    assert_eq!(m.resolve(BASE + 5).unwrap().slot, 3);
    m.unmap(BASE, 2 * MIB).unwrap();
    assert_eq!(m.bytes_on_slot(3), 0);
    m.map(BASE, 0x1000, host, 0x5000, Perm::ReadOnly, PageSize::Size4K)
        .unwrap();
    assert_eq!(
        m.translate(BASE + 1, AccessKind::Read),
        Ok((0x6000_0000_5001, 0xfff))
    );
}

#[test]
fn window_not_multiple_of_gib() {
    let mut m = Mmu::new(VaWindow {
        base: 2 * MIB,
        size: 6 * MIB,
    });
    m.map(
        6 * MIB,
        2 * MIB,
        vram(),
        0,
        Perm::ReadWrite,
        PageSize::Size2M,
    )
    .unwrap();
    assert!(m.translate(8 * MIB - 1, AccessKind::Read).is_ok());
    assert_eq!(
        m.translate(8 * MIB, AccessKind::Read),
        Err(FaultKind::OutOfWindow)
    );
    assert!(
        m.map(
            8 * MIB,
            2 * MIB,
            vram(),
            0,
            Perm::ReadWrite,
            PageSize::Size2M
        )
        .is_err()
    );
}

/// Random map/unmap sequences against a model of 4 KiB pages: every page translates exactly as
/// the model says, overlaps are refused, and bytes are accounted.
#[test]
fn random_operations_match_a_page_model() {
    use std::collections::BTreeMap;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    const PAGES: u64 = 4096; // 16 MiB window of 4 KiB pages
    let base = 6 << 30; // crosses no GiB boundary but starts at one
    let mut m = Mmu::new(VaWindow {
        base,
        size: PAGES * 4096,
    });
    // page index -> (host page address, writable, large)
    let mut model: BTreeMap<u64, (usize, bool, bool)> = BTreeMap::new();
    let host = 0x7000_0000_0000usize;
    let t = TargetMem {
        slot: 0,
        host_base: host,
        size: 64 * MIB,
    };
    let mut seen = [0u32; 4]; // large maps, small maps, overlap refusals, split refusals
    for _ in 0..3000 {
        let op = rnd(4);
        let large = op == 0;
        let perm = if rnd(2) == 0 {
            Perm::ReadOnly
        } else {
            Perm::ReadWrite
        };
        match op {
            0 | 1 => {
                let (first, n, ps) = if large {
                    (rnd(PAGES / 512) * 512, 512 * (1 + rnd(2)), PageSize::Size2M)
                } else {
                    // Small pages mostly in the lower half, so that 2 MiB slots stay free above.
                    (rnd(PAGES / 2 + 64), 1 + rnd(8), PageSize::Size4K)
                };
                let target_page = if large { rnd(16) * 512 } else { rnd(16000) };
                let r = m.map(
                    base + first * 4096,
                    n * 4096,
                    t,
                    target_page * 4096,
                    perm,
                    ps,
                );
                let fits = first + n <= PAGES;
                let free = (first..(first + n).min(PAGES)).all(|p| !model.contains_key(&p));
                // A 2M map also conflicts with 4K pages anywhere in its 2M slots (it covers
                // them whole), which `free` already checks page by page.
                match r {
                    Ok(()) => {
                        assert!(fits && free);
                        seen[usize::from(!large)] += 1;
                        for i in 0..n {
                            let h = host + ((target_page + i) * 4096) as usize;
                            model.insert(first + i, (h, perm == Perm::ReadWrite, large));
                        }
                    }
                    Err(MmuError::Overlap(_)) => {
                        assert!(!free);
                        seen[2] += 1;
                    }
                    Err(MmuError::OutOfWindow { .. }) => assert!(!fits),
                    Err(MmuError::TargetRange { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            _ => {
                let (first, n) = if rnd(2) == 0 {
                    (rnd(PAGES), 1 + rnd(1500))
                } else {
                    (rnd(PAGES / 512) * 512, 512 * (1 + rnd(3)))
                };
                let r = m.unmap(base + first * 4096, n * 4096);
                match r {
                    Ok(bytes) => {
                        let gone: Vec<u64> =
                            model.range(first..first + n).map(|(&p, _)| p).collect();
                        assert_eq!(bytes, gone.len() as u64 * 4096);
                        for p in gone {
                            model.remove(&p);
                        }
                    }
                    Err(MmuError::SplitsLargePage(_)) => {
                        let split = model.range(first..first + n).any(|(&p, &(_, _, l))| {
                            l && (p / 512 * 512 < first || p / 512 * 512 + 512 > first + n)
                        });
                        assert!(split);
                        seen[3] += 1;
                    }
                    Err(MmuError::OutOfWindow { .. }) => assert!(first + n > PAGES),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        let sample = rnd(PAGES);
        for p in [sample, rnd(PAGES)] {
            let va = base + p * 4096 + 8;
            match model.get(&p) {
                None => assert_eq!(m.translate(va, AccessKind::Read), Err(FaultKind::Unmapped)),
                Some(&(h, w, _)) => {
                    assert_eq!(m.translate(va, AccessKind::Read).map(|r| r.0), Ok(h + 8));
                    let wr = m.translate(va, AccessKind::Write);
                    assert_eq!(wr.is_ok(), w);
                }
            }
        }
        assert_eq!(m.mapped_bytes(), model.len() as u64 * 4096);
    }
    assert!(
        seen.iter().all(|&n| n > 20),
        "every path exercised: {seen:?}"
    );
}
