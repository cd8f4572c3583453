//! Snapshot and restore of the virtual GPU (issue 17), driven as a VMM would: guest GPU work
//! (lcg_spin kernels and copies on several channels) is paused at pseudo-random moments,
//! mid-kernel included, saved, restored into a fresh device with a copy of guest RAM, and
//! continued; the results must be byte-identical to an uninterrupted run (and to the CPU
//! reference). Also: pause/resume alone, the drained (portable) snapshot, the refusal of a
//! foreign backend's context, and hostile snapshot files.

mod common;

use std::time::Duration;

use common::*;
use vgpu::regs::method::*;
use vgpu::regs::*;
use vgpu::snapshot::format;
use vgpu::snapshot::{PauseMode, SnapshotError};

const CHANNELS: u32 = 3;
/// Launches per channel.
const LAUNCHES: u32 = 3;
const CTAS: u32 = 4;
const THREADS: u32 = 32;
const SYS_VA_OFF: u64 = 2 << 20;
/// Sysmem offsets: the module text and entry name (shared), per-channel areas, semaphores.
const TEXT: u64 = 0x10_0000;
const ENTRY: u64 = 0x18_0000;
const SEMS: u64 = 0x1f_0000;
/// Results in sysmem (copied back from VRAM): per channel, per launch.
const RESULTS: u64 = 0x1c_0000;
/// Output buffers in VRAM (inside the first 2 MiB, mapped at VA_BASE).
const OUT: u64 = 0x10_0000;
const OUT_BYTES: u64 = (CTAS * THREADS * 4) as u64;
/// A kernel that is not idempotent: every thread adds 1 to `*counter`, `iters` times. Run
/// again from the start after a pause (instead of resumed from its saved context), it would
/// count too far.
const TALLY: &str = ".version 7.8\n.target sm_80\n.address_size 64\n\
    .visible .entry tally(.param .u64 counter, .param .u32 iters)\n{\n\
    \t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<3>;\n\
    \tld.param.u64 %rd1, [counter];\n\tld.param.u32 %r1, [iters];\n\
    \tcvta.to.global.u64 %rd2, %rd1;\n\tmov.u32 %r2, 0;\n\
    $L__tally:\n\tatom.global.add.u32 %r3, [%rd2], 1;\n\tadd.u32 %r2, %r2, 1;\n\
    \tsetp.lt.u32 %p1, %r2, %r1;\n\t@%p1 bra $L__tally;\n\tret;\n}\n";
const TALLY_TEXT: u64 = 0x14_0000;
const TALLY_ENTRY: u64 = 0x18_0100;
/// The tally counter, after a launch's lcg output (inside what is copied back).
const COUNTER: u64 = 0x800;
/// Bytes copied back per launch.
const COPY_BYTES: u64 = 0x1000;

fn tally_iters(ch: u32, slot: u32) -> u32 {
    1500 + 200 * ch + 100 * slot
}

/// The runlist (the bench's RUNLIST is channel 1's instance block here).
const LIST: u64 = 0x50_8000;

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

fn cfg(c: &mut vgpu::GpuConfig) {
    c.channels = 4;
    c.job_timeout = Duration::from_secs(60);
}

/// Channel area in sysmem: GPFIFO at +0, pushbuffers from +0x1000, params from +0x8000.
fn area(ch: u32) -> u64 {
    0x2_0000 * u64::from(ch)
}

fn iters(ch: u32, slot: u32) -> u32 {
    1500 + 500 * ch + 300 * slot
}

fn out_addr(ch: u32, slot: u32) -> u64 {
    OUT + 0x1_0000 * u64::from(ch) + 0x1000 * u64::from(slot)
}

