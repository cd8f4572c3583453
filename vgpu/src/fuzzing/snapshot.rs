//! Fuzz harness of snapshot restore (`crate::snapshot`): hostile snapshot files restored into a
//! fresh device on the sim engine. The first input byte picks the mode: bit 0 raw (the rest is
//! the file) or structured (the rest edits the sections of a real snapshot, which is then
//! reassembled with a valid checksum, so that the edits reach the section decoders); bit 1 a
//! para-virtual device (`mode=para`) and a para snapshot (spaces made with hypercalls, a
//! VRAM_ALLOC block), whose PARA section the edits then reach; bit 2 the file path
//! (`Vgpu::restore_file` from an in-memory file, its VRAM read by lanes at offsets; an accepted
//! image saved again with `save_file` must equal the stream save byte for byte). Checked:
//! no panic; a refused restore leaves the device as created (no channel bound, the partition's
//! structures zeroed, the device not paused); an accepted one leaves every bound channel's
//! instance block inside the partition and the device able to pause and save again; the VRAM
//! guards around the partition stay intact either way (the isolation invariant).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mmio::pci::{MsiMessage, PciDevice};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::regs::method::*;
use crate::regs::*;
use crate::snapshot::format;
use crate::state::IrqSink;
use crate::{GpuConfig, Vgpu};

/// The smallest partition (the sim engine's reads dominate an execution under coverage).
const VRAM: u64 = 2 << 20;
const RAM: u64 = 4 << 20;
/// Guest VRAM addresses: page directory, instance block, runlist.
const PD: u64 = 0x10_0000;
const INST: u64 = 0x18_0000;
const LIST: u64 = 0x18_8000;
/// Guest RAM mapped at VA_BASE + 2 MiB.
const SYS: u64 = 0x20_0000;
/// Most section edits per input.
const MAX_EDITS: usize = 16;

struct NoIrq;

impl IrqSink for NoIrq {
    fn msi(&self, _: MsiMessage) {}
    fn intx(&self, _: bool) {}
}

fn config(job_timeout: Duration, para: bool) -> GpuConfig {
    GpuConfig {
        vram: VRAM,
        channels: 2,
        guard: 2 << 20,
        hostmem: 16 << 20,
        job_timeout,
        mode: if para {
            crate::config::Mode::Para
        } else {
            crate::config::Mode::Full
        },
        ..GpuConfig::default()
    }
}

fn device(job_timeout: Duration) -> (Vgpu, GuestMemoryMmap) {
    device_in(job_timeout, false)
}

fn device_in(job_timeout: Duration, para: bool) -> (Vgpu, GuestMemoryMmap) {
    let ram =
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).expect("guest RAM");
    let gpu = Vgpu::new(config(job_timeout, para), ram.clone(), Arc::new(NoIrq)).expect("device");
    (gpu, ram)
}

/// The para argument area (guest RAM, below `SYS`).
const ARGS: u64 = 0x10_0000;

/// A hypercall: `arg`, `count` and entries (VA, PTE, pages) in the argument area, then CALL.
fn hypercall(
    gpu: &Vgpu,
    ram: &GuestMemoryMmap,
    op: u32,
    arg: u64,
    entries: &[(u64, u64, u32)],
) -> u32 {
    use crate::para::*;
    let put = |off: u64, b: &[u8]| ram.write_slice(b, GuestAddress(ARGS + off)).expect("RAM");
    put(OFF_ARG, &arg.to_le_bytes());
    put(OFF_COUNT, &(entries.len() as u64).to_le_bytes());
    for (i, (va, pte, pages)) in entries.iter().enumerate() {
        let mut e = [0u8; ENTRY_BYTES];
        e[0..8].copy_from_slice(&va.to_le_bytes());
        e[8..16].copy_from_slice(&pte.to_le_bytes());
        e[16..20].copy_from_slice(&pages.to_le_bytes());
        put(OFF_ENTRIES + (i * ENTRY_BYTES) as u64, &e);
    }
    write(gpu, 3, u64::from(ARGS_LO), &(ARGS as u32).to_le_bytes());
    write(gpu, 3, u64::from(ARGS_HI), &0u32.to_le_bytes());
    write(gpu, 3, u64::from(CALL), &op.to_le_bytes());
    read_bar3(gpu, STATUS) & 0xff
}

