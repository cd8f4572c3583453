//! The `vgpu-vmm` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use vmm::loader::Image;
use vmm::stats::StatsTarget;
use vmm::vm::{self, VmConfig};

/// Run a KVM guest (a bundled bare-metal program or an ELF kernel).
#[derive(Debug, Parser)]
#[command(name = "vgpu-vmm", version, about, after_help = EXIT_CODES,
          args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Run the bundled guest NAME (see --list-guests), or `linux`: the Linux guest built by
    /// guest-images/linux/build.sh (--cmdline is appended to its command line).
    #[arg(long, value_name = "NAME", conflicts_with = "kernel", required_unless_present_any = ["kernel", "list_guests", "restore", "incoming", "standby"])]
    guest: Option<String>,
    /// Restore the snapshot in directory DIR (written by `ctl PATH snapshot DIR`) and run it:
    /// memory, vCPUs, boot kind and devices come from the snapshot (docs/snapshot.md), the
    /// virtual GPU's configuration too: `--gpu` may choose only its backend (backend=sim|cuda)
    /// and the vgpud it attaches to (host=SOCKET[,weight=,priority=,name=,reconnect_ms=,gpu=,nice=]).
    #[arg(long, value_name = "DIR",
          conflicts_with_all = ["guest", "kernel", "linux", "initramfs", "cmdline", "memory", "cpus", "testdev", "disk", "run"])]
    restore: Option<PathBuf>,
    /// Prepare a VM ahead and wait on --api-socket for a snapshot to run in it (`vgpu-vmm ctl
    /// SOCKET restore DIR`): the KVM VM, --cpus vCPUs, --memory MiB of guest RAM registered
    /// with KVM and the --gpu engine (the cuda context) are made now, so that the restore only
    /// puts the snapshot's state in. The snapshot must have exactly that RAM size and vCPU
    /// count, and a GPU whose engine keys (backend, vram, guard, mode, preempt; sim: workers,
    /// pages; host) match --gpu; another is refused and the standby waits on. `vgpu-vmm ctl
    /// SOCKET incoming URL` makes it take a migration instead (the same fit). --timeout,
    /// --stats, --console-prefix and --tls-* apply to the VM it runs.
    #[arg(long, requires = "api_socket",
          conflicts_with_all = ["guest", "kernel", "linux", "initramfs", "cmdline", "testdev", "disk", "run", "restore", "incoming"])]
    standby: bool,
    /// With --standby: the snapshot in DIR (of the image the standby will most likely
    /// restore) is read and checked like --restore's, must fit the standby, and its GPU
    /// modules are loaded into the engine now (the PTX JIT on cuda), so that restoring that
    /// image finds them loaded; another image restores as without it. A template that is
    /// refused refuses the standby's start.
    #[arg(long, value_name = "DIR", requires = "standby")]
    template: Option<PathBuf>,
    /// Serve the control API on a unix socket at PATH (pause, resume, stats, snapshot; see
    /// `vgpu-vmm ctl --help` and docs/architecture.md). A stale socket there is replaced;
    /// a file, directory, symbolic link or live socket is a usage error.
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Wait at URL for a VM migrated with `vgpu-vmm ctl SOCKET migrate URL`, and run it (like
    /// --restore, from the stream; --gpu as with --restore, e.g. host=SOCKET to attach the VM's
    /// GPU to another vgpud). URL: unix:PATH or a path (a unix socket, checked like
    /// --api-socket), tcp:HOST:PORT on loopback only (neither encrypted nor authenticated), or
    /// tls:HOST:PORT on any address (mutual TLS with --tls-cert, --tls-key and --tls-ca: the
    /// source must show a certificate from that CA; a connection that fails the handshake is
    /// closed and the next one awaited).
    #[arg(long, value_name = "URL", conflicts_with_all = ["restore", "guest", "kernel", "linux", "initramfs", "cmdline", "memory", "cpus", "testdev", "disk", "run"])]
    incoming: Option<String>,
    /// This VM's certificate chain (PEM, its own certificate first) for tls: migration: shown
    /// to the source by --incoming tls:, and to the destination by `ctl migrate tls:`.
    /// Checked at start, read again at each migration.
    #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// The CA certificate(s) (PEM) that the peer's certificate of a tls: migration must chain
    /// to.
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// Run the 64-bit ELF image or Linux bzImage (detected) at PATH instead of a bundled guest.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Boot --kernel as Linux (an uncompressed vmlinux ELF; a bzImage needs no flag).
    #[arg(long, requires = "kernel")]
    linux: bool,
    /// Initramfs for a Linux kernel.
    #[arg(long, value_name = "PATH", requires = "kernel")]
    initramfs: Option<PathBuf>,
    /// Command line passed to the guest (Linux: empty means a default that hides the CPU
    /// features PVM cannot emulate at CPL0).
    #[arg(long, default_value = "")]
    cmdline: String,
    /// Guest RAM in MiB.
    #[arg(long, value_name = "MiB", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(2..=vmm::memory::MAX_MEMORY_MIB))]
    memory: u64,
    /// Number of vCPUs (at most what KVM allows).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=255))]
    cpus: u8,
    /// Attach the PCI test device (registers for bus tests and trap benchmarks).
    #[arg(long)]
    testdev: bool,
    /// Attach a disk to a Linux guest: a virtio-blk device over the file or block device PATH
    /// (checked before the VM starts), read-only with `,ro` (opened O_RDONLY; guest writes fail
    /// with an I/O error). Repeatable: /dev/vda, vdb, ... in that order (after --run's image),
    /// at most 4 disks in all, `--guest linux`'s root image the last of them. Snapshots and
    /// migration need every disk read-only.
    #[arg(long, value_name = "PATH[,ro]", value_parser = parse_disk)]
    disk: Vec<vmm::disk::DiskSpec>,
    /// Run the program PROG in the Linux guest (--guest linux) and exit with its exit status:
    /// PROG, the shared libraries ldd finds for it and the guest CUDA libraries next to
    /// vgpu-vmm are packed into a cached read-only ext2 image (mke2fs) attached as /dev/vda;
    /// the program runs in a writable directory with ARGS (after `--`), its output on the
    /// console.
    #[arg(long, value_name = "PROG")]
    run: Option<PathBuf>,
    /// Arguments of the --run program.
    #[arg(last = true, value_name = "ARGS", requires = "run")]
    run_args: Vec<String>,
    // The help is made from the keys' declarations (`vgpu::config::keys`).
    #[arg(long, value_name = "OPTIONS", num_args = 0..=1, default_missing_value = "",
          value_parser = parse_gpu, help = gpu_help())]
    gpu: Option<vgpu::GpuConfig>,
    /// Stop the VM after SECONDS (exit code 124).
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    timeout: Option<Duration>,
    /// Print exit and access counters as JSON at exit, to stderr or to PATH (checked, and
    /// created, before the VM starts).
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "-")]
    stats: Option<String>,
    /// Write TEXT before each line of guest console output (tells VMs sharing a terminal apart;
    /// each line is written whole).
    #[arg(long, value_name = "TEXT")]
    console_prefix: Option<String>,
    /// Threads that copy and checksum snapshot and migration data (the VRAM lanes, the CRC
    /// lanes), 1 to 1024 (default: one per CPU the process may use).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    copy_threads: Option<u64>,
    /// How many nice steps those threads run below the VMM, 0 to 19 (at most nice 19): a
    /// positive value makes the copy of a live snapshot or live migration yield the host's
    /// cores to the running guest (docs/snapshot.md, "Live snapshots and VRAM pre-copy").
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    copy_nice: i32,
    /// Log level; RUST_LOG overrides it.
    #[arg(long, value_name = "LEVEL", default_value = "warn", value_parser = LOG_LEVELS)]
    log_level: String,
    /// List the bundled guests with a description and exit.
    #[arg(long)]
    list_guests: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send a control request to a VM started with --api-socket PATH and print the answer's
    /// result as JSON.
    #[command(after_help = CTL_EXIT_CODES)]
    Ctl {
        /// The VM's API socket.
        socket: PathBuf,
        #[command(subcommand)]
        op: CtlOp,
    },
}

