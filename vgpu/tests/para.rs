//! The para-virtual interface (`mode=para`, docs/hardware.md "Para-virtual interface") driven
//! from the host as a guest would: BAR3 presence, a copy through hypercall-made mappings, every
//! entry rule with its fault kind, all-or-nothing batches, argument-area bounds, hostile counts.

mod common;

use common::para::*;
use common::*;
use mmio::pci::PciDevice;
use vgpu::config::Mode;
use vgpu::para::*;
use vgpu::regs::*;

#[test]
fn bar3_and_caps_only_in_para_mode() {
    let full = Bench::new();
    assert_eq!(full.read(CAPS) & CAP_PARA, 0);
    assert!(full.dev.lock().unwrap().config().bars()[3].is_none());
    let mut v = [0u8; 4];
    full.dev
        .lock()
        .unwrap()
        .bar_read(3, u64::from(PARA_ID), &mut v);
    assert_eq!(u32::from_le_bytes(v), u32::MAX);
    let b = para_bench();
    assert_ne!(b.read(CAPS) & CAP_PARA, 0);
    assert!(b.dev.lock().unwrap().config().bars()[3].is_some());
    assert_eq!(b.para_read(PARA_ID), PARA_ID_VALUE);
    assert_eq!(b.para_read(PARA_VERSION), PARA_VERSION_VALUE);
    assert_eq!(b.para_read(MAX_BATCH_REG), MAX_BATCH);
    assert_eq!(b.para_read(ARGS_LO), ARGS as u32);
    assert_eq!(b.para_read(0x800), u32::MAX, "unknown register");
}

#[test]
fn a_copy_runs_through_hypercall_mappings_and_unmap_takes_effect() {
    let b = para_bench();
    setup(&b);
    b.sys_write(SYS + 0x4000, &[7u8; 64]);
    let (sys_va, vram_va) = (b.va_base + (2 << 20), b.va_base);
    assert!(copy(&b, 0, sys_va + 0x4000, vram_va + 0x100, 1));
    assert!(copy(&b, 1, vram_va + 0x100, sys_va + 0x5000, 2));
    assert_eq!(b.sys_read(SYS + 0x5000, 64), vec![7u8; 64]);
    // The guest never wrote a table; the host walked none.
    let s = b.gpu.stats();
    assert_eq!(s.counters.shadow_rebuilds, 0);
    assert_eq!(s.counters.table_writes_noticed, 0);
    let p = s.para.expect("para counters");
    assert_eq!((p.hypercalls, p.entries, p.refused), (2, 2, 0));
    // Unmap the VRAM page: the next copy from it faults UNMAPPED, nothing else changed.
    assert_eq!(b.call(OP_UNMAP_BATCH, 0, &[(vram_va, BIG, 1)]).0, ST_OK);
    assert!(!copy(&b, 2, vram_va + 0x100, sys_va + 0x5000, 3));
    let (st, _, addr, _) = b.fault();
    assert_eq!(
        (st & 0xff, addr),
        (u32::from(FaultKind::Unmapped.code()), vram_va + 0x100)
    );
    assert!(b.gpu.stats().guard_intact);
}

#[test]
fn read_only_entries_refuse_writes() {
    let b = para_bench();
    setup(&b);
    let ro_va = b.va_base + (6 << 20);
    assert_eq!(b.call(OP_MAP, 0, &[(ro_va, SYS | 2 | RO, 1)]).0, ST_OK);
    assert!(!copy(&b, 0, b.va_base, ro_va, 1));
    assert_eq!(b.fault().0 & 0xff, u32::from(FaultKind::ReadOnly.code()));
}