fn read_bar3(gpu: &Vgpu, off: u32) -> u32 {
    let dev = gpu.device();
    let mut d = dev
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut b = [0u8; 4];
    d.bar_read(3, u64::from(off), &mut b);
    u32::from_le_bytes(b)
}

/// A real para snapshot: a page directory selected with SET_PD, VRAM (one 2 MiB page) and
/// guest RAM mapped with MAP_BATCH, a VRAM_ALLOC block.
fn para_base() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        use crate::para::*;
        let (gpu, ram) = device_in(Duration::from_secs(30), true);
        let va = gpu_va_base();
        assert_eq!(hypercall(&gpu, &ram, OP_SET_PD, PD | 1, &[]), ST_OK);
        let entries = [(va, 1 << 2 | 1, 1), (va + (2 << 20), SYS | 2, 16)];
        assert_eq!(hypercall(&gpu, &ram, OP_MAP_BATCH, 0, &entries), ST_OK);
        assert_eq!(hypercall(&gpu, &ram, OP_VRAM_ALLOC, 64 << 10, &[]), ST_OK);
        gpu.pause().expect("pause");
        let mut out = Vec::new();
        gpu.save(&mut out).expect("save");
        out
    })
}

fn write(gpu: &Vgpu, bar: usize, off: u64, data: &[u8]) {
    let dev = gpu.device();
    let mut d = dev
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    d.bar_write(bar, off, data);
}

fn read(gpu: &Vgpu, bar: usize, off: u64) -> u64 {
    let dev = gpu.device();
    let mut d = dev
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut b = [0u8; 8];
    let n = if bar == 0 { 4 } else { 8 };
    d.bar_read(bar, off, &mut b[..n]);
    u64::from_le_bytes(b)
}

const KERNEL: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
    .visible .entry k(.param .u64 out)\n{\n\t.reg .b32 %r<2>;\n\t.reg .b64 %rd<2>;\n\
    \tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, 7;\n\tst.global.u32 [%rd1], %r1;\n\tret;\n}\n";