/// Maps VRAM and sysmem, binds `CHANNELS` channels and puts them all on the runlist.
fn setup(b: &Bench) {
    b.map_big(0, 1, 0);
    b.map_big(1, 2, SYS);
    for ch in 0..CHANNELS {
        let inst = INST + 0x1000 * u64::from(ch);
        b.vram_write_u64(inst, PD | 1);
        b.vram_write_u64(inst + 8, b.va_base + SYS_VA_OFF + area(ch));
        b.vram_write_u64(inst + 16, 16);
        b.vram_write_u64(inst + 24, 0);
        b.write(CHAN_BASE + 8 * ch, CHAN_INST_VALID | (inst >> 12) as u32);
    }
    let ids: Vec<u8> = (0..CHANNELS).flat_map(|c| c.to_le_bytes()).collect();
    {
        use mmio::pci::PciDevice;
        b.dev.lock().unwrap().bar_write(1, LIST, &ids);
    }
    b.write(RUNLIST_BASE, (LIST >> 12) as u32);
    b.write(RUNLIST_SUBMIT, CHANNELS);
    b.write(TLB_FLUSH, 1);
    b.write(INTR_ENABLE, INTR_SEMAPHORE | INTR_FAULT);
    b.sys_write(SYS + TEXT, suite::lcg::PTX.as_bytes());
    b.sys_write(SYS + ENTRY, suite::lcg::ENTRY.as_bytes());
    b.sys_write(SYS + TALLY_TEXT, TALLY.as_bytes());
    b.sys_write(SYS + TALLY_ENTRY, b"tally");
}

/// The methods of a 1-D launch of `CTAS` × `THREADS`.
fn launch_words(
    code: u64,
    code_len: usize,
    entry: u64,
    entry_len: usize,
    p: u64,
    plen: u32,
) -> Vec<u32> {
    vec![
        hi(code),
        code as u32,
        code_len as u32,
        hi(entry),
        entry as u32,
        entry_len as u32,
        CTAS,
        1,
        1,
        THREADS,
        1,
        1,
        0,
        hi(p),
        p as u32,
        plen,
        0,
    ]
}

/// Queues every channel's work: per launch, lcg_spin into VRAM, a copy of its output to
/// sysmem, and a semaphore release of `slot + 1`.
fn submit_all(b: &Bench) {
    let va = |off: u64| b.va_base + SYS_VA_OFF + off;
    for ch in 0..CHANNELS {
        for slot in 0..LAUNCHES {
            let params_off = area(ch) + 0x8000 + 0x100 * u64::from(slot);
            let mut params = (b.va_base + out_addr(ch, slot)).to_le_bytes().to_vec();
            params.extend_from_slice(&iters(ch, slot).to_le_bytes());
            params.extend_from_slice(&(ch * 16 + slot).to_le_bytes());
            b.sys_write(SYS + params_off, &params);
            let mut tally = (b.va_base + out_addr(ch, slot) + COUNTER)
                .to_le_bytes()
                .to_vec();
            tally.extend_from_slice(&tally_iters(ch, slot).to_le_bytes());
            b.sys_write(SYS + params_off + 0x40, &tally);
            let lcg = launch_words(
                va(TEXT),
                suite::lcg::PTX.len(),
                va(ENTRY),
                suite::lcg::ENTRY.len(),
                va(params_off),
                16,
            );
            let tally = launch_words(
                va(TALLY_TEXT),
                TALLY.len(),
                va(TALLY_ENTRY),
                5,
                va(params_off + 0x40),
                12,
            );
            let src = b.va_base + out_addr(ch, slot);
            let dst = va(RESULTS + 0x4000 * u64::from(ch) + COPY_BYTES * u64::from(slot));
            let sem = va(SEMS + 16 * u64::from(ch));
            let pb = push(&[
                (CODE_HI, &lcg),
                (CODE_HI, &tally),
                (
                    COPY_SRC_HI,
                    &[
                        hi(src),
                        src as u32,
                        hi(dst),
                        dst as u32,
                        COPY_BYTES as u32,
                        0,
                    ],
                ),
                (
                    SEM_ADDR_HI,
                    &[hi(sem), sem as u32, slot + 1, SEM_OP_RELEASE],
                ),
            ]);
            let pb_off = area(ch) + 0x1000 + 0x400 * u64::from(slot);
            b.sys_write(SYS + pb_off, &pb);
            let e = va(pb_off) | ((pb.len() as u64 / 4) << 48);
            b.sys_write(SYS + area(ch) + 8 * u64::from(slot), &e.to_le_bytes());
        }
    }
    for ch in 0..CHANNELS {
        b.write(DOORBELL_BASE + 8 * ch, LAUNCHES);
    }
}

fn done(b: &Bench) -> bool {
    (0..CHANNELS).all(|ch| b.sys_read(SYS + SEMS + 16 * u64::from(ch), 4) == LAUNCHES.to_le_bytes())
}

/// Waits for all work (generous: the interpreter is slow in debug builds).
fn finish(b: &Bench) {
    let t = std::time::Instant::now();
    while !done(b) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "work did not finish; fault {:x?}",
            b.fault()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(b.read(FAULT_STATUS), 0, "fault {:x?}", b.fault());
}

