//! `vgpud`: runs the GPU-sharing daemon until SIGINT/SIGTERM, then writes its report;
//! `vgpud status --socket PATH` prints a running daemon's report as of now.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vgpud::units::{f64_in, size_in};
use vgpud::wire::WireError;
use vgpud::{Daemon, DaemonConfig, DaemonError};

/// Share one physical GPU among vgpu-vmm processes (`vgpu-vmm --gpu host=SOCKET,...`).
#[derive(Debug, Parser)]
#[command(name = "vgpud", version, about, after_help = EXIT_CODES,
          subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Unix socket to listen on (a stale socket there is replaced; anything else, or a socket
    /// something listens on, is refused).
    #[arg(long, value_name = "PATH", required = true)]
    socket: Option<PathBuf>,
    /// Physical VRAM of each GPU, shared by its VMs (K/M/G suffix; a multiple of 2M, at most
    /// 1024G).
    #[arg(long, value_name = "SIZE", default_value = "8G", value_parser = size_in(2 << 20, 1 << 40, 2 << 20))]
    vram: u64,
    /// The GPUs to manage: a count (`2`: CUDA devices 0 and 1; for sim VMs, that many software
    /// GPUs, each its own VRAM object) or a list of CUDA device ordinals (`0,2`). Each GPU has
    /// its own VRAM, channel quota and scheduler; a VM is placed on the one with the most free
    /// VRAM, then the least load (sum of weights), unless pinned (`--gpu host=..,gpu=N`).
    /// `all`: every CUDA device of the host, found through NVIDIA's driver (their names and
    /// memory go into the report; no driver or no device is an error). `nvidia-smi -L` lists
    /// a host's devices.
    #[arg(long, value_name = "N|LIST|all", default_value = "1")]
    gpus: String,
    /// Channel quota of each GPU: channels all its VMs together may use.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=65536))]
    channels: u32,
    /// Scheduler configuration, `key=value,...` (see scheduler/README.md), e.g.
    /// `policy=timeslice,slice=2ms` or `policy=credit`.
    #[arg(long, value_name = "CONFIG", default_value = "")]
    sched: String,
    /// Milliseconds a VM may take to stop after a preempt before its grant is revoked and it
    /// is disconnected.
    #[arg(long, value_name = "MS", default_value_t = 200.0, value_parser = f64_in(0.01, 60_000.0))]
    revoke_after_ms: f64,
    /// Milliseconds a non-preemptive grant may run before it is preempted.
    #[arg(long, value_name = "MS", default_value_t = 5000.0, value_parser = f64_in(0.01, 3_600_000.0))]
    max_run_ms: f64,
    /// Microseconds to poll instead of sleeping around a slice end others wait for (the daemon
    /// and the VM likely next); default 300 with 4 or more CPUs, else 0 (off).
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    spin_us: Option<u64>,
    /// The daemon's nice value, -20 to 0 (0: unchanged): it must answer a VM that stopped at
    /// once, also on a host whose cores are busy with VMs' threads. Raising needs
    /// CAP_SYS_NICE; refused, the daemon says so and runs on.
    #[arg(long, value_name = "N", default_value_t = -10, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-20..=0))]
    nice: i32,
    /// Microseconds after a slice end before a VM told to stop by itself is sent a preempt.
    #[arg(long, value_name = "US", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    backstop_us: u64,
    /// After a start on a stale socket (the previous vgpud was killed or crashed), first
    /// registrations wait this many milliseconds so that the previous instance's VMs, which
    /// re-register by themselves, get their VRAM ranges back first (0: no wait).
    #[arg(long, value_name = "MS", default_value_t = 2000.0, value_parser = f64_in(0.0, 600_000.0))]
    adopt_ms: f64,
    /// Write the JSON report here at exit (and every --report-every-ms); checked before start.
    #[arg(long, value_name = "PATH")]
    report: Option<PathBuf>,
    /// Also write the report every MS milliseconds while running (needs --report).
    #[arg(long, value_name = "MS", requires = "report", value_parser = f64_in(1.0, 3_600_000.0))]
    report_every_ms: Option<f64>,
    /// Log level; RUST_LOG overrides it.
    #[arg(long, value_name = "LEVEL", default_value = "info",
          value_parser = ["error", "warn", "info", "debug", "trace", "off"])]
    log_level: String,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the status of the vgpud running at --socket, as JSON.
    ///
    /// The daemon's report as of now (per GPU: VRAM total/free, channels, VMs placed, busy time, each VM's share,
    /// grants, preemptions; per VM: name, GPU, weight, share, GPU time...), without the
    /// per-window and latency series of the --report file. Exit status 0, or 1 when the
    /// daemon cannot be reached or does not answer status.
    Status {
        /// The daemon's socket (its --socket).
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        /// Seconds to wait for each answer.
        #[arg(long, value_name = "S", default_value_t = 5.0, value_parser = f64_in(0.01, 600.0))]
        wait: f64,
    },
}

