//! `vgpud`: runs the GPU-sharing daemon until SIGINT/SIGTERM, then writes its report.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vgpud::units::parse_size;
use vgpud::{Daemon, DaemonConfig};

/// Share one physical GPU among vgpu-vmm processes (`vgpu-vmm --gpu host=SOCKET,...`).
#[derive(Debug, Parser)]
#[command(name = "vgpud", version, about)]
struct Args {
    /// Unix socket to listen on.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Physical VRAM shared by all VMs (K/M/G suffix; multiple of 2 MiB).
    #[arg(long, default_value = "8G")]
    vram: String,
    /// Channel quota: channels all VMs together may use.
    #[arg(long, default_value_t = 1024)]
    channels: u32,
    /// Scheduler configuration, `key=value,...` (see scheduler/README.md), e.g.
    /// `policy=timeslice,slice=2ms` or `policy=credit`.
    #[arg(long, default_value = "")]
    sched: String,
    /// Milliseconds a VM may take to stop after a preempt before its grant is revoked and it
    /// is disconnected.
    #[arg(long, default_value_t = 200.0)]
    revoke_after_ms: f64,
    /// Milliseconds a non-preemptive grant may run before it is preempted.
    #[arg(long, default_value_t = 5000.0)]
    max_run_ms: f64,
    /// Microseconds to poll instead of sleeping around a slice end others wait for (the daemon
    /// and the VM likely next); default 300 with 4 or more CPUs, else 0 (off).
    #[arg(long)]
    spin_us: Option<u64>,
    /// Microseconds after a slice end before a VM told to stop by itself is sent a preempt.
    #[arg(long, default_value_t = 1000)]
    backstop_us: u64,
    /// Write the JSON report here at exit (and every --report-every-ms).
    #[arg(long, value_name = "PATH")]
    report: Option<PathBuf>,
    #[arg(long, value_name = "MS")]
    report_every_ms: Option<f64>,
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn ms(v: f64) -> Option<Duration> {
    (v.is_finite() && v > 0.0).then(|| Duration::from_secs_f64(v / 1e3))
}

fn main() -> ExitCode {
    let args = Args::parse();
    env_logger::Builder::new()
        .parse_filters(&args.log_level)
        .parse_env("RUST_LOG")
        .format_timestamp_micros()
        .init();
    let usage = |m: String| {
        eprintln!("vgpud: {m}");
        ExitCode::from(2)
    };
    let Some(vram) = parse_size(&args.vram) else {
        return usage(format!("--vram {:?}: not a size", args.vram));
    };
    let sched = match scheduler::Config::parse(&args.sched) {
        Ok(c) => c,
        Err(e) => return usage(format!("--sched: {e}")),
    };
    let (Some(revoke_after), Some(max_run)) = (ms(args.revoke_after_ms), ms(args.max_run_ms))
    else {
        return usage("--revoke-after-ms and --max-run-ms must be positive".into());
    };
    let report_every = match args.report_every_ms {
        None => None,
        Some(v) => match ms(v) {
            Some(d) => Some(d),
            None => return usage("--report-every-ms must be positive".into()),
        },
    };
    let cfg = DaemonConfig {
        socket: args.socket,
        vram,
        channels: args.channels,
        sched,
        sched_text: args.sched,
        revoke_after,
        max_run,
        report: args.report,
        report_every,
        spin: Duration::from_micros(args.spin_us.unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            if cpus >= 4 { 300 } else { 0 }
        })),
        backstop: Duration::from_micros(args.backstop_us),
    };
    // SIGINT/SIGTERM write to this pair; the daemon loop stops when it becomes readable.
    let (stop_rx, stop_tx) = match std::os::unix::net::UnixStream::pair() {
        Ok(p) => p,
        Err(e) => return usage(format!("socketpair: {e}")),
    };
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let tx = match stop_tx.try_clone() {
            Ok(t) => t,
            Err(e) => return usage(format!("dup: {e}")),
        };
        if let Err(e) = signal_hook::low_level::pipe::register(sig, tx) {
            return usage(format!("signal handler: {e}"));
        }
    }
    // The daemon must wake for slice ends within microseconds (default timer slack is 50 µs).
    // SAFETY: prctl on this process with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
    let mut daemon = match Daemon::new(cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("vgpud: {e}");
            return ExitCode::from(1);
        }
    };
    match daemon.run(stop_rx.as_fd()) {
        Ok(r) => {
            log::info!(
                "vgpud: stopped: {} VMs, {} grants, {} preempts, {} evictions",
                r.vms.len(),
                r.grants,
                r.preempts,
                r.evictions
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpud: {e}");
            ExitCode::from(1)
        }
    }
}
