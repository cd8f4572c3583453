//! `vgpu-run suite [size=small|medium|large] [only=NAME] [mode=full] [tables=vram|sysmem]
//! [para_batch=1] [sys_mib=N] [timeout_s=N] [ptx=vram] [buffers=sysmem]`: the workload suite
//! through gpu-driver from Linux user space, with the bare `workloads` guest's output (`INIT`,
//! one `RESULT name=.. ok=.. gpu_us=.. exits=.. upload_ns=..` line per workload, a summary) and
//! exit code (0 all ok, 1 a workload failed, 2 bad argument, 3 no GPU / driver set-up failed).

use gpu_driver::suite_run::{self, Options};
use gpu_driver::{Config, Gpu, TablePlacement};
use suite::Size;

use crate::ToolError;
use crate::args::Args;
use crate::platform::LinuxGpu;

const KNOWN: &[&str] = &[
    "size",
    "only",
    "mode",
    "tables",
    "para_batch",
    "sys_mib",
    "timeout_s",
    "ptx",
    "buffers",
];

/// Driver settings from the arguments (the bare guest's names and ranges).
pub fn config(a: &Args) -> Result<Config, ToolError> {
    let mut cfg = Config::default();
    match a.get("tables") {
        None | Some("vram") => {}
        Some("sysmem") => cfg.tables = TablePlacement::Sysmem,
        Some(t) => return Err(ToolError::Bad(format!("tables={t}: vram or sysmem"))),
    }
    match a.get("mode") {
        None | Some("para") => cfg.para = true,
        Some("full") => cfg.para = false,
        Some(m) => return Err(ToolError::Bad(format!("mode={m}: full or para"))),
    }
    cfg.para_per_page = a.get("para_batch") == Some("1");
    if a.get("sys_mib").is_some() {
        cfg.sys_pool_bytes = a.num("sys_mib", 8)?.clamp(2, 2048) << 20;
    }
    if a.get("timeout_s").is_some() {
        cfg.wait_timeout_ns = a.num("timeout_s", 60)?.clamp(1, 3600) * 1_000_000_000;
    }
    cfg.use_interrupts = false;
    Ok(cfg)
}

/// Opens the GPU and the driver with channel 0, printing the `INIT` line.
pub fn open(cfg: Config) -> Result<(Gpu<LinuxGpu>, gpu_driver::Channel), ToolError> {
    let p = LinuxGpu::open(true)?;
    let (gpu, ch, init) = suite_run::open(p, cfg)?;
    let info = *gpu.info();
    println!(
        "workloads: gpu vram={} MiB channels={} va={:#x}+{:#x} caps={:#x} max_push={} tables={:?} para={} irq=false init_exits={}",
        info.vram_size >> 20,
        info.channels,
        info.va_base,
        info.va_size,
        info.caps,
        info.max_push_words,
        cfg.tables,
        cfg.para && info.caps & gpu_driver::regs::CAP_PARA != 0,
        gpu.mmio_count()
    );
    println!("INIT init_ns={} init_exits={}", init.ns, init.mmio);
    Ok((gpu, ch))
}

/// The `vgpu-run suite` command.
pub fn main(a: &Args) -> Result<u8, ToolError> {
    if let Err(e) = a.only(KNOWN) {
        println!("vgpu-run: {e}");
        return Ok(2);
    }
    let size = match a.get("size").map(Size::from_name) {
        None => Size::Small,
        Some(Some(s)) => s,
        Some(None) => {
            println!("vgpu-run: size must be small, medium or large");
            return Ok(2);
        }
    };
    let cfg = match config(a) {
        Ok(c) => c,
        Err(e) => {
            println!("vgpu-run: {e}");
            return Ok(2);
        }
    };
    let opts = Options {
        ptx_in_vram: a.get("ptx") == Some("vram"),
        buffers_in_sysmem: a.get("buffers") == Some("sysmem"),
    };
    let only = a.get("only");
    let (mut gpu, mut ch) = match open(cfg) {
        Ok(g) => g,
        Err(e) => {
            println!("workloads: driver init: {e}");
            return Ok(3);
        }
    };
    let (mut total, mut passed) = (0, 0);
    for w in suite::all().filter(|w| only.is_none_or(|o| o == w.name)) {
        let inst = w.instance(size);
        let out = suite_run::run_instance(&mut gpu, &mut ch, &inst, opts);
        total += 1;
        passed += usize::from(out.ok);
        if !out.ok {
            println!("workloads: {} failed: {}", w.name, out.detail);
        }
        let (u, k, d, f) = (out.upload, out.kernel, out.download, out.free);
        println!(
            "RESULT name={} ok={} gpu_us={} exits={} upload_ns={} kernel_ns={} download_ns={} free_ns={} upload_exits={} kernel_exits={} download_exits={} free_exits={}",
            w.name,
            u8::from(out.ok),
            out.gpu_ns / 1000,
            out.exits,
            u.ns,
            k.ns,
            d.ns,
            f.ns,
            u.mmio,
            k.mmio,
            d.mmio,
            f.mmio
        );
    }
    println!("workloads: {passed}/{total} ok (size {})", size.name());
    Ok(if total > 0 && passed == total { 0 } else { 1 })
}