/// `vgpud status`: the JSON on stdout, as the --report file has it.
fn status(socket: &std::path::Path, wait: f64) -> ExitCode {
    match vgpud::status::query(socket, Duration::from_secs_f64(wait)) {
        Ok((text, report)) => {
            // The --report file's form (fields in the same order).
            println!("{}", serde_json::to_string_pretty(&report).unwrap_or(text));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpud status: {e}");
            ExitCode::from(1)
        }
    }
}

const EXIT_CODES: &str = "Exit status: 0 after SIGINT/SIGTERM with the report written; 1 when the \
daemon could not start or run (VRAM, scheduler, poll) or the report could not be written; \
2 on a usage error (bad option, --socket path that is not a stale socket, unwritable --report).";

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v / 1e3)
}

/// Raises the daemon's thread (the one that runs the loop) to nice `nice`, unless it is there
/// already; a refusal is said once and the daemon runs on.
fn raise(nice: i32) {
    // SAFETY: plain system calls on the calling thread (who = 0).
    let old = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if nice == 0 || old <= nice {
        return;
    }
    // SAFETY: as above.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        log::warn!(
            "vgpud: cannot raise the daemon to nice {nice} ({}; needs CAP_SYS_NICE): it runs at \
             nice {old} (--nice 0 silences this)",
            std::io::Error::last_os_error()
        );
    } else {
        log::info!("vgpud: running at nice {nice}");
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Status { socket, wait }) = &args.command {
        return status(socket, *wait);
    }
    env_logger::Builder::new()
        .parse_filters(&args.log_level)
        .parse_env("RUST_LOG")
        .format_timestamp_micros()
        .init();
    let usage = |m: String| {
        eprintln!("vgpud: {m}");
        ExitCode::from(2)
    };
    let setup = |m: String| {
        eprintln!("vgpud: {m}");
        ExitCode::from(1)
    };
    let sched = match scheduler::Config::parse(&args.sched) {
        Ok(c) => c,
        Err(e) => return usage(format!("--sched: {e}")),
    };
    // `all`: the host's CUDA devices (discovered), else a count or a list as given.
    let discovered = if args.gpus.trim() == "all" {
        match vgpud::discover::cuda_devices()
            .and_then(|d| vgpud::discover::check_vram(&d, args.vram).map(|_| d))
        {
            Ok(d) => Some(d),
            Err(e) => return setup(format!("--gpus {e}")),
        }
    } else {
        None
    };
    let gpus = match &discovered {
        Some(d) => d.iter().map(|d| d.ordinal).collect(),
        None => match vgpud::gpus::parse_gpus(&args.gpus) {
            Ok(g) => g,
            Err(e) => return usage(format!("--gpus {e}")),
        },
    };
    if let Some(p) = &args.report
        && let Err(e) = vgpud::Report::check_path(p)
    {
        return usage(format!("--report {}: {e}", p.display()));
    }
    let Some(socket) = args.socket else {
        return usage("--socket is required".into());
    };
    let cfg = DaemonConfig {
        socket,
        vram: args.vram,
        channels: args.channels,
        gpus,
        sched,
        sched_text: args.sched,
        revoke_after: ms(args.revoke_after_ms),
        max_run: ms(args.max_run_ms),
        report: args.report,
        report_every: args.report_every_ms.map(ms),
        spin: Duration::from_micros(args.spin_us.unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            if cpus >= 4 { 300 } else { 0 }
        })),
        backstop: Duration::from_micros(args.backstop_us),
        adopt: ms(args.adopt_ms),
    };
    // SIGINT/SIGTERM write to this pair; the daemon loop stops when it becomes readable.
    let (stop_rx, stop_tx) = match std::os::unix::net::UnixStream::pair() {
        Ok(p) => p,
        Err(e) => return setup(format!("socketpair: {e}")),
    };
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let tx = match stop_tx.try_clone() {
            Ok(t) => t,
            Err(e) => return setup(format!("dup: {e}")),
        };
        if let Err(e) = signal_hook::low_level::pipe::register(sig, tx) {
            return setup(format!("signal handler: {e}"));
        }
    }
    // The daemon must wake for slice ends within microseconds (default timer slack is 50 µs).
    // SAFETY: prctl on this process with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
    raise(args.nice);
    let mut daemon = match Daemon::new(cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("vgpud: {e}");
            // The --socket path is the user's to fix: a usage error.
            return match e {
                DaemonError::Wire(WireError::InUse(_) | WireError::NotASocket(_)) => {
                    ExitCode::from(2)
                }
                _ => ExitCode::from(1),
            };
        }
    };
    if let Some(d) = &discovered {
        for x in d {
            log::info!(
                "vgpud: CUDA device {}: {}, {} MiB",
                x.ordinal,
                x.name,
                x.memory >> 20
            );
        }
        daemon.describe_gpus(d);
    }
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