/// A real snapshot: a channel that ran a copy, a kernel and a release, then waits on an
/// acquire that never comes (so its pushbuffer position and method state are saved), with a
/// cached module and VRAM holding the page directory, instance block and results.
fn base() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let (gpu, ram) = device(Duration::from_secs(30));
        let va = |off: u64| gpu_va_base() + (2 << 20) + off;
        write(&gpu, 1, PD, &(1u64 << 2 | 1).to_le_bytes());
        write(&gpu, 1, PD + 8, &(SYS | 1 << 2 | 2).to_le_bytes());
        for (i, v) in [PD | 1, va(0), 16, 0].iter().enumerate() {
            write(&gpu, 1, INST + 8 * i as u64, &v.to_le_bytes());
        }
        write(
            &gpu,
            0,
            u64::from(CHAN_BASE),
            &(CHAN_INST_VALID | (INST >> 12) as u32).to_le_bytes(),
        );
        write(&gpu, 1, LIST, &0u32.to_le_bytes());
        write(
            &gpu,
            0,
            u64::from(RUNLIST_BASE),
            &((LIST >> 12) as u32).to_le_bytes(),
        );
        write(&gpu, 0, u64::from(RUNLIST_SUBMIT), &1u32.to_le_bytes());
        write(&gpu, 0, u64::from(TLB_FLUSH), &1u32.to_le_bytes());
        write(&gpu, 1, 0x1000, &[0x5a; 256]);
        let put = |off: u64, b: &[u8]| ram.write_slice(b, GuestAddress(SYS + off)).expect("RAM");
        put(0x10_0000, KERNEL.as_bytes());
        put(0x18_0000, b"k");
        put(0x18_0100, &(gpu_va_base() + 0x3000).to_le_bytes());
        let hi = |v: u64| (v >> 32) as u32;
        let (src, dst, sem) = (
            gpu_va_base() + 0x1000,
            gpu_va_base() + 0x2000,
            va(0x1f_0000),
        );
        let (code, entry, p) = (va(0x10_0000), va(0x18_0000), va(0x18_0100));
        let mut words = Vec::new();
        let mut method = |addr: u32, data: &[u32]| {
            words.push(crate::pushbuf::incr(addr, data.len() as u32));
            words.extend_from_slice(data);
        };
        method(
            COPY_SRC_HI,
            &[hi(src), src as u32, hi(dst), dst as u32, 256, 0],
        );
        method(
            CODE_HI,
            &[
                hi(code),
                code as u32,
                KERNEL.len() as u32,
                hi(entry),
                entry as u32,
                1,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                hi(p),
                p as u32,
                8,
                0,
            ],
        );
        method(SEM_ADDR_HI, &[hi(sem), sem as u32, 1, SEM_OP_RELEASE]);
        method(SEM_ADDR_HI, &[hi(sem), sem as u32, 2, SEM_OP_ACQUIRE]);
        let pb: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        put(0x1000, &pb);
        put(
            0,
            &(va(0x1000) | ((words.len() as u64) << 48)).to_le_bytes(),
        );
        write(&gpu, 0, u64::from(DOORBELL_BASE), &1u32.to_le_bytes());
        let t = Instant::now();
        let mut sem_now = [0u8; 4];
        while sem_now != 1u32.to_le_bytes() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the base work did not run"
            );
            std::thread::sleep(Duration::from_millis(1));
            ram.read_slice(&mut sem_now, GuestAddress(SYS + 0x1f_0000))
                .expect("RAM");
        }
        gpu.pause().expect("pause");
        let mut out = Vec::new();
        gpu.save(&mut out).expect("save");
        out
    })
}

fn gpu_va_base() -> u64 {
    GpuConfig::default().va_base
}

/// Applies the edits in `data` to the base snapshot's sections (`para`: the para one's).
fn edited(data: &[u8], para: bool) -> Vec<u8> {
    let base = if para { para_base() } else { base() };
    let mut secs = format::split_sections(base).expect("base framing");
    let n = secs.len();
    for op in data.chunks_exact(6).take(MAX_EDITS) {
        let at = usize::from(u16::from_le_bytes([op[2], op[3]]));
        let v = u16::from_le_bytes([op[4], op[5]]);
        if op[1] % 5 == 4 {
            secs.swap(at % n, usize::from(v) % n);
            continue;
        }
        let s = &mut secs[usize::from(op[0]) % n].1;
        match op[1] % 5 {
            0 if !s.is_empty() => {
                let k = at % s.len();
                s[k] = v as u8;
            }
            1 if s.len() >= 4 => {
                // A u32 field: small values, the extremes.
                let k = at % (s.len() - 3);
                let x = match v % 4 {
                    0 => u32::from(v >> 2),
                    1 => u32::MAX - u32::from(v >> 2),
                    2 => 1 << ((v >> 2) % 32),
                    _ => u32::from(v),
                };
                s[k..k + 4].copy_from_slice(&x.to_le_bytes());
            }
            2 => s.truncate(at % (s.len() + 1)),
            3 => {
                let k = at % (s.len() + 1);
                s.splice(k..k, std::iter::repeat_n(v as u8, usize::from(v % 64)));
            }
            _ => {}
        }
    }
    format::assemble(format::VERSION, &secs)
}