#[derive(Debug, Subcommand)]
enum CtlOp {
    /// Park every vCPU (the guest stops; its clocks keep running).
    Pause,
    /// Let a paused VM run again.
    Resume,
    /// Print the VM's state (running or paused), uptime and exit counters.
    Stats,
    /// Write a snapshot to DIR (new, or an empty directory). A running VM is paused for it
    /// and resumed after (unless --paused); a paused VM stays paused.
    Snapshot {
        dir: PathBuf,
        /// Leave the VM paused after the snapshot.
        #[arg(long)]
        paused: bool,
        /// Let a kernel the virtual GPU is running finish (at most its job time limit) instead
        /// of preempting it: the snapshot holds no engine context and restores on any backend.
        #[arg(long)]
        drain: bool,
        /// Copy RAM and the GPU's VRAM while the VM (and its GPU) runs, in rounds of what was
        /// dirtied since, then pause only for the last round and the device state.
        #[arg(long)]
        live: bool,
    },
    /// Migrate to a vgpu-vmm waiting with --incoming DEST (unix:PATH or a path,
    /// tcp:HOST:PORT on loopback: neither encrypted nor authenticated, or tls:HOST:PORT:
    /// mutual TLS, the destination's certificate checked against the VM's --tls-ca and HOST):
    /// stop-and-copy (the VM is paused and sent), or with --live pre-copy (RAM sent while the
    /// guest runs, then the pages it dirtied, and the VRAM its GPU wrote, then a short pause);
    /// the VM ends here once the destination runs it, and runs on here if that fails.
    Migrate {
        dest: String,
        /// Pre-copy with KVM's and the GPU engine's dirty logs instead of stop-and-copy.
        #[arg(long)]
        live: bool,
        /// For tls: DEST, the certificate chain to show instead of the VM's --tls-cert (with
        /// --tls-key and --tls-ca; the VM reads them).
        #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
        tls_cert: Option<PathBuf>,
        /// Its private key.
        #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
        tls_key: Option<PathBuf>,
        /// The CA certificate(s) the destination's certificate must chain to.
        #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_key"])]
        tls_ca: Option<PathBuf>,
    },
    /// Restore the snapshot in DIR into a VM started with --standby and run it there (a
    /// snapshot that does not fit what the standby prepared is refused and it waits on); the
    /// answer, once its vCPUs run, gives the restore's times.
    Restore { dir: PathBuf },
    /// Make a VM started with --standby wait at URL (as --incoming URL: unix:PATH or a path,
    /// tcp:HOST:PORT on loopback, tls:HOST:PORT with its --tls-* files) for a VM migrated with
    /// `ctl SOCKET migrate URL`, and run it there on what it prepared: the pre-copy rounds are
    /// written into its GPU engine, made before. Answered once it listens; a VM that does not
    /// fit the standby (as for restore) is refused to the source, and the standby waits on.
    Incoming {
        url: String,
        /// Stop listening if no source has connected within SECONDS (the standby then takes
        /// requests again).
        #[arg(long, value_name = "SECONDS", default_value_t = vmm::api::protocol::INCOMING_WAIT_S,
              value_parser = clap::value_parser!(u64).range(1..=vmm::api::protocol::MAX_INCOMING_WAIT_S))]
        wait_s: u64,
    },
    /// Move the VM's virtual GPU to GPU N of its vgpud (`--gpu host=`; sim, or cuda: a new
    /// engine on device N in this process, its modules loaded first): VRAM is pre-copied to a
    /// partition the daemon reserves there while the VM runs, then the VM pauses for the last
    /// dirty pages and the switch (the answer gives the downtime).
    MoveGpu {
        /// The daemon's GPU index (vgpud --gpus).
        gpu: u32,
    },
}