/// What the guest can see of the results: the VRAM outputs and the sysmem copies.
fn results(b: &Bench) -> (Vec<u8>, Vec<u8>) {
    let mut vram = Vec::new();
    for ch in 0..CHANNELS {
        for slot in 0..LAUNCHES {
            for k in 0..COPY_BYTES / 8 {
                vram.extend_from_slice(&b.vram_read_u64(out_addr(ch, slot) + 8 * k).to_le_bytes());
            }
        }
    }
    (vram, b.sys_read(SYS + RESULTS, 0x4000 * CHANNELS as usize))
}

/// The CPU reference of one channel's launch.
fn reference(ch: u32, slot: u32) -> Vec<u8> {
    (0..CTAS * THREADS)
        .flat_map(|gid| suite::lcg::reference(gid, iters(ch, slot), ch * 16 + slot).to_le_bytes())
        .collect()
}

fn check_reference(r: &(Vec<u8>, Vec<u8>)) {
    for ch in 0..CHANNELS {
        for slot in 0..LAUNCHES {
            let i = ((ch * LAUNCHES + slot) as u64 * COPY_BYTES) as usize;
            assert!(
                r.0[i..i + OUT_BYTES as usize] == reference(ch, slot),
                "channel {ch} launch {slot}: lcg output differs from the CPU reference"
            );
            let count = CTAS * THREADS * tally_iters(ch, slot);
            let c = i + COUNTER as usize;
            assert_eq!(
                r.0[c..c + 4],
                count.to_le_bytes(),
                "channel {ch} launch {slot} tally"
            );
            let j = (0x4000 * u64::from(ch) + COPY_BYTES * u64::from(slot)) as usize;
            assert!(
                r.1[j..j + COPY_BYTES as usize] == r.0[i..i + COPY_BYTES as usize],
                "channel {ch} launch {slot}: the copy to sysmem differs from VRAM"
            );
        }
    }
}

/// Results equal (reported by the first differing byte, not by dumping them).
fn same(got: &(Vec<u8>, Vec<u8>), want: &(Vec<u8>, Vec<u8>), what: &str) {
    for (g, w, name) in [(&got.0, &want.0, "VRAM"), (&got.1, &want.1, "sysmem")] {
        assert_eq!(g.len(), w.len());
        if let Some(i) = g.iter().zip(w.iter()).position(|(a, b)| a != b) {
            panic!(
                "{what}: {name} results differ at byte {i:#x}: {} vs {}",
                g[i], w[i]
            );
        }
    }
}

fn uninterrupted() -> (Vec<u8>, Vec<u8>) {
    let b = Bench::with(cfg);
    setup(&b);
    submit_all(&b);
    finish(&b);
    let r = results(&b);
    check_reference(&r);
    r
}

/// Deterministic pseudo-random delays.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Pauses `b` (in `mode`), copies its RAM and saves; returns (RAM, snapshot, report).
fn snapshot(b: &Bench, mode: PauseMode) -> (Vec<u8>, Vec<u8>, vgpu::snapshot::SaveReport) {
    b.gpu.pause_with(mode).unwrap();
    assert!(b.gpu.is_paused());
    let ram = b.sys_read(0, RAM as usize);
    let mut snap = Vec::new();
    let report = b.gpu.save_report(&mut snap).unwrap();
    assert_eq!(report.bytes, snap.len() as u64);
    (ram, snap, report)
}

fn restored(ram: &[u8], snap: &[u8]) -> Bench {
    let b = Bench::with_ram(cfg, ram);
    b.gpu.restore(&mut &snap[..]).unwrap();
    b
}

