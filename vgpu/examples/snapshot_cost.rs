//! What a virtual GPU snapshot costs: time and size of `pause` + `save` and of `restore` for a
//! partition with `--mib` MiB of VRAM in use (written through the BAR1 aperture with a
//! pseudo-random pattern, so no page is all zero), on the sim backend. Prints one line per step.
//!
//! `cargo run --release -p vgpu --example snapshot_cost -- [--mib 256] [--vram-mib 512] [--out FILE]`
//! (`--out`: also save to a new file, which must not exist, and restore from it).

use std::sync::Arc;
use std::time::Instant;

use mmio::pci::{MsiMessage, PciDevice};
use vgpu::{GpuConfig, IrqSink, Vgpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

struct NoIrq;

impl IrqSink for NoIrq {
    fn msi(&self, _: MsiMessage) {}
    fn intx(&self, _: bool) {}
}

fn device(vram: u64) -> Vgpu {
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).expect("RAM");
    let cfg = GpuConfig {
        vram,
        ..GpuConfig::default()
    };
    Vgpu::new(cfg, ram, Arc::new(NoIrq)).expect("device")
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = arg(&args, "--mib").map_or(Ok(256), |v| v.parse())?;
    let vram_mib: u64 = arg(&args, "--vram-mib").map_or(Ok(512), |v| v.parse())?;
    let out = arg(&args, "--out").map(std::path::PathBuf::from);
    if mib > vram_mib {
        return Err("--mib is more than --vram-mib".into());
    }
    if let Some(p) = &out
        && p.exists()
    {
        return Err(format!("{} exists; not overwriting it", p.display()).into());
    }
    let a = device(vram_mib << 20);
    {
        let dev = a.device();
        let mut d = dev.lock().map_err(|_| "device lock")?;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut chunk = vec![0u8; 1 << 20];
        for m in 0..mib {
            for w in chunk.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            d.bar_write(1, m << 20, &chunk);
        }
    }
    let t = Instant::now();
    a.pause()?;
    let pause = t.elapsed();
    let t = Instant::now();
    let mut snap = Vec::with_capacity(((mib + 1) << 20) as usize);
    let report = a.save_report(&mut snap)?;
    let save = t.elapsed();
    println!(
        "vram {vram_mib} MiB, {mib} MiB in use: pause {:.3} ms, save to memory {:.1} ms, \
         {} bytes ({} of VRAM), {:.0} MiB/s",
        pause.as_secs_f64() * 1e3,
        save.as_secs_f64() * 1e3,
        report.bytes,
        report.vram_bytes,
        report.bytes as f64 / (1 << 20) as f64 / save.as_secs_f64()
    );
    drop(a);
    let b = device(vram_mib << 20);
    let t = Instant::now();
    b.restore(&mut &snap[..])?;
    let restore = t.elapsed();
    println!(
        "restore from memory {:.1} ms, {:.0} MiB/s",
        restore.as_secs_f64() * 1e3,
        report.bytes as f64 / (1 << 20) as f64 / restore.as_secs_f64()
    );
    if let Some(p) = out {
        b.pause()?;
        let t = Instant::now();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)?;
        let mut w = std::io::BufWriter::with_capacity(4 << 20, f);
        b.save(&mut w)?;
        drop(w);
        let save = t.elapsed();
        drop(b);
        let c = device(vram_mib << 20);
        let t = Instant::now();
        let mut r = std::io::BufReader::with_capacity(4 << 20, std::fs::File::open(&p)?);
        c.restore(&mut r)?;
        println!(
            "save to {} {:.1} ms, restore from it {:.1} ms",
            p.display(),
            save.as_secs_f64() * 1e3,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}
