//! The `vgpu-vmm` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vmm::loader::Image;
use vmm::stats::StatsTarget;
use vmm::vm::{self, VmConfig};

/// Run a KVM guest (a bundled bare-metal program or an ELF kernel).
#[derive(Debug, Parser)]
#[command(name = "vgpu-vmm", version, about, after_help = EXIT_CODES)]
struct Args {
    /// Run the bundled guest NAME (see --list-guests), or `linux`: the Linux guest built by
    /// guest-images/linux/build.sh (--cmdline is appended to its command line).
    #[arg(long, value_name = "NAME", conflicts_with = "kernel", required_unless_present_any = ["kernel", "list_guests"])]
    guest: Option<String>,
    /// Run the 64-bit ELF image or Linux bzImage (detected) at PATH instead of a bundled guest.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Boot --kernel as Linux (an uncompressed vmlinux ELF; a bzImage needs no flag).
    #[arg(long, requires = "kernel")]
    linux: bool,
    /// Initramfs for a Linux kernel.
    #[arg(long, value_name = "PATH", requires = "kernel")]
    initramfs: Option<PathBuf>,
    /// Command line passed to the guest (Linux: empty means `linux::DEFAULT_CMDLINE`, which hides
    /// the CPU features PVM cannot emulate at CPL0).
    #[arg(long, default_value = "")]
    cmdline: String,
    /// Guest RAM in MiB.
    #[arg(long, value_name = "MiB", default_value_t = 256)]
    memory: u64,
    /// Number of vCPUs.
    #[arg(long, value_name = "N", default_value_t = 1)]
    cpus: u8,
    /// Attach the PCI test device (registers for bus tests and trap benchmarks).
    #[arg(long)]
    testdev: bool,
    /// Attach a virtual GPU: --gpu or --gpu key=value,... (mode=full|para, backend=sim|cuda,
    /// opt=none|lazy|remap|all, vram=256M, channels=8, timeout_ms=2000, workers=1, pages=4k+2m|2m;
    /// host=SOCKET to share the GPU of a vgpud daemon, with weight=1, priority=0, name=vm-PID).
    #[arg(long, value_name = "OPTIONS", num_args = 0..=1, default_missing_value = "")]
    gpu: Option<String>,
    /// Stop the VM after SECONDS (exit code 124).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Print exit and access counters as JSON at exit, to stderr or to PATH.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "-")]
    stats: Option<String>,
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// List the bundled guests and exit.
    #[arg(long)]
    list_guests: bool,
}

const EXIT_CODES: &str = "Exit status: the guest's own code (0-255) when it exits through the debug-exit port; \
0 on reset or power-off; 1 on a set-up error; 2 on a usage error; 3 when the guest crashed (triple fault); \
4 when KVM failed to run a vCPU; 124 on --timeout; 128+N on signal N.";

fn main() -> ExitCode {
    let args = Args::parse();
    env_logger::Builder::new()
        .parse_filters(&args.log_level)
        .parse_env("RUST_LOG")
        .format_timestamp_micros()
        .init();
    if args.list_guests {
        guest_images::names().for_each(|n| println!("{n}"));
        return ExitCode::SUCCESS;
    }
    // `--guest linux`: the Linux guest of guest-images/linux/build.sh.
    let linux_guest = match args.guest.as_deref() {
        Some(vmm::linux::guest::NAME) => {
            match vmm::linux::guest::resolve(&vmm::linux::guest::dir(), args.memory, &args.cmdline)
            {
                Ok(g) => Some(g),
                Err(e) => {
                    eprintln!("vgpu-vmm: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => None,
    };
    let image = match (&linux_guest, &args.guest, &args.kernel) {
        (Some(g), _, _) => Image::File(g.vmlinux.clone()),
        (None, _, Some(path)) => Image::File(path.clone()),
        (None, Some(name), None) => Image::Bundled(name.clone()),
        (None, None, None) => {
            eprintln!("vgpu-vmm: give --guest NAME or --kernel PATH");
            return ExitCode::from(2);
        }
    };
    let timeout = match args.timeout {
        Some(t) if !(t > 0.0 && t.is_finite()) => {
            eprintln!("vgpu-vmm: --timeout must be a positive number of seconds");
            return ExitCode::from(2);
        }
        t => t.map(Duration::from_secs_f64),
    };
    let gpu = match args.gpu.as_deref().map(vgpu::GpuConfig::parse).transpose() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("vgpu-vmm: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = VmConfig {
        image,
        cmdline: linux_guest
            .as_ref()
            .map_or(args.cmdline, |g| g.cmdline.clone()),
        memory_mib: args.memory,
        cpus: args.cpus,
        testdev: args.testdev,
        timeout,
        linux: args.linux || args.initramfs.is_some() || linux_guest.is_some(),
        initramfs: linux_guest.map(|g| g.initramfs).or(args.initramfs),
        gpu,
    };
    match vm::run(&cfg) {
        Ok(outcome) => {
            let code = outcome.reason.code();
            if code != 0 {
                eprintln!("vgpu-vmm: {}", outcome.reason);
            } else {
                log::info!("{}", outcome.reason);
            }
            if let Some(s) = &args.stats {
                let target = if s == "-" {
                    StatsTarget::Stderr
                } else {
                    StatsTarget::File(s.into())
                };
                if let Err(e) = outcome.stats.emit(&target) {
                    eprintln!("vgpu-vmm: write --stats: {e}");
                }
            }
            ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
        }
        Err(e) => {
            eprintln!("vgpu-vmm: {e}");
            ExitCode::FAILURE
        }
    }
}