#[test]
fn paused_mid_kernel_saved_and_restored_gives_identical_results() {
    let want = uninterrupted();
    let mut rng = Rng(0x5eed_1234_abcd);
    let mut mid_kernel = 0;
    for round in 0..3 {
        let a = Bench::with(cfg);
        setup(&a);
        submit_all(&a);
        // Hop through a chain of devices: pause at a pseudo-random moment, save, restore.
        let mut cur = a;
        let mut hops = 0;
        while !done(&cur) && hops < 8 {
            std::thread::sleep(Duration::from_millis(2 + rng.below(30)));
            let (ram, snap, report) = snapshot(&cur, PauseMode::Preempt);
            mid_kernel += report.suspended;
            if round == 0 && hops == 0 {
                // The source, resumed without a restore, finishes correctly too.
                cur.gpu.resume();
                finish(&cur);
                same(&results(&cur), &want, "the paused source after resume");
            }
            drop(cur);
            cur = restored(&ram, &snap);
            hops += 1;
        }
        finish(&cur);
        same(
            &results(&cur),
            &want,
            &format!("round {round} after {hops} restores"),
        );
        assert!(cur.gpu.stats().guard_intact);
    }
    // Make sure the mid-kernel path was exercised: pause until a kernel is caught running.
    if mid_kernel == 0 {
        let a = Bench::with(cfg);
        setup(&a);
        submit_all(&a);
        let mut cur = a;
        while !done(&cur) {
            let (ram, snap, report) = snapshot(&cur, PauseMode::Preempt);
            if report.suspended > 0 {
                mid_kernel += 1;
                drop(cur);
                cur = restored(&ram, &snap);
                break;
            }
            cur.gpu.resume();
            std::thread::sleep(Duration::from_millis(3));
        }
        finish(&cur);
        same(&results(&cur), &want, "after a mid-kernel restore");
    }
    assert!(mid_kernel > 0, "no pause caught a job running");
}

#[test]
fn pause_and_resume_without_save_keeps_results_correct() {
    let want = uninterrupted();
    let b = Bench::with(cfg);
    setup(&b);
    submit_all(&b);
    let mut rng = Rng(77);
    let mut n = 0;
    while !done(&b) && n < 20 {
        std::thread::sleep(Duration::from_millis(rng.below(20)));
        b.gpu.pause().unwrap();
        b.gpu.pause().unwrap();
        assert!(b.gpu.is_paused());
        b.gpu.resume();
        n += 1;
    }
    finish(&b);
    same(&results(&b), &want, "after restore or pauses");
}

#[test]
fn a_drained_snapshot_holds_no_context_and_restores_on_a_fresh_device() {
    let want = uninterrupted();
    let a = Bench::with(cfg);
    setup(&a);
    submit_all(&a);
    // After channel 0's first entry (both modules loaded), at some point of the rest.
    a.wait("the first entry", |b| b.sys_read(SYS + SEMS, 4) != [0; 4]);
    let (ram, snap, report) = snapshot(&a, PauseMode::Drain);
    assert!(
        report.suspended == 0,
        "a drained pause lets the running job finish"
    );
    assert_eq!(report.modules, 2, "the module cache is saved");
    drop(a);
    let b = restored(&ram, &snap);
    finish(&b);
    same(&results(&b), &want, "after restore or pauses");
}

fn sections(snap: &[u8]) -> Vec<([u8; 4], Vec<u8>)> {
    format::split_sections(snap).unwrap()
}

fn assemble(version: u32, secs: &[([u8; 4], Vec<u8>)]) -> Vec<u8> {
    format::assemble(version, secs)
}

fn with_section(snap: &[u8], tag: [u8; 4], f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut secs = sections(snap);
    let s = secs.iter_mut().find(|(t, _)| *t == tag).unwrap();
    f(&mut s.1);
    assemble(format::VERSION, &secs)
}

/// Restoring `snap` into a fresh device fails; the device stays fresh and usable.
fn refused(ram: &[u8], snap: &[u8]) -> SnapshotError {
    let b = Bench::with_ram(cfg, ram);
    let e = b.gpu.restore(&mut &snap[..]).unwrap_err();
    assert_eq!(b.read(CHAN_BASE), 0, "nothing applied after {e}");
    assert_eq!(b.vram_read_u64(OUT), 0, "VRAM scrubbed after {e}");
    assert!(!b.gpu.is_paused());
    e
}

