//! `decode`: a hostile guest that turns the GPU's PCI memory decode off and on while its jobs
//! run. Each of `rounds=` rounds (default 20) fills `mib=` MiB (default 4) of system memory
//! with that round's pattern, submits copies through two VRAM buffers and back (`reps=` times
//! the VRAM-to-VRAM copy, default 4), turns memory decode off and on `toggles=` times
//! (default 50) while the job runs — checking each time that BAR0 is silent while decode is
//! off and answers again after — then waits for the job (`timeout_s=`, driver option) and
//! checks the bytes. Prints `DECODE round=<r> ok=<0|1> toggles=<n> during=<n> wait_ms=<n>`
//! (during: toggles made before the job's fence passed) and `DECODE done ok=<n>/<rounds>`;
//! Then (unless `suite=0`) it runs every workload of the suite (small) with memory decode
//! turned off and on at each look the driver takes while it waits for a job (kernels and
//! module loads included), printing `DECODE suite name=<n> ok=<0|1>`.
//! Exits 0 only if every round and workload came back right. Driver options as for
//! `workloads`.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::format;
use alloc::vec;
use gpu_driver::{DmaBuf, Platform, PushBuf, suite_run};
use guest_programs::platform::{self, DEVICE_ID, VENDOR_ID};
use guest_rt::io::mmio_read32;
use guest_rt::pci::{self, Bar};
use guest_rt::println;

guest_rt::entry!(main);

/// The bare-metal platform, with memory decode turned off and on each time the driver waits
/// (polling a fence, or before sleeping on the interrupt): the GPU's job is running then.
struct Toggling {
    inner: platform::BareMetal,
    dev: u8,
    func: u8,
    cmd: u32,
    toggles: u64,
}

impl Toggling {
    fn toggle(&mut self) {
        pci::write32(self.dev, self.func, 0x04, self.cmd & !0x2);
        pci::write32(self.dev, self.func, 0x04, self.cmd);
        self.toggles += 1;
    }
}

impl Platform for Toggling {
    fn reg_read(&mut self, offset: u32) -> u32 {
        self.inner.reg_read(offset)
    }
    fn reg_write(&mut self, offset: u32, value: u32) {
        self.inner.reg_write(offset, value)
    }
    fn vram_read64(&mut self, addr: u64) -> u64 {
        self.inner.vram_read64(addr)
    }
    fn vram_write64(&mut self, addr: u64, value: u64) {
        self.inner.vram_write64(addr, value)
    }
    fn vram_aperture(&self) -> u64 {
        self.inner.vram_aperture()
    }
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        self.inner.dma_alloc(len, align)
    }
    fn wait_for_interrupt(&mut self, ns: u64) {
        self.toggle();
        self.inner.wait_for_interrupt(ns)
    }
    fn has_interrupts(&self) -> bool {
        self.inner.has_interrupts()
    }
    fn now_ns(&mut self) -> u64 {
        self.inner.now_ns()
    }
    fn relax(&mut self) {
        self.toggle();
    }
    fn para_read(&mut self, offset: u32) -> u32 {
        self.inner.para_read(offset)
    }
    fn para_write(&mut self, offset: u32, value: u32) {
        self.inner.para_write(offset, value)
    }
}

fn arg(key: &str, default: u64, max: u64) -> Option<u64> {
    match guest_rt::arg(key) {
        None => Some(default),
        Some(v) => v.parse::<u64>().ok().filter(|n| (1..=max).contains(n)),
    }
}

