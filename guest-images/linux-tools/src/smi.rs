//! `vgpu-smi`: what nvidia-smi and lspci would tell about the virtual GPU, from its PCI
//! function and its identity registers (a dozen BAR0 reads; the device is not initialised).

use gpu_driver::{Platform, regs};

use crate::ToolError;
use crate::pci::{class_name, lspci_line};
use crate::platform::LinuxGpu;

fn reg64<P: Platform>(p: &mut P, lo: u32, hi: u32) -> u64 {
    u64::from(p.reg_read(lo)) | (u64::from(p.reg_read(hi)) << 32)
}

/// The `vgpu-smi` command.
pub fn main(argv: &[String]) -> Result<u8, ToolError> {
    if !argv.is_empty() {
        return Err(ToolError::Bad("usage: vgpu-smi".into()));
    }
    let mut g = LinuxGpu::open(false)?;
    let f = g.function.clone();
    let id = g.reg_read(regs::ID);
    if id != regs::ID_VALUE {
        return Err(ToolError::Bad(format!(
            "{}: ID register reads {id:#x}, not a vgpu device",
            f.slot
        )));
    }
    let version = g.reg_read(regs::VERSION);
    let vram = reg64(&mut g, regs::VRAM_SIZE_LO, regs::VRAM_SIZE_HI);
    let channels = g.reg_read(regs::CHANNELS);
    let pages = g.reg_read(regs::PAGE_SIZES);
    let va_base = reg64(&mut g, regs::VA_BASE_LO, regs::VA_BASE_HI);
    let va_size = reg64(&mut g, regs::VA_SIZE_LO, regs::VA_SIZE_HI);
    let caps = g.reg_read(regs::CAPS);
    let push = g.reg_read(regs::MAX_PUSH_WORDS);
    let para = caps & regs::CAP_PARA != 0 && g.has_para_bar();
    println!("{}", lspci_line(&f));
    println!(
        "  Product        : vgpu virtual GPU ({})",
        class_name(f.class)
    );
    println!("  Bus id         : {}", f.slot);
    println!("  Version        : {}.{}", version >> 16, version & 0xffff);
    println!("  VRAM           : {} MiB", vram >> 20);
    println!(
        "  BAR0 registers : {:#x} ({} KiB)",
        f.bar_addr(0),
        f.bar_size(0) >> 10
    );
    println!(
        "  BAR1 aperture  : {:#x} ({} MiB)",
        f.bar_addr(1),
        f.bar_size(1) >> 20
    );
    println!("  Channels       : {channels}");
    println!("  GPU VA         : {va_base:#x} + {va_size:#x}");
    println!("  Page sizes     : {pages:#x}");
    println!("  Max push words : {push}");
    println!("  Caps           : {caps:#x}");
    println!(
        "  Mode           : {}",
        if para {
            "para (hypercall BAR3 present)"
        } else {
            "full (trapped registers and aperture)"
        }
    );
    Ok(0)
}