const CTL_EXIT_CODES: &str = "Exit status: 0 the VM did it (the result is printed as JSON on stdout); \
1 the VM refused or failed the operation (the error is printed); 2 usage error; 3 no VM answers \
on the socket or its answer is not the protocol's.";

/// Largest `--gpu vram=` for a bare-metal guest: the largest power of two that leaves room
/// for the other 64-bit BARs in the identity-mapped part of the window (8 GiB), and no more
/// than the 4 GiB GPU VA window the bundled driver maps all of VRAM into.
const MAX_BARE_METAL_VRAM: u64 = {
    let map = (guest_abi::PCI_MMIO64_MAPPED / 2).next_power_of_two();
    if map < 4 << 30 { map } else { 4 << 30 }
};

/// The accepted `--log-level` values.
const LOG_LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// Longest `--timeout`: a year of seconds (and the range a `Duration` holds exactly).
const MAX_TIMEOUT_S: f64 = 365.0 * 86400.0;

fn parse_timeout(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(t) if (0.001..=MAX_TIMEOUT_S).contains(&t) => Ok(Duration::from_secs_f64(t)),
        _ => Err(format!("seconds from 0.001 to {MAX_TIMEOUT_S}")),
    }
}

fn parse_disk(s: &str) -> Result<vmm::disk::DiskSpec, String> {
    vmm::disk::DiskSpec::parse(s).map_err(|e| e.to_string())
}