/// Restores `data`'s snapshot into a fresh device and checks the invariants.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let para = mode & 2 != 0;
    let snap = match mode & 1 {
        0 => rest.to_vec(),
        _ => edited(rest, para),
    };
    let (gpu, _ram) = device_in(Duration::from_millis(100), para);
    // Bit 2: through the file path (lanes reading at offsets), which must refuse and accept
    // what the stream path does.
    let from_file = mode & 4 != 0;
    let restored = if from_file {
        gpu.restore_file(&mem_file(&snap), None)
    } else {
        gpu.restore(&mut &snap[..])
    };
    match restored {
        Err(_) => {
            assert!(!gpu.is_paused(), "a refused restore left the device paused");
            if let Some(p) = gpu.stats().para {
                // No para space or counter of the refused snapshot stayed behind.
                assert_eq!(p.hypercalls, 0, "para state applied by a refused restore");
            }
            for ch in 0..2u64 {
                assert_eq!(
                    read(&gpu, 0, u64::from(CHAN_BASE) + 8 * ch),
                    0,
                    "channel bound"
                );
            }
            for addr in [PD, INST, 0x1000, 0x2000] {
                assert_eq!(read(&gpu, 1, addr), 0, "VRAM {addr:#x} not scrubbed");
            }
        }
        Ok(()) => {
            for ch in 0..2u64 {
                let inst = read(&gpu, 0, u64::from(CHAN_BASE) + 8 * ch) as u32;
                if inst & CHAN_INST_VALID != 0 {
                    let addr = u64::from(inst & CHAN_INST_ADDR_MASK) << 12;
                    assert!(addr + 4096 <= VRAM, "instance block outside the partition");
                }
            }
            gpu.pause().expect("pause after a restore");
            let mut again = Vec::new();
            let report = gpu.save_report(&mut again).expect("save after a restore");
            assert!(format::split_sections(&again).is_some());
            if from_file {
                // The file path writes the same sections (REGS holds TIMER, which moves on
                // between the two saves), with the CRC-32 of its own bytes.
                let f = mem_file(&[0xee; 3]);
                let r = gpu.save_file(&f).expect("save to a file after a restore");
                let mut back = vec![0u8; again.len() + 64];
                let n = std::os::unix::fs::FileExt::read_at(&f, &mut back, 0).unwrap_or(0);
                back.truncate(n);
                assert_eq!(
                    (r.bytes, r.crc32),
                    (n as u64, snapfmt::Crc::of(&back).value)
                );
                assert_eq!(report.crc32, snapfmt::Crc::of(&again).value);
                let secs = |b: &[u8]| {
                    let mut v = format::split_sections(b).expect("sections");
                    v.retain(|(t, _)| *t != format::REGS);
                    v
                };
                assert!(secs(&back) == secs(&again), "file and stream differ");
            }
            gpu.resume();
        }
    }
    assert!(gpu.stats().guard_intact, "VRAM guards changed");
}

