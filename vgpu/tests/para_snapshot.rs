//! Snapshot and restore of a para-virtual GPU (`mode=para`; docs/snapshot.md, "Virtual GPU",
//! section PARA): the spaces the guest built with hypercalls, the selected page directory, the
//! VRAM_ALLOC blocks, ARGS and the counters come back in a fresh device and work there; forged
//! para state (mappings outside the partition or RAM, a forged PDB or selected page directory,
//! VRAM blocks outside VRAM) and a snapshot of the other mode are refused before anything is
//! applied, leaving the device fresh and usable.

mod common;

use common::para::*;
use common::*;
use vgpu::config::Mode;
use vgpu::para::*;
use vgpu::snapshot::SnapshotError;
use vgpu::snapshot::format;

fn para(c: &mut vgpu::GpuConfig) {
    c.mode = Mode::Para;
}

/// A para bench after `setup`, two copies, a VRAM_ALLOC of 64 KiB and a value left in VRAM;
/// paused and saved: (RAM, snapshot, the block's address).
fn saved() -> (Vec<u8>, Vec<u8>, u64) {
    let a = para_bench();
    setup(&a);
    let (sys_va, vram_va) = (a.va_base + (2 << 20), a.va_base);
    a.sys_write(SYS + 0x4000, &[7u8; 64]);
    assert!(copy(&a, 0, sys_va + 0x4000, vram_va + 0x100, 1));
    let (st, _, _, block) = a.call(OP_VRAM_ALLOC, 64 << 10, &[]);
    assert_eq!(st, ST_OK);
    a.sys_write(SYS + 0x4000, &[9u8; 64]);
    assert!(copy(&a, 1, sys_va + 0x4000, vram_va + 0x200, 2));
    a.gpu.pause().unwrap();
    let ram = a.sys_read(0, RAM as usize);
    let mut snap = Vec::new();
    a.gpu.save(&mut snap).unwrap();
    (ram, snap, block)
}

#[test]
fn a_para_gpu_restores_its_spaces_blocks_and_counters() {
    let (ram, snap, block) = saved();
    let b = Bench::with_ram(para, &ram);
    b.gpu.restore(&mut &snap[..]).unwrap();
    // ARGS came back (the bench did not register it), and so did the counters.
    assert_eq!(b.para_read(ARGS_LO), ARGS as u32);
    let p = b.gpu.stats().para.unwrap();
    assert_eq!((p.hypercalls, p.entries, p.refused), (3, 2, 0));
    // The restored mappings work without a hypercall: VRAM written before the snapshot is
    // read back through them.
    let (sys_va, vram_va) = (b.va_base + (2 << 20), b.va_base);
    assert!(copy(&b, 2, vram_va + 0x100, sys_va + 0x5000, 3));
    assert_eq!(b.sys_read(SYS + 0x5000, 64), vec![7u8; 64]);
    assert!(copy(&b, 3, vram_va + 0x200, sys_va + 0x6000, 4));
    assert_eq!(b.sys_read(SYS + 0x6000, 64), vec![9u8; 64]);
    // The block is live: freed once, not twice.
    assert_eq!(b.call(OP_VRAM_FREE, block, &[]).0, ST_OK);
    assert_eq!(b.call(OP_VRAM_FREE, block, &[]).0, ST_BAD_CALL);
    // Unmapped VAs stay unmapped.
    assert!(!copy(&b, 4, vram_va + (8 << 20), sys_va + 0x5000, 5));
    assert!(b.gpu.stats().guard_intact);
    // The same snapshot restores a second time.
    let c = Bench::with_ram(para, &ram);
    c.gpu.restore(&mut &snap[..]).unwrap();
    assert!(copy(&c, 2, vram_va + 0x200, sys_va + 0x5000, 3));
    assert_eq!(c.sys_read(SYS + 0x5000, 64), vec![9u8; 64]);
}

/// `snap` with its PARA section edited by `f` (the checksum redone).
fn with_para(snap: &[u8], f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut secs = format::split_sections(snap).unwrap();
    let s = secs.iter_mut().find(|(t, _)| *t == format::PARA).unwrap();
    f(&mut s.1);
    format::assemble(format::VERSION, &secs)
}