/// `--gpu`'s help: the keys' own (`vgpu::config::keys::help`), and what the bundled guests
/// can use.
fn gpu_help() -> String {
    format!(
        "{}. Bare-metal guests take vram up to 4G (the identity map covers 15 GiB of the 64-bit \
         PCI window; the bundled driver maps VRAM into a 4 GiB GPU VA window)",
        vgpu::config::keys::help()
    )
}

fn parse_gpu(s: &str) -> Result<vgpu::GpuConfig, String> {
    vgpu::GpuConfig::parse(s).map_err(|e| e.to_string())
}

const EXIT_CODES: &str = "Exit status: the guest's own code (0-255) when it exits through the debug-exit port; \
0 on reset, power-off or after `ctl migrate` moved the VM away; 1 on a set-up error (a refused --restore or --incoming too); 2 on a usage error; 3 when the guest crashed (triple fault); \
4 when KVM failed to run a vCPU; 124 on --timeout; 128+N on signal N. The bundled guests never \
exit 1-4: 10 a check failed, 11 bad --cmdline argument, 12 device missing or unusable, 13 GPU \
fault, 101 panic, 102 CPU exception, 103 bad boot info.";

fn ctl(socket: &std::path::Path, op: CtlOp) -> ExitCode {
    use vmm::api::client::{self, ClientError};
    use vmm::api::protocol::Request;
    let req = match op {
        CtlOp::Pause => Request::Pause {},
        CtlOp::Resume => Request::Resume {},
        CtlOp::Stats => Request::Stats {},
        CtlOp::MoveGpu { gpu } => Request::MoveGpu { gpu },
        CtlOp::Restore { dir } => match std::path::absolute(&dir) {
            Ok(dir) => Request::Restore { dir },
            Err(e) => {
                eprintln!("vgpu-vmm ctl: {}: {e}", dir.display());
                return ExitCode::from(2);
            }
        },
        CtlOp::Incoming { url, wait_s } => {
            // A unix socket's path is made absolute (the standby resolves paths in its own
            // directory).
            let to = vmm::snapshot::transport::Endpoint::parse(&url)
                .map_err(|e| e.to_string())
                .and_then(|e| e.absolute().map_err(|e| format!("{url}: {e}")));
            match to {
                Ok(to) => Request::Incoming {
                    url: to.to_string(),
                    wait_s,
                },
                Err(e) => {
                    eprintln!("vgpu-vmm ctl: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        CtlOp::Migrate {
            dest,
            live,
            tls_cert,
            tls_key,
            tls_ca,
        } => {
            // A unix socket's path and the TLS files are made absolute (the VM resolves paths
            // in its own directory); a tcp: or tls: address goes as it is.
            let to = vmm::snapshot::transport::Endpoint::parse(&dest)
                .map_err(|e| e.to_string())
                .and_then(|e| e.absolute().map_err(|e| format!("{dest}: {e}")))
                .and_then(|e| {
                    let files = tls_files(tls_cert, tls_key, tls_ca)
                        .map(|f| f.absolute().map_err(|e| format!("--tls-*: {e}")))
                        .transpose()?;
                    match (&e, files) {
                        (vmm::snapshot::transport::Endpoint::Tls(_), f) | (_, f @ None) => {
                            Ok((e, f))
                        }
                        (_, Some(_)) => Err(format!("--tls-*: {dest} is not a tls: address")),
                    }
                });
            match to {
                Ok((to, tls)) => Request::Migrate {
                    to: to.to_string(),
                    live,
                    tls,
                },
                Err(e) => {
                    eprintln!("vgpu-vmm ctl: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        CtlOp::Snapshot {
            dir,
            paused,
            drain,
            live,
        } => {
            // The VM resolves paths in its own directory: send an absolute one.
            let dir = match std::path::absolute(&dir) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("vgpu-vmm ctl: {}: {e}", dir.display());
                    return ExitCode::from(2);
                }
            };
            Request::Snapshot {
                dir,
                resume: !paused,
                drain,
                live,
            }
        }
    };
    match client::call(socket, &req) {
        Ok(r) if r.ok => {
            println!("{}", r.result.unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(r) => {
            eprintln!("vgpu-vmm ctl: {}", r.error.unwrap_or_default());
            ExitCode::from(client::CODE_REFUSED)
        }
        Err(e @ (ClientError::Connect { .. } | ClientError::Io(_) | ClientError::Protocol(_))) => {
            eprintln!("vgpu-vmm ctl: {e}");
            ExitCode::from(client::CODE_NO_VM)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    env_logger::Builder::new()
        .parse_filters(&args.log_level)
        .parse_env("RUST_LOG")
        .format_timestamp_micros()
        .init();
    if let Some(Command::Ctl { socket, op }) = args.command {
        return ctl(&socket, op);
    }
    if args.list_guests {
        let width = guest_images::names().map(str::len).max().unwrap_or(0);
        for n in guest_images::names() {
            println!("{n:width$}  {}", guest_images::description(n));
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = vmm::copy_pool::init(args.copy_threads.map(|n| n as usize), args.copy_nice) {
        eprintln!("vgpu-vmm: {e}");
        return ExitCode::from(1);
    }
    if args.standby {
        return standby(args);
    }
    match prepare(args) {
        Ok((cfg, start, stats)) => finish(vm::run_with(&cfg, start), stats),
        Err(Fail(code, msg)) => {
            eprintln!("vgpu-vmm: {msg}");
            ExitCode::from(code)
        }
    }
}

/// Why the VM is not started: the exit code (1 set-up, 2 usage) and the message.
struct Fail(u8, String);

/// The `--tls-cert`, `--tls-key` and `--tls-ca` trio (clap requires all three or none).
fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Option<vmm::snapshot::tls::TlsFiles> {
    Some(vmm::snapshot::tls::TlsFiles {
        cert: cert?,
        key: key?,
        ca: ca?,
    })
}

/// The VM's TLS files, read and checked now (made absolute: they are read again at each
/// migration).
fn check_tls(args: &Args) -> Result<Option<vmm::snapshot::tls::TlsFiles>, Fail> {
    let Some(files) = tls_files(
        args.tls_cert.clone(),
        args.tls_key.clone(),
        args.tls_ca.clone(),
    ) else {
        return Ok(None);
    };
    let files = (files.absolute()).map_err(|e| Fail(2, format!("--tls-cert: {e}")))?;
    files
        .check()
        .map_err(|e| Fail(2, format!("--tls-cert/--tls-key/--tls-ca: {e}")))?;
    Ok(Some(files))
}

/// Everything checked before a VM is built, in this order: the TLS files, the snapshot
/// (`--restore`, or the `--incoming` stream), the API socket, `--run`'s image, the kernel image, the GPU's VRAM for
/// bare-metal guests, the disks, the stats target, the restored GPU's configuration.
fn prepare(args: Args) -> Result<(VmConfig, vm::Start, Option<StatsTarget>), Fail> {
    let tls = check_tls(&args)?;
    let (loaded, ack, since) = snapshot(&args, tls.as_ref())?;
    let api = match args.api_socket.as_deref() {
        Some(p) => Some(
            vmm::api::server::ApiSocket::bind(p)
                .map_err(|e| Fail(2, format!("--api-socket: {e}")))?,
        ),
        None => None,
    };
    let (cmdline, mut disk_specs) = run_program(&args)?;
    // `--guest linux`: the Linux guest of guest-images/linux/build.sh, its root image the last
    // disk (a restore's disks come from its manifest).
    let linux_guest = match args.guest.as_deref() {
        Some(vmm::linux::guest::NAME) if loaded.is_none() => {
            let dir = vmm::linux::guest::dir();
            let g = vmm::linux::guest::resolve(&dir, args.memory, disk_specs.len(), &cmdline)
                .map_err(|e| Fail(1, e.to_string()))?;
            if disk_specs.len() >= vmm::disk::MAX_DISKS {
                let msg = format!(
                    "--guest {}: its root image is a disk too: at most {} --disk{}",
                    vmm::linux::guest::NAME,
                    vmm::disk::MAX_DISKS - 1 - usize::from(args.run.is_some()),
                    if args.run.is_some() {
                        " with --run"
                    } else {
                        ""
                    }
                );
                return Err(Fail(2, msg));
            }
            disk_specs.push(vmm::disk::DiskSpec {
                path: g.rootfs.clone(),
                read_only: true,
                bytes: 0,
            });
            Some(g)
        }
        _ => None,
    };
    let image = match (&linux_guest, &args.guest, &args.kernel) {
        _ if loaded.is_some() => Image::Bundled(String::new()),
        (Some(g), _, _) => Image::File(g.vmlinux.clone()),
        (None, _, Some(path)) => Image::File(path.clone()),
        (None, Some(name), None) => Image::Bundled(name.clone()),
        (None, None, None) => return Err(Fail(2, "give --guest NAME or --kernel PATH".into())),
    };
    let linux = args.linux || args.initramfs.is_some() || linux_guest.is_some();
    check_vram(args.gpu.as_ref(), linux)?;
    let disks = open_disks(loaded.as_ref(), &disk_specs, linux)?;
    let stats = (args.stats.as_deref().map(StatsTarget::open).transpose())
        .map_err(|e| Fail(2, format!("--stats: {e}")))?;
    let (memory_mib, cpus, testdev) = match &loaded {
        Some(l) => (l.manifest.memory_mib, l.manifest.cpus, l.manifest.testdev),
        None => (args.memory, args.cpus, args.testdev),
    };
    let gpu = match &loaded {
        Some(l) => restored_gpu(l, args.gpu.as_ref())?,
        None => args.gpu,
    };
    let cfg = VmConfig {
        image,
        cmdline: (linux_guest.as_ref()).map_or(cmdline, |g| g.cmdline.clone()),
        memory_mib,
        cpus,
        testdev,
        timeout: args.timeout,
        linux,
        initramfs: args.initramfs,
        gpu,
        console_prefix: args.console_prefix,
        disks,
        tls,
    };
    let start = vm::Start {
        since: loaded.is_some().then_some(since),
        restore: loaded,
        api,
        ack,
        reply: None,
    };
    Ok((cfg, start, stats))
}

type Incoming = (
    Option<vmm::snapshot::load::Loaded>,
    Option<vmm::snapshot::transport::Link>,
    std::time::Instant,
);

/// `--restore DIR` (everything comes from the snapshot, checked before anything is built) or
/// `--incoming URL` (the same, from a migration stream, with the link to answer on; `tls:`
/// with `tls`), and when the restore began.
fn snapshot(args: &Args, tls: Option<&vmm::snapshot::tls::TlsFiles>) -> Result<Incoming, Fail> {
    let since = std::time::Instant::now();
    if let Some(dir) = &args.restore {
        let l = vmm::snapshot::load::load(dir)
            .map_err(|e| Fail(1, format!("--restore {}: {e}", dir.display())))?;
        return Ok((Some(l), None, since));
    }
    let Some(url) = &args.incoming else {
        return Ok((None, None, since));
    };
    use vmm::snapshot::transport::Endpoint;
    // The TLS files serve a tls: URL; with another they are for this VM's later migrations.
    let sock = Endpoint::parse(url)
        .and_then(|e| e.bind(tls.filter(|_| matches!(e, Endpoint::Tls(_)))))
        .map_err(|e| Fail(2, format!("--incoming: {e}")))?;
    let mut conn = sock
        .accept_one()
        .map_err(|e| Fail(1, format!("--incoming {url}: {e}")))?;
    match vmm::snapshot::stream::receive(&conn, args.gpu.as_ref()) {
        Ok(l) => Ok((Some(l), Some(conn), std::time::Instant::now())),
        Err(e) => {
            vmm::snapshot::stream::answer(&mut conn, Err(e.to_string()));
            Err(Fail(1, format!("--incoming {url}: {e}")))
        }
    }
}

/// `--run PROG`: its image becomes the first disk and its parameters go on the command line
/// (`quiet`: the console shows the program's output and the kernel's warnings); otherwise
/// `--cmdline` and `--disk` as given.
fn run_program(args: &Args) -> Result<(String, Vec<vmm::disk::DiskSpec>), Fail> {
    let mut disks = args.disk.clone();
    let Some(prog) = &args.run else {
        return Ok((args.cmdline.clone(), disks));
    };
    if args.guest.as_deref() != Some(vmm::linux::guest::NAME) {
        let msg = format!("--run needs --guest {}", vmm::linux::guest::NAME);
        return Err(Fail(2, msg));
    }
    let (image, param) =
        vmm::linux::run::prepare(prog, &args.run_args).map_err(|e| Fail(1, e.to_string()))?;
    let disk = vmm::disk::DiskSpec {
        path: image,
        read_only: true,
        bytes: 0,
    };
    disks.insert(0, disk);
    Ok((format!("quiet {param} {}", args.cmdline), disks))
}

/// The disks, opened and checked now: a restore's from its manifest (with their sizes), else
/// `specs` (Linux guests only, each file once).
fn open_disks(
    loaded: Option<&vmm::snapshot::load::Loaded>,
    specs: &[vmm::disk::DiskSpec],
    linux: bool,
) -> Result<Vec<vmm::disk::Disk>, Fail> {
    if !specs.is_empty() && !linux {
        return Err(Fail(2, "--disk needs a Linux guest".into()));
    }
    let disks = match loaded {
        Some(l) => vmm::disk::Disk::reopen(&l.manifest.disks).map_err(|e| Fail(1, e.to_string())),
        None => vmm::disk::open_all(specs).map_err(|e| Fail(2, e.to_string())),
    }?;
    if let Some(p) = vmm::disk::duplicate(&disks) {
        return Err(Fail(2, format!("--disk {}: attached twice", p.display())));
    }
    Ok(disks)
}

/// Bare-metal guests reach BARs through the VMM's identity map of the 64-bit PCI window:
/// BAR1 (VRAM, size-aligned at the window's start) must leave room for the BARs after it.
fn check_vram(gpu: Option<&vgpu::GpuConfig>, linux: bool) -> Result<(), Fail> {
    match gpu {
        Some(g) if !linux && g.vram > MAX_BARE_METAL_VRAM => Err(Fail(
            2,
            format!(
                "--gpu vram={}M: bare-metal guests map the first {} GiB of the 64-bit PCI \
                 window and the bundled driver a 4 GiB GPU VA window, so vram may be at most {}M",
                g.vram >> 20,
                guest_abi::PCI_MMIO64_MAPPED >> 30,
                MAX_BARE_METAL_VRAM >> 20
            ),
        )),
        _ => Ok(()),
    }
}

/// A restored VM's GPU: the snapshot's configuration, `--gpu` choosing only the backend and
/// the daemon.
fn restored_gpu(
    l: &vmm::snapshot::load::Loaded,
    given: Option<&vgpu::GpuConfig>,
) -> Result<Option<vgpu::GpuConfig>, Fail> {
    match (&l.manifest.gpu, given) {
        (Some(spec), given) => vmm::snapshot::gpu::restore_config(spec, given)
            .map(Some)
            .map_err(|e| Fail(2, format!("--restore: {e}"))),
        (None, Some(_)) => Err(Fail(
            2,
            "--restore: the snapshot has no virtual GPU; drop --gpu".into(),
        )),
        (None, None) => Ok(None),
    }
}

/// `--standby`: prepares a VM, waits for a snapshot to restore into it (or a migration to
/// receive) and runs that (a restore or migration that used the standby up and failed makes
/// another).
fn standby(args: Args) -> ExitCode {
    use vmm::standby::serve::{self, Outcome, RunSettings};
    let fail = |Fail(code, msg)| {
        eprintln!("vgpu-vmm: {msg}");
        ExitCode::from(code)
    };
    let tls = match check_tls(&args) {
        Ok(t) => t,
        Err(f) => return fail(f),
    };
    let Some(path) = args.api_socket.as_deref() else {
        return fail(Fail(2, "--standby needs --api-socket".into()));
    };
    let api = match vmm::api::server::ApiSocket::bind(path) {
        Ok(a) => a,
        Err(e) => return fail(Fail(2, format!("--api-socket: {e}"))),
    };
    let stats = match args.stats.as_deref().map(StatsTarget::open).transpose() {
        Ok(s) => s,
        Err(e) => return fail(Fail(2, format!("--stats: {e}"))),
    };
    let cfg = vmm::standby::StandbyConfig {
        memory_mib: args.memory,
        cpus: args.cpus,
        gpu: args.gpu.clone(),
        template: args.template.clone(),
    };
    let settings = RunSettings {
        timeout: args.timeout,
        console_prefix: args.console_prefix.clone(),
        tls,
    };
    loop {
        let sb = match vmm::standby::Standby::prepare(&cfg) {
            Ok(s) => s,
            Err(e) => {
                if let Some(t) = stats {
                    t.discard();
                }
                let usage = matches!(
                    &e,
                    vmm::standby::StandbyError::Build(vmm::builder::BuildError::Cpus { .. })
                        | vmm::standby::StandbyError::NotPreparable(_)
                        | vmm::standby::StandbyError::Template { .. }
                );
                return fail(Fail(if usage { 2 } else { 1 }, e.to_string()));
            }
        };
        match serve::wait_for_vm(&api, sb, &settings) {
            Outcome::Restored {
                vm,
                cfg,
                reply,
                ack,
                since,
                loaded,
            } => {
                let start = vm::Start {
                    restore: Some(*loaded),
                    api: Some(api),
                    since: Some(since),
                    ack,
                    reply,
                };
                return finish(vm.run(&cfg, start).map_err(vm::VmError::from), stats);
            }
            Outcome::Spent => continue,
        }
    }
}

/// Turns the VM's end into the exit status (and `--stats`).
fn finish(result: Result<vm::RunOutcome, vm::VmError>, stats: Option<StatsTarget>) -> ExitCode {
    match result {
        Ok(outcome) => {
            let code = outcome.reason.code();
            if code != 0 {
                eprintln!("vgpu-vmm: {}", outcome.reason);
            } else {
                log::info!("{}", outcome.reason);
            }
            if let Some(target) = stats
                && let Err(e) = target.emit(&outcome.stats)
            {
                eprintln!("vgpu-vmm: write --stats: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
        }
        Err(e) => {
            eprintln!("vgpu-vmm: {e}");
            if let Some(target) = stats {
                target.discard();
            }
            // Usage errors found once KVM is open (more vCPUs than it allows) exit 2 too.
            match e.is_usage() {
                true => ExitCode::from(2),
                false => ExitCode::FAILURE,
            }
        }
    }
}