/// An anonymous in-memory file (`memfd_create`) holding `bytes`.
fn mem_file(bytes: &[u8]) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain syscall with a NUL-terminated name; it returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"vgpu-fuzz-snapshot".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    std::os::unix::fs::FileExt::write_all_at(&f, bytes, 0).expect("write the memory file");
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_snapshot_restores_and_edits_reach_the_decoders() {
        // Unedited: accepted (the harness gets past the framing and every decoder).
        let snap = edited(&[], false);
        assert_eq!(snap, base());
        let (gpu, _ram) = device(Duration::from_millis(100));
        gpu.restore(&mut &snap[..])
            .expect("the base snapshot restores");
        assert_eq!(
            read(&gpu, 0, u64::from(CHAN_BASE)) as u32,
            CHAN_INST_VALID | (INST >> 12) as u32
        );
        assert_eq!(
            read(&gpu, 1, 0x2000),
            0x5a5a_5a5a_5a5a_5a5a,
            "the copied bytes"
        );
        run(&[1]);
        // An edit inside REGS (a channel's state) is refused by its decoder, not the checksum.
        let secs = format::split_sections(base()).unwrap();
        let regs = secs.iter().position(|(t, _)| *t == format::REGS).unwrap() as u8;
        let edit = [regs, 1, 40, 0, 0xff, 0xff];
        let (gpu, _ram) = device(Duration::from_millis(100));
        let e = gpu.restore(&mut &edited(&edit, false)[..]).unwrap_err();
        assert!(
            matches!(
                e,
                crate::snapshot::SnapshotError::Invalid {
                    section: "REGS",
                    ..
                }
            ),
            "{e}"
        );
        run(&[[1].as_slice(), &edit].concat());
        // The same through the file path.
        run(&[5]);
        run(&[[5].as_slice(), &edit].concat());
        let (gpu, _ram) = device(Duration::from_millis(100));
        let e = gpu
            .restore_file(&mem_file(&edited(&edit, false)), None)
            .unwrap_err();
        assert!(
            matches!(
                e,
                crate::snapshot::SnapshotError::Invalid {
                    section: "REGS",
                    ..
                }
            ),
            "{e}"
        );
        // A truncated file, and a whole-file CRC-32 other than the one recorded.
        let b = base();
        let (gpu, _ram) = device(Duration::from_millis(100));
        let e = gpu
            .restore_file(&mem_file(&b[..b.len() - 30]), None)
            .unwrap_err();
        assert!(
            matches!(e, crate::snapshot::SnapshotError::Truncated(_)),
            "{e}"
        );
        let (gpu, _ram) = device(Duration::from_millis(100));
        let crc = snapfmt::Crc::of(b).value;
        let e = gpu
            .restore_file(&mem_file(b), Some((b.len() as u64, crc ^ 1)))
            .unwrap_err();
        assert!(
            matches!(e, crate::snapshot::SnapshotError::FileChecksum { .. }),
            "{e}"
        );
        assert_eq!(read(&gpu, 1, 0x2000), 0, "VRAM scrubbed");
        let (gpu, _ram) = device(Duration::from_millis(100));
        gpu.restore_file(&mem_file(b), Some((b.len() as u64, crc)))
            .expect("the recorded length and CRC-32 match");
    }

    #[test]
    fn the_para_base_restores_and_edits_reach_the_para_decoder() {
        let snap = edited(&[], true);
        assert_eq!(snap, para_base());
        let (gpu, _ram) = device_in(Duration::from_millis(100), true);
        gpu.restore(&mut &snap[..]).expect("the para base restores");
        assert_eq!(gpu.stats().para.expect("para").hypercalls, 3);
        run(&[3]);
        // A byte of the first run's VA (in the window's top byte) is refused by the PARA
        // decoder, not by the checksum.
        let secs = format::split_sections(para_base()).unwrap();
        let para = secs.iter().position(|(t, _)| *t == format::PARA).unwrap() as u8;
        let edit = [para, 0, 85, 0, 0x7f, 0];
        let (gpu, _ram) = device_in(Duration::from_millis(100), true);
        let e = gpu.restore(&mut &edited(&edit, true)[..]).unwrap_err();
        assert!(
            matches!(
                e,
                crate::snapshot::SnapshotError::Invalid {
                    section: "PARA",
                    ..
                }
            ),
            "{e}"
        );
        run(&[[3].as_slice(), &edit].concat());
    }

    #[test]
    fn random_inputs_keep_the_invariants() {
        base();
        for (i, input) in crate::fuzzing::random_inputs(0x5a4b, 120, 64)
            .iter()
            .enumerate()
        {
            if i % 4 == 0 {
                // Some raw inputs: a real header, then noise.
                let mut raw = vec![0u8];
                raw.extend_from_slice(&base()[..12]);
                raw.extend_from_slice(input);
                run(&raw);
            } else {
                run(input);
            }
        }
    }
}