/// Restoring `snap` into a fresh para device fails with an error whose text holds `want`; the
/// device stays fresh: no space, and the guest's own hypercalls work.
fn refused(ram: &[u8], snap: &[u8], want: &str) {
    let b = Bench::with_ram(para, ram);
    let e = b.gpu.restore(&mut &snap[..]).unwrap_err();
    assert!(e.to_string().contains(want), "{e}");
    assert!(!b.gpu.is_paused());
    assert_eq!(b.gpu.stats().para.unwrap().hypercalls, 0, "{e}");
    assert_eq!(
        b.read(vgpu::regs::CHAN_BASE),
        0,
        "nothing applied after {e}"
    );
    b.para_write(ARGS_LO, ARGS as u32);
    setup(&b);
}

// Offsets in the PARA payload (docs/snapshot.md): the selected PDB, the first space's PDB,
// its first run's target address.
const CURRENT: usize = 1 + 8 + 4 + 40 + 1;
const SPACE0_PDB: usize = CURRENT + 8 + 4;
const RUN0_ADDR: usize = SPACE0_PDB + 8 + 4 + 8 + 8 + 1;

fn a_va_base() -> u64 {
    vgpu::GpuConfig::default().va_base
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn forged_para_state_is_refused_before_anything_is_applied() {
    let (ram, snap, _) = saved();
    // The offsets are right: the untouched fields read back as saved.
    let secs = format::split_sections(&snap).unwrap();
    let p = &secs.iter().find(|(t, _)| *t == format::PARA).unwrap().1;
    let u64_at = |o: usize| u64::from_le_bytes(p[o..o + 8].try_into().unwrap());
    assert_eq!(u64_at(CURRENT), PD | 1);
    assert_eq!(u64_at(SPACE0_PDB), PD | 1);
    assert_eq!(u64_at(RUN0_ADDR), 0, "run 0 maps VRAM 0");
    // A run onto VRAM beyond the partition.
    let s = with_para(&snap, |b| put(b, RUN0_ADDR, VRAM - (1 << 20)));
    refused(&ram, &s, "outside the VM's VRAM partition");
    // ... onto system memory outside guest RAM.
    let s = with_para(&snap, |b| {
        b[RUN0_ADDR - 1] = 2;
        put(b, RUN0_ADDR, RAM + (4 << 20));
    });
    refused(&ram, &s, "outside the VM's RAM");
    // A forged selected page directory (no space of that PDB was saved).
    let s = with_para(&snap, |b| put(b, CURRENT, (PD + 0x1000) | 1));
    refused(&ram, &s, "has no space");
    // A forged PDB: reserved bits, an aperture of 0, outside VRAM.
    for bad in [PD | 1 | 4, PD, VRAM | 1] {
        let s = with_para(&snap, |b| put(b, SPACE0_PDB, bad));
        refused(&ram, &s, "not a valid PDB");
    }
    // Overlapping runs (the second run moved onto the first one's VA).
    let run0_va = u64_at(RUN0_ADDR - 17);
    assert_eq!(run0_va, a_va_base());
    let s = with_para(&snap, |b| put(b, RUN0_ADDR + 9, run0_va));
    refused(&ram, &s, "overlaps or precedes");
    // A VRAM block beyond VRAM (the blocks end the payload).
    let s = with_para(&snap, |b| {
        let n = b.len();
        put(b, n - 16, VRAM);
    });
    refused(&ram, &s, "VRAM block");
    // A count of spaces above the limit; a truncated payload; trailing bytes.
    let s = with_para(&snap, |b| b[SPACE0_PDB - 4] = 9);
    refused(&ram, &s, "spaces");
    let s = with_para(&snap, |b| b.truncate(b.len() - 3));
    refused(&ram, &s, "PARA");
    let s = with_para(&snap, |b| b.push(0));
    refused(&ram, &s, "trailing");
    // The untouched snapshot restores.
    Bench::with_ram(para, &ram)
        .gpu
        .restore(&mut &snap[..])
        .unwrap();
}

#[test]
fn a_snapshot_restores_only_into_a_gpu_of_its_own_mode() {
    let (ram, snap, _) = saved();
    let full = Bench::with_ram(|_| {}, &ram);
    let e = full.gpu.restore(&mut &snap[..]).unwrap_err();
    assert!(
        matches!(
            &e,
            SnapshotError::Invalid {
                section: "PARA",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("mode=para"), "{e}");
    // A full-mode snapshot into a para GPU.
    let a = Bench::new();
    a.gpu.pause().unwrap();
    let mut full_snap = Vec::new();
    a.gpu.save(&mut full_snap).unwrap();
    let e = Bench::with(para)
        .gpu
        .restore(&mut &full_snap[..])
        .unwrap_err();
    assert!(e.to_string().contains("mode=full"), "{e}");
}