fn pattern(round: u64, buf: &mut [u8]) {
    let mut x = round.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for c in buf.chunks_mut(8) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

fn main() -> u8 {
    let (Some(rounds), Some(toggles), Some(mib), Some(reps)) = (
        arg("rounds", 20, 100_000),
        arg("toggles", 50, 100_000),
        arg("mib", 4, 64),
        arg("reps", 4, 64),
    ) else {
        println!("decode: bad argument (rounds=1.., toggles=1.., mib=1..64, reps=1..64)");
        return guest_rt::abi::exit_codes::BAD_ARGUMENT;
    };
    let Some(f) = pci::find(VENDOR_ID, DEVICE_ID) else {
        println!("decode: virtual GPU not found (run with --gpu)");
        return guest_rt::abi::exit_codes::NO_DEVICE;
    };
    let Some(Bar::Mem { addr: bar0, .. }) = f.bars[0] else {
        println!("decode: unexpected BAR0 {:?}", f.bars[0]);
        return guest_rt::abi::exit_codes::NO_DEVICE;
    };
    let cfg = platform::config_from_args();
    let cmd = pci::read32(f.dev, f.func, 0x04);
    let opened = platform::BareMetal::find(cfg.use_interrupts).and_then(|inner| {
        let p = Toggling {
            inner,
            dev: f.dev,
            func: f.func,
            cmd,
            toggles: 0,
        };
        suite_run::open(p, cfg).map_err(|e| format!("driver init: {e}"))
    });
    let (mut gpu, mut ch, _) = match opened {
        Ok(g) => g,
        Err(e) => {
            println!("decode: {e}");
            return guest_rt::abi::exit_codes::NO_DEVICE;
        }
    };
    let len = mib << 20;
    let bufs = (
        gpu.sys_alloc(len),
        gpu.vram_alloc(len),
        gpu.vram_alloc(len),
        gpu.sys_alloc(len),
    );
    let (Ok(src), Ok(a), Ok(b), Ok(dst)) = bufs else {
        println!("decode: cannot allocate 2 x {mib} MiB of system memory and of VRAM");
        return guest_rt::abi::exit_codes::NO_DEVICE;
    };
    let mut data = vec![0u8; len as usize];
    let mut back = vec![0u8; len as usize];
    let mut passed = 0;
    for round in 1..=rounds {
        pattern(round, &mut data);
        let mut ok = gpu.sys_write(&src, 0, &data).is_ok();
        let mut pb = PushBuf::new();
        pb.copy(src.va, a.va, len);
        for k in 0..reps {
            let (from, to) = if k % 2 == 0 {
                (a.va, b.va)
            } else {
                (b.va, a.va)
            };
            pb.copy(from, to, len);
        }
        let last = if reps % 2 == 1 { b.va } else { a.va };
        pb.copy(last, dst.va, len);
        let fence = match ch.submit(&mut gpu, &mut pb) {
            Ok(f) => f,
            Err(e) => {
                println!("decode: round {round}: submit: {e}");
                return 1;
            }
        };
        let (mut during, mut silent, mut answered) = (0, true, true);
        for _ in 0..toggles {
            if ch.slot_value(&gpu, 0).is_ok_and(|v| v != fence.seq) {
                during += 1;
            }
            pci::write32(f.dev, f.func, 0x04, cmd & !0x2);
            // SAFETY: BAR0 is the GPU's register BAR, identity-mapped; with decode off the read
            // reaches no device and reads all-ones.
            silent &= unsafe { mmio_read32(bar0) } == 0xffff_ffff;
            pci::write32(f.dev, f.func, 0x04, cmd);
            // SAFETY: as above, decoding again.
            answered &= unsafe { mmio_read32(bar0) } == gpu_driver::regs::ID_VALUE;
        }
        let t0 = guest_rt::time::ticks_to_ns(guest_rt::time::rdtsc());
        let waited = ch.wait(&mut gpu, fence);
        let wait_ms =
            guest_rt::time::ticks_to_ns(guest_rt::time::rdtsc()).saturating_sub(t0) / 1_000_000;
        if let Err(e) = &waited {
            println!("decode: round {round}: wait: {e}");
            ok = false;
        }
        if !silent || !answered {
            println!("decode: round {round}: BAR0 silent={silent} answered={answered}");
            ok = false;
        }
        ok &= waited.is_ok() && gpu.sys_read(&dst, 0, &mut back).is_ok() && back == data;
        passed += u64::from(ok);
        println!(
            "DECODE round={round} ok={} toggles={toggles} during={during} wait_ms={wait_ms}",
            u8::from(ok)
        );
        if waited.is_err() {
            let _ = ch.recover(&mut gpu);
        }
    }
    let mut total = rounds;
    if guest_rt::arg("suite") != Some("0") {
        for w in suite::all() {
            let before = gpu.platform().toggles;
            let inst = w.instance(suite::Size::Small);
            let out = suite_run::run_instance(&mut gpu, &mut ch, &inst, Default::default());
            if !out.ok {
                println!("decode: {} failed: {}", w.name, out.detail);
            }
            total += 1;
            passed += u64::from(out.ok);
            println!(
                "DECODE suite name={} ok={} toggles={}",
                w.name,
                u8::from(out.ok),
                gpu.platform().toggles - before
            );
        }
    }
    println!("DECODE done ok={passed}/{total}");
    if passed == total { 0 } else { 1 }
}