#[test]
fn every_entry_rule_gives_its_fault_kind() {
    let b = para_bench();
    setup(&b);
    let va = b.va_base + (8 << 20);
    let window_end = b.va_base + (4 << 30);
    let (k3, k4, k5) = (
        u32::from(FaultKind::PteVramRange.code()),
        u32::from(FaultKind::PteSysmemRange.code()),
        u32::from(FaultKind::BadEntry.code()),
    );
    // (what, entry, fault kind, fault VA)
    type Case = (&'static str, (u64, u64, u32), u32, u64);
    let cases: &[Case] = &[
        ("target 3", (va, 3, 1), k5, va),
        ("reserved PTE bits", (va, 0x10 | 1, 1), k5, va),
        ("big address misaligned", (va, 0x1000 | BIG | 1, 1), k5, va),
        ("va misaligned", (va + 0x800, 1, 1), k5, va + 0x800),
        (
            "big va misaligned",
            (va + 0x1000, BIG | 1, 1),
            k5,
            va + 0x1000,
        ),
        ("no pages", (va, 1, 0), k5, va),
        (
            "below the window",
            (b.va_base - 0x1000, 1, 1),
            k5,
            b.va_base - 0x1000,
        ),
        (
            "past the window",
            (window_end - 0x1000, 1, 2),
            k5,
            window_end - 0x1000,
        ),
        ("VRAM past the end", (va, VRAM | 1, 1), k3, va),
        (
            "VRAM range running out",
            (va, (VRAM - 0x1000) | 1, 2),
            k3,
            va,
        ),
        ("VRAM far", (va, (VRAM << 8) | BIG | 1, 1), k3, va),
        ("sysmem past RAM", (va, RAM | 2, 1), k4, va),
        ("sysmem MMIO", (va, 0xfee0_0000 | 2, 1), k4, va),
        (
            "sysmem range running out",
            (va, (RAM - 0x1000) | 2, 2),
            k4,
            va,
        ),
    ];
    for (i, (what, e, kind, addr)) in cases.iter().enumerate() {
        b.write(FAULT_CLEAR, 1);
        let (st, index, k, a) = b.call(OP_MAP_BATCH, 0, &[*e]);
        assert_eq!(
            (st, index, k, a),
            (ST_ENTRY_FAULT, 0, *kind, *addr),
            "{i}: {what}"
        );
        // The same fault is the device's record (channel 0xffff, INFO = the index).
        let (fst, ch, faddr, info) = b.fault();
        assert_eq!(
            (fst & 0xff, ch, faddr, info),
            (*kind, 0xffff, *addr, 0),
            "{what}"
        );
    }
    // Nothing of that reached the space: the bench's two ranges only.
    assert!(copy(&b, 0, b.va_base, b.va_base + (2 << 20) + 0x5000, 9));
    let p = b.gpu.stats().para.unwrap();
    assert_eq!(p.refused, cases.len() as u64);
    assert!(b.gpu.stats().guard_intact);
}

#[test]
fn batches_are_all_or_nothing_and_report_the_first_failing_index() {
    let b = para_bench();
    setup(&b);
    let va = b.va_base + (8 << 20);
    // Entry 0 would unmap the GPFIFO's range, entry 2 is bad: nothing happens.
    let entries = [
        (b.va_base + (2 << 20), 0, 512),
        (va, SYS | 2, 1),
        (va + 0x1000, 3, 1),
        (va + 0x2000, RAM | 2, 1),
    ];
    let (st, index, kind, addr) = b.call(OP_MAP_BATCH, 0, &entries);
    assert_eq!(
        (st, index, kind, addr),
        (
            ST_ENTRY_FAULT,
            2,
            u32::from(FaultKind::BadEntry.code()),
            va + 0x1000
        )
    );
    assert_eq!(b.fault().3, 2, "FAULT_INFO = the index");
    b.write(FAULT_CLEAR, 1);
    // The channel still runs: the GPFIFO range is still mapped, `va` is not.
    assert!(copy(&b, 0, b.va_base, b.va_base + (2 << 20) + 0x5000, 1));
    assert!(!copy(&b, 1, va, b.va_base + (2 << 20) + 0x5000, 2));
    // Later entries override earlier ones; part of a range can be replaced.
    let b = para_bench();
    setup(&b);
    let sys_va = b.va_base + (2 << 20);
    b.sys_write(SYS + 0x10_0000, &[5u8; 64]);
    let entries = [(va, 2 | SYS, 4), (va + 0x1000, 2 | (SYS + 0x10_0000), 1)];
    assert_eq!(b.call(OP_MAP_BATCH, 0, &entries).0, ST_OK);
    assert!(copy(&b, 0, va + 0x1000, sys_va + 0x5000, 1));
    assert_eq!(b.sys_read(SYS + 0x5000, 64), vec![5u8; 64]);
}

#[test]
fn bad_calls_and_hostile_counts_are_refused_without_effect() {
    let b = Bench::with(|c| c.mode = Mode::Para);
    // No argument area yet: BAD_CALL in the register (nothing to write the result to).
    b.para_write(CALL, OP_SET_PD);
    assert_eq!(b.para_read(STATUS) & 0xff, ST_BAD_CALL);
    // An area not wholly in RAM, or misaligned.
    for bad in [RAM - 0x1000, ARGS + 8, 0xfee0_0000] {
        b.para_write(ARGS_LO, bad as u32);
        b.para_write(ARGS_HI, (bad >> 32) as u32);
        b.para_write(CALL, OP_SET_PD);
        assert_eq!(b.para_read(STATUS) & 0xff, ST_BAD_CALL, "{bad:#x}");
    }
    b.para_write(ARGS_LO, ARGS as u32);
    // Before SET_PD, maps are refused.
    assert_eq!(b.call(OP_MAP, 0, &[(b.va_base, 1, 1)]).0, ST_BAD_CALL);
    // Bad PDBs.
    for pdb in [PD, PD | 3, PD | 1 | 0x10, VRAM | 1, RAM | 2] {
        assert_eq!(b.call(OP_SET_PD, pdb, &[]).0, ST_BAD_CALL, "{pdb:#x}");
    }
    assert_eq!(b.call(OP_SET_PD, PD | 1, &[]).0, ST_OK);
    // Unknown ops, VRAM_ALLOC/FREE (not provided), a count above MAX_BATCH (never read).
    for op in [0, 6, 7, 0xff] {
        assert_eq!(b.call(op, 0, &[]).0, ST_BAD_CALL, "op {op}");
    }
    b.sys_write(ARGS + 8, &u32::MAX.to_le_bytes());
    b.para_write(CALL, OP_MAP_BATCH);
    assert_eq!(b.para_read(STATUS) & 0xff, ST_BAD_CALL);
    b.sys_write(ARGS + 8, &(MAX_BATCH + 1).to_le_bytes());
    b.para_write(CALL, OP_UNMAP_BATCH);
    assert_eq!(b.para_read(STATUS) & 0xff, ST_BAD_CALL);
    // A full batch is fine; UNMAP entries with anything but BIG set are refused.
    let full: Vec<_> = (0..u64::from(MAX_BATCH))
        .map(|i| (b.va_base + 0x1000 * i, 1 | (0x1000 * i), 1))
        .collect();
    assert_eq!(b.call(OP_MAP_BATCH, 0, &full), (ST_OK, MAX_BATCH, 0, 0));
    assert_eq!(
        b.call(OP_UNMAP_BATCH, 0, &[(b.va_base, 1, 1)]).0,
        ST_ENTRY_FAULT
    );
    assert_eq!(b.call(OP_UNMAP_BATCH, 0, &[(b.va_base, 0, 2048)]).0, ST_OK);
    // At most 8 page directories.
    for k in 1..8u64 {
        assert_eq!(b.call(OP_SET_PD, (PD + 0x10_0000 * k) | 1, &[]).0, ST_OK);
    }
    assert_eq!(b.call(OP_SET_PD, 0x100_0000 | 1, &[]).0, ST_BAD_CALL);
    assert_eq!(b.call(OP_TLB_FLUSH, 0, &[]).0, ST_OK);
    assert!(b.gpu.stats().guard_intact);
}

#[test]
fn a_channel_whose_pd_was_never_set_faults_bad_instance() {
    let b = para_bench();
    setup(&b);
    let inst = INST + 0x1000;
    b.vram_write_u64(inst, (PD + 0x10_0000) | 1);
    b.vram_write_u64(inst + 8, b.va_base + (2 << 20));
    b.vram_write_u64(inst + 16, 16);
    b.vram_write_u64(inst + 24, 0);
    b.write(CHAN_BASE + 8, CHAN_INST_VALID | (inst >> 12) as u32);
    b.dev.lock().unwrap().bar_write(1, RUNLIST, &[1, 0, 0, 0]);
    b.write(RUNLIST_BASE, (RUNLIST >> 12) as u32);
    b.write(RUNLIST_SUBMIT, 1);
    b.write(DOORBELL_BASE + 8, 1);
    b.wait("the fault", |b| {
        b.read(CHAN_BASE + 12) & 0xf == CHAN_FAULTED
    });
    assert_eq!(
        b.read(CHAN_BASE + 12) >> 8 & 0xff,
        u32::from(FaultKind::BadInstance.code())
    );
}

/// The space's bookkeeping (`apply`: replace / remove ranges, merge neighbours) against a
/// page-by-page model, on random operations.
#[test]
fn applying_changes_matches_a_page_model() {
    use shadow::{GuestMapping, GuestTarget};
    use std::collections::BTreeMap;
    use vgpu::para::{Op, apply};
    const P: u64 = 0x1000;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut runs: Vec<GuestMapping> = Vec::new();
    let mut model: BTreeMap<u64, (bool, u64, bool)> = BTreeMap::new();
    for step in 0..3000 {
        let va = 0x1000_0000 + rnd(64) * P;
        let len = (1 + rnd(12)) * P;
        let op = if rnd(3) == 0 {
            for k in 0..len / P {
                model.remove(&(va + k * P));
            }
            Op::Unmap { va, len }
        } else {
            let (vram, addr, ro) = (rnd(2) == 0, rnd(8) * P, rnd(4) == 0);
            for k in 0..len / P {
                model.insert(va + k * P, (vram, addr + k * P, ro));
            }
            let target = if vram {
                GuestTarget::Vram(addr)
            } else {
                GuestTarget::Sysmem(addr)
            };
            Op::Map(GuestMapping {
                va,
                len,
                target,
                read_only: ro,
            })
        };
        runs = apply(&runs, &[op]);
        let mut pages = BTreeMap::new();
        for (i, m) in runs.iter().enumerate() {
            if let Some(n) = runs.get(i + 1) {
                assert!(m.va + m.len <= n.va, "step {step}: sorted, disjoint");
                let merged = m.va + m.len == n.va
                    && m.read_only == n.read_only
                    && m.target.offset(m.len) == Some(n.target);
                assert!(!merged, "step {step}: neighbours that continue are merged");
            }
            for k in 0..m.len / P {
                let t = m.target.offset(k * P).unwrap();
                let vram = matches!(t, GuestTarget::Vram(_));
                pages.insert(m.va + k * P, (vram, t.addr(), m.read_only));
            }
        }
        assert_eq!(pages, model, "step {step}");
    }
}

#[test]
fn vram_alloc_and_free_hypercalls() {
    let b = para_bench();
    // 1 MiB, 2 MiB aligned (COUNT = log2 alignment); ADDR carries the block.
    b.sys_write(ARGS + 8, &21u64.to_le_bytes());
    let alloc = |len: u64, log2: u64| {
        b.sys_write(ARGS, &len.to_le_bytes());
        b.sys_write(ARGS + 8, &log2.to_le_bytes());
        b.sys_write(ARGS + 0x10, &[0xee; 24]);
        b.para_write(CALL, OP_VRAM_ALLOC);
        let r = b.sys_read(ARGS + 0x10, 24);
        let st = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
        (st, u64::from_le_bytes(r[16..24].try_into().unwrap()))
    };
    let (st, a) = alloc(1 << 20, 21);
    assert_eq!((st, a % (2 << 20)), (ST_OK, 0));
    let (st, b2) = alloc(4096, 0);
    assert_eq!(st, ST_OK);
    assert!(
        b2 + 4096 <= a || b2 >= a + (1 << 20),
        "blocks do not overlap"
    );
    // Hostile sizes and alignments; exhaustion.
    assert_eq!(alloc(0, 0).0, ST_BAD_CALL);
    assert_eq!(alloc(VRAM + 1, 0).0, ST_BAD_CALL);
    assert_eq!(alloc(4096, 40).0, ST_BAD_CALL);
    assert_eq!(alloc(VRAM, 0).0, ST_NO_MEMORY);
    // Free: only what ALLOC returned, once.
    assert_eq!(b.call(OP_VRAM_FREE, a, &[]).0, ST_OK);
    assert_eq!(b.call(OP_VRAM_FREE, a, &[]).0, ST_BAD_CALL);
    assert_eq!(b.call(OP_VRAM_FREE, 12345, &[]).0, ST_BAD_CALL);
    assert_eq!(alloc(1 << 20, 21), (ST_OK, a), "the freed block is reused");
    assert!(b.gpu.stats().guard_intact);
}
