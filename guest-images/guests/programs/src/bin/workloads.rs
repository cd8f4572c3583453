//! `workloads`: runs every workload of the suite (`size=small|medium|large|xl`, default small;
//! xl is for real GPUs: on the sim backend it takes many minutes;
//! `only=NAME` for one) on the virtual GPU through gpu-driver and checks the results in the
//! guest. Prints `RESULT name=<name> ok=<0|1> gpu_us=<n> exits=<n>` per workload (gpu_us:
//! device TIMER between semaphore releases around the launches; exits: the driver's MMIO
//! accesses for that workload; then per phase of `gpu_driver::suite_run` its wall time and MMIO
//! accesses: `upload_ns= kernel_ns= download_ns= free_ns= upload_exits= ...`, and the download
//! phase's two parts `download_copy_ns= download_read_ns=` with their exits, and
//! `download_reread_ns=`: the same reads again, outside the phases), after one
//! `INIT init_ns=<n> init_exits=<n> init_probe_ns= init_tables_ns= init_pool_alloc_ns=
//! init_pool_warm_ns= init_map_ns= init_channel_ns=` line (driver initialisation and channel
//! creation, and its parts: `gpu_driver::InitParts`), and a last `HEAP used_mib=<n>` line (the
//! heap's high-water mark: what `--memory` must hold), and exits 0 only if all were ok. Driver options: see
//! `guest_programs::platform::config_from_args` (`tables=`, `wait=`, `sys_mib=`, `timeout_s=`);
//! placement: `ptx=vram`, `buffers=sysmem` (see `guest_programs::runner::RunOpts`).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use gpu_driver::suite_run;
use guest_programs::{platform, runner};
use guest_rt::println;
use suite::Size;

guest_rt::entry!(main);

fn main() -> u8 {
    let size = match guest_rt::arg("size").map(Size::from_name) {
        None => Size::Small,
        Some(Some(s)) => s,
        Some(None) => {
            println!("workloads: size must be small, medium, large or xl");
            return guest_rt::abi::exit_codes::BAD_ARGUMENT;
        }
    };
    let only = guest_rt::arg("only");
    let info = guest_rt::boot_info();
    let ram_mib = (info.mem_below_4g + info.mem_above_4g) >> 20;
    if ram_mib < size.guest_ram_mib() {
        println!(
            "workloads: size={} needs --memory {} (guest RAM in MiB; this VM has {ram_mib})",
            size.name(),
            size.guest_ram_mib()
        );
        return guest_rt::abi::exit_codes::BAD_ARGUMENT;
    }
    let mut cfg = platform::config_from_args();
    if guest_rt::arg("sys_mib").is_none() {
        // The driver's GPU-visible system-memory pool, sized for the chosen size.
        cfg.sys_pool_bytes = cfg.sys_pool_bytes.max(size.sys_pool_mib() << 20);
    }
    let opts = runner::RunOpts::from_args();
    let opened = platform::BareMetal::find(cfg.use_interrupts)
        .and_then(|p| suite_run::open(p, cfg).map_err(|e| format!("driver init: {e}")));
    let (mut gpu, mut ch, init) = match opened {
        Ok(g) => g,
        Err(e) => {
            println!("workloads: {e}");
            return guest_rt::abi::exit_codes::NO_DEVICE;
        }
    };
    let info = *gpu.info();
    if let Some(need) = size.vram_mib()
        && info.vram_size >> 20 < need
    {
        println!(
            "workloads: size={} needs --gpu vram={need}M (this GPU has {} MiB)",
            size.name(),
            info.vram_size >> 20
        );
        return guest_rt::abi::exit_codes::BAD_ARGUMENT;
    }
    if size.real_gpu_only() {
        println!(
            "workloads: size={} is for real GPUs (--gpu backend=cuda): on the sim backend it takes many minutes",
            size.name()
        );
    }
    println!(
        "workloads: gpu vram={} MiB channels={} va={:#x}+{:#x} caps={:#x} max_push={} tables={:?} irq={} init_exits={}",
        info.vram_size >> 20,
        info.channels,
        info.va_base,
        info.va_size,
        info.caps,
        info.max_push_words,
        cfg.tables,
        gpu.interrupts_on(),
        gpu.mmio_count()
    );
    let mut parts = String::new();
    for (name, ns) in gpu.init_parts().named() {
        parts.push_str(&format!(" init_{name}_ns={ns}"));
    }
    println!("INIT init_ns={} init_exits={}{parts}", init.ns, init.mmio);
    let (mut total, mut passed) = (0, 0);
    for w in suite::all().filter(|w| only.is_none_or(|o| o == w.name)) {
        let inst = w.instance(size);
        let out = runner::run_instance(&mut gpu, &mut ch, &inst, opts);
        total += 1;
        passed += usize::from(out.ok);
        if !out.ok {
            println!("workloads: {} failed: {}", w.name, out.detail);
        }
        let (u, k, d, f) = (out.upload, out.kernel, out.download, out.free);
        let (dc, dr) = (out.download_copy, out.download_read);
        println!(
            "RESULT name={} ok={} gpu_us={} exits={} upload_ns={} kernel_ns={} download_ns={} free_ns={} upload_exits={} kernel_exits={} download_exits={} free_exits={} download_copy_ns={} download_read_ns={} download_copy_exits={} download_read_exits={} download_reread_ns={}",
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
            f.mmio,
            dc.ns,
            dr.ns,
            dc.mmio,
            dr.mmio,
            out.download_reread.ns
        );
    }
    println!("HEAP used_mib={}", guest_rt::heap::top().div_ceil(1 << 20));
    println!("workloads: {passed}/{total} ok (size {})", size.name());
    if total > 0 && passed == total {
        0
    } else {
        guest_rt::abi::exit_codes::CHECK_FAILED
    }
}