#[test]
fn a_foreign_backend_context_is_refused_and_hostile_snapshots_are_refused() {
    let a = Bench::with(cfg);
    setup(&a);
    submit_all(&a);
    // A snapshot with a job caught running.
    let (ram, snap) = loop {
        let (ram, snap, report) = snapshot(&a, PauseMode::Preempt);
        if report.suspended > 0 {
            break (ram, snap);
        }
        assert!(!done(&a), "no pause caught a job running");
        a.gpu.resume();
        std::thread::sleep(Duration::from_millis(2));
    };
    // Reassembling the sections gives the same bytes (the forgeries below are valid but for
    // what they forge).
    assert!(assemble(format::VERSION, &sections(&snap)) == snap);

    // The backend tag forged (checksum recomputed): refused before anything runs.
    let forged = with_section(&snap, format::CTXT, |p| {
        // u32 jobs, then the first: u32 channel, u32 name length, name.
        assert_eq!(&p[12..15], b"sim");
        p.splice(8..15, [4, 0, 0, 0, b'c', b'u', b'd', b'a']);
    });
    assert!(matches!(
        refused(&ram, &forged),
        SnapshotError::ForeignContext { saved, here } if saved == "cuda" && here == "sim"
    ));

    // Truncated anywhere.
    for cut in [
        0,
        5,
        11,
        12,
        20,
        100,
        snap.len() / 2,
        snap.len() - 9,
        snap.len() - 1,
    ] {
        let e = refused(&ram, &snap[..cut]);
        assert!(
            matches!(e, SnapshotError::Truncated(_) | SnapshotError::BadMagic),
            "cut at {cut}: {e}"
        );
    }
    // Corrupted (a VRAM byte): the checksum.
    let mut bad = snap.clone();
    let k = bad.len() - 100;
    bad[k] ^= 0x40;
    assert!(matches!(refused(&ram, &bad), SnapshotError::Checksum));
    // Bytes after the end.
    let mut long = snap.clone();
    long.push(0);
    assert!(matches!(refused(&ram, &long), SnapshotError::Trailing));
    // Wrong magic and version.
    let mut bad = snap.clone();
    bad[0] = b'X';
    assert!(matches!(refused(&ram, &bad), SnapshotError::BadMagic));
    let secs = sections(&snap);
    let next = format::VERSION + 1;
    assert!(matches!(
        refused(&ram, &assemble(next, &secs)),
        SnapshotError::Version(v) if v == next
    ));
    // Version 1 (before the PARA section) is refused by its number.
    assert!(matches!(
        refused(&ram, &assemble(1, &secs)),
        SnapshotError::Version(1)
    ));
    // Another configuration (VRAM size).
    let bad = with_section(&snap, format::CONF, |p| {
        p[..8].copy_from_slice(&(128u64 << 20).to_le_bytes())
    });
    assert!(matches!(
        refused(&ram, &bad),
        SnapshotError::Config {
            what: "VRAM size",
            ..
        }
    ));
    // A channel's instance block outside the partition (REGS: timer, 5 registers, runlist).
    let chan0 = 8 + 20 + 4 + 4 * CHANNELS as usize + 4;
    let bad = with_section(&snap, format::REGS, |p| {
        p[chan0..chan0 + 4].copy_from_slice(&(CHAN_INST_VALID | 0x0fff_ffff).to_le_bytes())
    });
    let e = refused(&ram, &bad);
    assert!(
        matches!(&e, SnapshotError::Invalid { section: "REGS", what } if what.contains("outside VRAM")),
        "{e}"
    );
    // A forged channel state.
    let bad = with_section(&snap, format::REGS, |p| {
        p[chan0 + 4..chan0 + 8].copy_from_slice(&9u32.to_le_bytes())
    });
    assert!(matches!(
        refused(&ram, &bad),
        SnapshotError::Invalid {
            section: "REGS",
            ..
        }
    ));
    // A VRAM run past the partition, and a section announcing more than the partition.
    let bad = with_section(&snap, format::VRAM, |p| {
        p[..8].copy_from_slice(&((VRAM >> 12) - 1).to_le_bytes())
    });
    assert!(matches!(
        refused(&ram, &bad),
        SnapshotError::Invalid {
            section: "VRAM",
            ..
        }
    ));
    let mut secs = sections(&snap);
    let last = secs.len() - 1;
    secs[last].1 = vec![0; (VRAM + VRAM / 4096 * 12 + 1) as usize];
    assert!(matches!(
        refused(&ram, &assemble(format::VERSION, &secs)),
        SnapshotError::SectionTooLarge { .. }
    ));
    // An oversized module text (length field) and an oversized context.
    let bad = with_section(&snap, format::MODS, |p| {
        p[4..8].copy_from_slice(&(MAX_CODE_LEN + 1).to_le_bytes())
    });
    assert!(matches!(
        refused(&ram, &bad),
        SnapshotError::Invalid {
            section: "MODS",
            ..
        }
    ));
    let bad = with_section(&snap, format::CTXT, |p| {
        // u32 jobs; u32 channel, u32 + "sim", u64, u32: the first context's length at 27.
        p[27..31].copy_from_slice(&u32::MAX.to_le_bytes())
    });
    assert!(matches!(
        refused(&ram, &bad),
        SnapshotError::Invalid {
            section: "CTXT",
            ..
        }
    ));
    // Context bytes the engine refuses (interpreter state cut short; checksum fixed).
    let bad = with_section(&snap, format::CTXT, |p| {
        let n = u32::from_le_bytes(p[27..31].try_into().unwrap()) as usize;
        p.truncate(31 + n / 2);
        p[27..31].copy_from_slice(&((n / 2) as u32).to_le_bytes());
        p[..4].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(matches!(refused(&ram, &bad), SnapshotError::Context(_)));
    // Sections out of order.
    let mut secs = sections(&snap);
    secs.swap(1, 2);
    assert!(matches!(
        refused(&ram, &assemble(format::VERSION, &secs)),
        SnapshotError::Section { .. }
    ));
    // The untouched snapshot still restores and finishes.
    drop(a);
    let b = restored(&ram, &snap);
    finish(&b);
    check_reference(&results(&b));
}

#[test]
fn save_needs_a_pause_and_restore_a_fresh_device() {
    let a = Bench::with(cfg);
    setup(&a);
    let mut out = Vec::new();
    assert!(matches!(
        a.gpu.save(&mut out),
        Err(SnapshotError::NotPaused)
    ));
    a.gpu.pause().unwrap();
    a.gpu.save(&mut out).unwrap();
    a.gpu.resume();
    assert!(matches!(
        a.gpu.restore(&mut &out[..]),
        Err(SnapshotError::NotFresh(0))
    ));
    // A para-mode GPU pauses and saves too (its state: vgpu/tests/para_snapshot.rs).
    let para = Bench::with(|c| c.mode = vgpu::config::Mode::Para);
    para.gpu.pause().unwrap();
    let mut para_out = Vec::new();
    para.gpu.save(&mut para_out).unwrap();
    para.gpu.resume();
    // A pass-through GPU (trusted guest, no isolation) is refused with a clear error, saving
    // and restoring alike.
    let pt = Bench::with(|c| c.mode = vgpu::config::Mode::Pt);
    let e = pt.gpu.pause().unwrap_err();
    assert!(matches!(e, SnapshotError::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("mode=pt"), "{e}");
    assert!(matches!(
        pt.gpu.restore(&mut &out[..]),
        Err(SnapshotError::Unsupported(_))
    ));
}

fn cfg_eager(c: &mut vgpu::GpuConfig) {
    cfg(c);
    c.lazy_shadowing = false;
}

#[test]
fn with_eager_shadowing_a_restored_device_rebuilds_and_flushes() {
    let want = uninterrupted();
    let a = Bench::with(cfg_eager);
    setup(&a);
    submit_all(&a);
    std::thread::sleep(Duration::from_millis(20));
    let (ram, snap, _) = snapshot(&a, PauseMode::Preempt);
    drop(a);
    let b = Bench::with_ram(cfg_eager, &ram);
    b.gpu.restore(&mut &snap[..]).unwrap();
    let restored_rebuilds = b.gpu.stats().counters.shadow_rebuilds;
    // A TLB flush after the restore: the write returns once the worker rebuilt every shadow.
    b.write(TLB_FLUSH, 1);
    finish(&b);
    same(&results(&b), &want, "eager shadowing after a restore");
    assert!(
        b.gpu.stats().counters.shadow_rebuilds > restored_rebuilds,
        "shadows are rebuilt on the restored device"
    );
}

#[test]
fn the_doorbell_page_is_saved_and_restored() {
    // The guest enabled its doorbell page (exitless submission): a restored device has the same
    // page, reads it back, and keeps polling/serving it, so the work finishes identically.
    let want = uninterrupted();
    let page = 0x3000u32;
    let a = Bench::with(cfg);
    a.write(vgpu::regs::BELL_PAGE_HI, 0);
    a.write(vgpu::regs::BELL_PAGE_LO, page | 1);
    let lo = a.read(vgpu::regs::BELL_PAGE_LO);
    assert_eq!(lo & !0xfff, page, "the page is taken: {lo:#x}");
    setup(&a);
    submit_all(&a);
    std::thread::sleep(Duration::from_millis(5));
    let (ram, snap, _) = snapshot(&a, PauseMode::Preempt);
    drop(a);
    let b = restored(&ram, &snap);
    assert_eq!(
        b.read(vgpu::regs::BELL_PAGE_LO),
        lo,
        "the restored device's page"
    );
    finish(&b);
    same(&results(&b), &want, "restored with a doorbell page");
}
