//! Building and running one VM: KVM VM with in-kernel irqchip and PIT, guest RAM, the image,
//! the buses and devices, the vCPUs; then the event loop until something asks the VM to stop.
//! A restored VM ([`Start::restore`]) gets its RAM, device and vCPU state from a snapshot
//! instead of an image; `--api-socket` ([`Start::api`]) serves control requests meanwhile.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use kvm_bindings::{KVM_PIT_SPEAKER_DUMMY, kvm_pit_config};
use kvm_ioctls::Kvm;
use mmio::Bus;
use mmio::pci::{CONFIG_ADDRESS_PORT, CONFIG_PORTS_LEN, PciRoot, PciWindows};
use vmm_sys_util::eventfd::EventFd;

use crate::api::server::ApiSocket;
use crate::arch;
use crate::control::Controller;
use crate::devices::{debug_exit::DebugExit, i8042::I8042, serial, testdev::TestDev};
use crate::exit::{ExitLatch, ExitReason};
use crate::layout;
use crate::lifecycle::Lifecycle;
use crate::loader::{self, Image, LoadError};
use crate::memory::{self, MemoryError};
use crate::pause::PauseGate;
use crate::persist::{self, DeviceSnapshot};
use crate::slots::SlotMapper;
use crate::snapshot::load::Loaded;
use crate::snapshot::manifest::{BootKind, Manifest};
use crate::snapshot::{cpu, ram, vmstate};
use crate::stats::{Stats, VcpuStats};
use crate::vcpu::{self, ExitCounters, Vcpu};

/// What to run and how.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub image: Image,
    pub cmdline: String,
    pub memory_mib: u64,
    pub cpus: u8,
    pub testdev: bool,
    pub timeout: Option<Duration>,
    /// Boot the image as a Linux kernel (automatic for a bzImage).
    pub linux: bool,
    /// Initramfs for a Linux kernel.
    pub initramfs: Option<std::path::PathBuf>,
    /// Attach a virtual GPU with this configuration.
    pub gpu: Option<vgpu::GpuConfig>,
    /// Prefix of every line of console output (`--console-prefix`).
    pub console_prefix: Option<String>,
}

/// Errors setting up or running a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("open /dev/kvm: {0}")]
    Kvm(kvm_ioctls::Error),
    #[error("{what}: {err}")]
    KvmSetup {
        what: &'static str,
        err: kvm_ioctls::Error,
    },
    #[error("--cpus must be between 1 and {max}, got {got}")]
    Cpus { got: u8, max: usize },
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("set up vCPU {id}: {err}")]
    Cpu { id: u8, err: arch::CpuError },
    #[error("register device: {0}")]
    Bus(#[from] mmio::BusError),
    #[error("PCI: {0}")]
    Pci(#[from] mmio::pci::PciError),
    #[error("write boot tables: {0}")]
    Tables(#[from] vm_memory::GuestMemoryError),
    #[error("{what}: {err}")]
    Io {
        what: &'static str,
        err: std::io::Error,
    },
    #[error("event loop: {0:?}")]
    EventLoop(event_manager::Error),
    #[error("virtual GPU: {0}")]
    Gpu(#[from] vgpu::VgpuError),
    #[error("Linux boot: {0}")]
    Linux(#[from] crate::linux::LinuxError),
    #[error("restore guest RAM: {0}")]
    RestoreRam(#[from] ram::RamError),
    #[error("restore: {0}")]
    RestoreVm(#[from] vmstate::VmStateError),
    #[error("restore: {0}")]
    RestoreCpu(#[from] cpu::CpuStateError),
    #[error("restore: {0}")]
    RestoreDevice(#[from] persist::PersistError),
    #[error("restore: the snapshot needs {want} vCPUs, KVM allows {max}")]
    RestoreCpus { want: u8, max: usize },
    #[error("restore: the virtual GPU: {0}")]
    RestoreGpu(#[from] vgpu::snapshot::SnapshotError),
    #[error("restore: the snapshot has {got} bytes of RAM, the configuration {want}")]
    RestoreRamSize { got: u64, want: u64 },
    #[error("restore: the VM's GPU configuration does not match the snapshot's")]
    RestoreGpuMismatch,
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> VmError {
    move |err| VmError::Io { what, err }
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |err| VmError::KvmSetup { what, err }
}

/// The outcome of a run.
#[derive(Debug)]
pub struct RunOutcome {
    pub reason: ExitReason,
    pub stats: Stats,
}

/// How a VM starts besides its configuration.
#[derive(Debug, Default)]
pub struct Start {
    /// Restore this snapshot instead of booting the image (`cfg` then comes from its manifest).
    pub restore: Option<Loaded>,
    /// Serve control requests on this socket.
    pub api: Option<ApiSocket>,
    /// When the restore began (for the restore-to-running time).
    pub since: Option<Instant>,
    /// A migration source waiting for `ok` once the restored VM is about to run (`--incoming`;
    /// if the VM fails before, the connection closes and the source resumes its VM).
    pub ack: Option<crate::snapshot::transport::Link>,
}

/// Builds the VM described by `cfg`, runs it to its end, and reports why it ended.
pub fn run(cfg: &VmConfig) -> Result<RunOutcome, VmError> {
    run_with(cfg, Start::default())
}

/// [`run`], restoring a snapshot and/or serving the API socket as `start` says.
pub fn run_with(cfg: &VmConfig, start: Start) -> Result<RunOutcome, VmError> {
    log::debug!("creating the VM");
    let restore = start.restore;
    let kvm_fd = Kvm::new().map_err(VmError::Kvm)?;
    let max_cpus = kvm_fd.get_max_vcpus().min(usize::from(u8::MAX));
    if cfg.cpus == 0 || usize::from(cfg.cpus) > max_cpus {
        if restore.is_some() {
            return Err(VmError::RestoreCpus {
                want: cfg.cpus,
                max: max_cpus,
            });
        }
        return Err(VmError::Cpus {
            got: cfg.cpus,
            max: max_cpus,
        });
    }
    let (name, bytes) = match &restore {
        Some(_) => (String::new(), Vec::new()),
        None => loader::image_bytes(&cfg.image)?,
    };
    let vm = Arc::new(kvm_fd.create_vm().map_err(kvm("create VM"))?);
    vm.set_identity_map_address(layout::KVM_IDENTITY_MAP_ADDR)
        .map_err(kvm("set identity map address"))?;
    vm.set_tss_address(layout::KVM_TSS_ADDR as usize)
        .map_err(kvm("set TSS address"))?;
    vm.create_irq_chip().map_err(kvm("create irqchip"))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(kvm("create PIT"))?;

    // `backend=cuda`: the engine comes first and backs guest RAM (CUDA maps only memory it
    // allocated at a chosen GPU VA). Declared before `mem`, so it is dropped after it.
    let cuda_engine = match &cfg.gpu {
        Some(g) if g.backend == vgpu::config::Backend::Cuda => Some(vgpu::Vgpu::cuda_engine(g)?),
        _ => None,
    };
    let ram_ids = std::cell::RefCell::new(Vec::new());
    let alloc = |len: usize| {
        let engine = cuda_engine.as_ref().ok_or("no engine")?;
        let (id, ptr) = engine
            .alloc_host_region(len as u64)
            .map_err(|e| e.to_string())?;
        ram_ids.borrow_mut().push(id);
        Ok(ptr)
    };
    let (mem, backing) = match &restore {
        // `backend=cuda`: guest RAM comes from the engine (as for a fresh VM) and the
        // snapshot's RAM is copied into it; not lazy, unlike the file mapping.
        Some(r) if cuda_engine.is_some() => {
            if r.manifest.ram_bytes != cfg.memory_mib << 20 {
                return Err(VmError::RestoreRamSize {
                    got: r.manifest.ram_bytes,
                    want: cfg.memory_mib << 20,
                });
            }
            let mem = memory::create(
                &vm,
                cfg.memory_mib,
                Some(&alloc as memory::RamAllocator<'_>),
            )?;
            let t = std::time::Instant::now();
            let n = ram::copy_into(&r.ram, r.manifest.ram_bytes, &mem)?;
            log::debug!(
                "restore: {n} bytes of RAM copied into engine memory in {:.1} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            (mem, ram::Backing::Other)
        }
        Some(r) => {
            let mem = ram::map_private(&r.ram, r.manifest.ram_bytes)?;
            memory::register(&vm, &mem)?;
            (mem, ram::Backing::Other)
        }
        None => {
            let mem = memory::create(
                &vm,
                cfg.memory_mib,
                cuda_engine
                    .as_ref()
                    .map(|_| &alloc as memory::RamAllocator<'_>),
            )?;
            let backing = match cuda_engine {
                Some(_) => ram::Backing::Other,
                None => ram::Backing::Anonymous,
            };
            (mem, backing)
        }
    };
    log::debug!("VM and {} MiB of RAM ready", cfg.memory_mib);
    // The vCPUs come before the images: a Linux command line gets the TSC rate.
    let mut vcpus = Vec::new();
    let mut tsc_khz = 0;
    for id in 0..cfg.cpus {
        let fd = vm.create_vcpu(u64::from(id)).map_err(kvm("create vCPU"))?;
        arch::setup_cpuid(&kvm_fd, &fd, id, cfg.cpus).map_err(|err| VmError::Cpu { id, err })?;
        arch::setup_lapic(&fd).map_err(|err| VmError::Cpu { id, err })?;
        if id == 0 {
            tsc_khz = fd.get_tsc_khz().map(u64::from).unwrap_or(0);
        }
        vcpus.push(fd);
    }
    let linux_boot = if restore.is_some() {
        None
    } else if cfg.linux || crate::linux::is_bzimage(&bytes) {
        let cmdline = crate::linux::guest::with_tsc(
            match cfg.cmdline.as_str() {
                "" => crate::linux::DEFAULT_CMDLINE,
                c => c,
            },
            tsc_khz,
        );
        let cmdline = cmdline.as_str();
        let ram = layout::ram_regions(cfg.memory_mib << 20);
        let initrd = cfg.initramfs.as_ref();
        Some(crate::linux::load(
            &mem, &ram, &name, &bytes, initrd, cmdline,
        )?)
    } else {
        None
    };
    let entry = match (&linux_boot, &restore) {
        (_, Some(_)) => 0,
        (Some(b), None) => b.entry,
        (None, None) => loader::load_elf(&mem, &name, &bytes)?,
    };
    if restore.is_none() {
        arch::write_boot_tables(&mem)?;
    }
    let boot_kind = match &restore {
        Some(r) => r.manifest.boot,
        None if linux_boot.is_some() => BootKind::Linux,
        None => BootKind::BareMetal,
    };

    let latch = Arc::new(ExitLatch::new().map_err(io("create exit eventfd"))?);
    let pio = Arc::new(Bus::new("pio"));
    let mmio_bus = Arc::new(Bus::new("mmio"));

    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(io("create serial irqfd"))?;
    vm.register_irqfd(&serial_irq, layout::SERIAL_IRQ)
        .map_err(kvm("register serial irqfd"))?;
    let out = crate::devices::console_out::console_out(cfg.console_prefix.clone());
    let serial_dev = Arc::new(Mutex::new(serial::SerialDevice::new(serial_irq, out)));
    // Every device with saved state, in one list: the controller saves them in a loop and a
    // restore puts each section back (`persist`). A new device with state goes here.
    let mut saved: Vec<Arc<dyn DeviceSnapshot>> = vec![serial_dev.clone()];
    let range = |r: std::ops::Range<u64>| (r.start, r.end - r.start);
    let (base, len) = range(layout::SERIAL_PORTS);
    pio.insert("serial", base, len, serial_dev.clone())?;
    let serial_dev_ctl = serial_dev.clone();
    let (base, len) = range(layout::I8042_PORTS);
    pio.insert(
        "i8042",
        base,
        len,
        Arc::new(Mutex::new(I8042::new(latch.clone()))),
    )?;
    pio.insert(
        "debug-exit",
        layout::DEBUG_EXIT_PORT,
        4,
        Arc::new(Mutex::new(DebugExit::new(latch.clone()))),
    )?;
    if boot_kind == BootKind::Linux {
        let cmos = Arc::new(Mutex::new(crate::linux::cmos::Cmos::default()));
        let (base, len) = range(layout::CMOS_PORTS);
        pio.insert("cmos", base, len, cmos.clone())?;
        saved.push(cmos);
        let post = Arc::new(Mutex::new(crate::linux::cmos::PostPort));
        pio.insert("post", layout::POST_PORT, 1, post)?;
    }
    let windows = PciWindows {
        mmio32: layout::PCI_MMIO32,
        mmio64: layout::PCI_MMIO64,
        pio: layout::PCI_PIO,
    };
    let mut root = PciRoot::new(mmio_bus.clone(), pio.clone(), windows);
    if cfg.testdev {
        let dev = Arc::new(Mutex::new(TestDev::new()?));
        root.add_device("testdev", dev.clone())?;
        saved.push(dev);
    }
    let gpu = match (&cfg.gpu, &cuda_engine) {
        (Some(g), Some(engine)) => {
            let gpu = vgpu::Vgpu::with_engine(
                g.clone(),
                engine.clone(),
                mem.clone(),
                ram_ids.take(),
                Arc::new(GpuIrq(vm.clone())),
            )?;
            root.add_device("vgpu", gpu.device())?;
            Some(Arc::new(gpu))
        }
        (Some(g), None) => {
            let slots = kvm_fd.get_nr_memslots();
            let mapper: Arc<dyn vgpu::remap::ApertureMapper> =
                Arc::new(SlotMapper::new(vm.clone(), slots));
            let gpu = vgpu::Vgpu::with_mapper(
                g.clone(),
                mem.clone(),
                Arc::new(GpuIrq(vm.clone())),
                Some(mapper),
            )?;
            root.add_device("vgpu", gpu.device())?;
            Some(Arc::new(gpu))
        }
        (None, _) => None,
    };
    let root = Arc::new(Mutex::new(root));
    saved.push(root.clone());
    if let Some(r) = &restore {
        // Every device's section (the PCI root's places the BARs again, so that the GPU's
        // `bar_moved` maps its apertures, and sets up MSI) before the GPU's own state comes
        // back (below).
        let devices: Vec<&dyn DeviceSnapshot> = saved.iter().map(|d| d.as_ref()).collect();
        persist::restore_all(&devices, &r.state.devices)?;
        if r.gpu.is_some() != gpu.is_some() {
            return Err(VmError::RestoreGpuMismatch);
        }
    }
    pio.insert(
        "pci-config",
        CONFIG_ADDRESS_PORT,
        CONFIG_PORTS_LEN,
        root.clone(),
    )?;

    if let Some(r) = &restore {
        vmstate::apply(&vm, &r.state.vm)?;
        for (fd, s) in vcpus.iter().zip(&r.state.vcpus) {
            cpu::apply(fd, s)?;
        }
        // The GPU last: it runs as soon as it is restored, and an interrupt it raises must
        // find the interrupt controllers' and LAPICs' restored state, not be overwritten by it.
        if let (Some(gpu), Some(img)) = (&gpu, &r.gpu) {
            let t = Instant::now();
            let mut rd = crate::snapshot::gpu::CheckedReader::new(
                std::io::BufReader::with_capacity(1 << 20, &img.file),
                img.bytes,
                img.crc32,
            );
            match &img.vram_base {
                Some(base) => gpu.restore_live(&mut rd, base)?,
                None => gpu.restore(&mut rd)?,
            }
            log::debug!(
                "restore: GPU image of {} bytes restored in {:.1} ms",
                img.bytes,
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    } else if let Some(boot) = &linux_boot {
        arch::setup_boot_vcpu(&vcpus[0], entry, 0).map_err(|err| VmError::Cpu { id: 0, err })?;
        crate::linux::setup_vcpu(&vcpus[0], boot)?;
    } else {
        let boot_info =
            loader::write_boot_info(&mem, &cfg.cmdline, cfg.cpus, memory::split(&mem), tsc_khz)?;
        arch::setup_boot_vcpu(&vcpus[0], entry, boot_info)
            .map_err(|err| VmError::Cpu { id: 0, err })?;
    }

    // Event loop: console input and the VM's lifecycle.
    let mut em: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
        EventManager::new().map_err(VmError::EventLoop)?;
    let interactive = std::io::stdin().is_terminal();
    let (rx, evt) = serial::spawn_stdin_reader().map_err(io("start the stdin reader"))?;
    let console = Arc::new(Mutex::new(serial::ConsoleInput::new(
        serial_dev,
        rx,
        evt,
        latch.clone(),
        interactive,
    )));
    em.add_subscriber(console.clone());
    let lifecycle = Lifecycle::new(latch.clone(), cfg.timeout, Some(console))
        .map_err(io("set up signals and timers"))?;
    em.add_subscriber(Arc::new(Mutex::new(lifecycle)));
    let _raw = interactive.then(RawTerminal::enter);

    vcpu::install_kick_handler().map_err(|e| VmError::Io {
        what: "install the vCPU kick handler",
        err: e.into(),
    })?;
    let counters: Vec<Arc<ExitCounters>> = (0..cfg.cpus).map(|_| Arc::default()).collect();
    let gate = Arc::new(PauseGate::default());
    let threads = Arc::new(Mutex::new(Vec::new()));
    let live_reports = Arc::new(Mutex::new(Vec::new()));
    let api_server = match start.api {
        Some(api) => {
            let (msrs, refused) = cpu::saveable_msrs(&kvm_fd, &vcpus[0])?;
            log::debug!(
                "snapshots save {} MSRs; KVM lists but refuses to read {:x?}",
                msrs.len(),
                refused
            );
            let manifest = Manifest {
                format: crate::snapshot::manifest::FORMAT.into(),
                version: crate::snapshot::format::VERSION,
                vmm_version: env!("CARGO_PKG_VERSION").into(),
                memory_mib: cfg.memory_mib,
                cpus: cfg.cpus,
                boot: boot_kind,
                image: match &restore {
                    Some(r) => r.manifest.image.clone(),
                    None => match &cfg.image {
                        Image::Bundled(n) => n.clone(),
                        Image::File(p) => p.display().to_string(),
                    },
                },
                testdev: cfg.testdev,
                gpu: cfg.gpu.as_ref().map(crate::snapshot::gpu::spec),
                tsc_khz,
                msrs: msrs.len(),
                state_bytes: 0,
                state_crc32: 0,
                ram_bytes: 0,
                ram_pages: 0,
                gpu_bytes: 0,
                gpu_crc32: 0,
                gpu_live: false,
            };
            let controller = Arc::new(Controller {
                op: Mutex::default(),
                gate: gate.clone(),
                threads: threads.clone(),
                latch: latch.clone(),
                vm: vm.clone(),
                mem: mem.clone(),
                backing,
                serial: serial_dev_ctl.clone(),
                devices: saved.clone(),
                counters: counters.clone(),
                manifest,
                msrs,
                gpu: gpu.as_ref().map(Arc::downgrade),
                started: Instant::now(),
                live_reports: live_reports.clone(),
            });
            Some(api.serve(controller).map_err(io("start the API socket"))?)
        }
        None => None,
    };
    log::debug!("devices and vCPUs ready; starting");
    let started = Instant::now();
    for (id, fd) in vcpus.into_iter().enumerate() {
        let v = Vcpu {
            id: id as u8,
            fd,
            pio: pio.clone(),
            mmio: mmio_bus.clone(),
            latch: latch.clone(),
            counters: counters[id].clone(),
            gate: gate.clone(),
        };
        match v.spawn() {
            Ok(t) => threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(t),
            Err(err) => {
                latch.request(ExitReason::VcpuError {
                    vcpu: id as u8,
                    what: format!("spawn thread: {err}"),
                });
                break;
            }
        }
    }
    if let Some(mut conn) = start.ack {
        crate::snapshot::stream::answer(&mut conn, Ok(()));
    }
    if let Some(since) = start.since {
        log::debug!(
            "restore to running: {:.1} ms",
            since.elapsed().as_secs_f64() * 1e3
        );
    }
    while !latch.stopping() {
        em.run_with_timeout(100).map_err(VmError::EventLoop)?;
    }
    let threads = std::mem::take(&mut *threads.lock().unwrap_or_else(PoisonError::into_inner));
    gate.resume();
    vcpu::stop_all(threads, Duration::from_secs(2));
    drop(api_server);
    let run_ms = started.elapsed().as_secs_f64() * 1e3;
    let reason = latch.reason().unwrap_or(ExitReason::VcpuError {
        vcpu: 0,
        what: "stopped without a reason".into(),
    });
    let stats = Stats {
        exit_reason: reason.to_string(),
        exit_code: reason.code(),
        run_ms,
        vcpus: counters
            .iter()
            .enumerate()
            .map(|(i, c)| VcpuStats {
                id: i as u8,
                exits: c.snapshot(),
            })
            .collect(),
        pio: pio.stats(),
        mmio: mmio_bus.stats(),
        gpu: gpu.as_deref().map(vgpu::Vgpu::stats),
        live: std::mem::take(&mut *live_reports.lock().unwrap_or_else(PoisonError::into_inner)),
    };
    drop(gpu);
    drop(mem);
    Ok(RunOutcome { reason, stats })
}

/// Delivers the virtual GPU's interrupts through KVM: MSI messages, or its INTA line.
struct GpuIrq(Arc<kvm_ioctls::VmFd>);

impl vgpu::IrqSink for GpuIrq {
    fn msi(&self, msg: mmio::pci::MsiMessage) {
        let m = kvm_bindings::kvm_msi {
            address_lo: msg.address as u32,
            address_hi: (msg.address >> 32) as u32,
            data: msg.data,
            ..Default::default()
        };
        if let Err(e) = self.0.signal_msi(m) {
            log::warn!(
                "vgpu: MSI {:#x}/{:#x} not delivered: {e}",
                msg.address,
                msg.data
            );
        }
    }

    fn intx(&self, level: bool) {
        if let Err(e) = self.0.set_irq_line(layout::GPU_INTX_IRQ, level) {
            log::warn!("vgpu: INTA line {level}: {e}");
        }
    }
}

/// Puts the terminal in raw mode for an interactive console and restores it when dropped.
struct RawTerminal;

impl RawTerminal {
    fn enter() -> Self {
        use vmm_sys_util::terminal::Terminal;
        if let Err(e) = std::io::stdin().lock().set_raw_mode() {
            log::warn!("console: cannot set raw mode: {e}");
        }
        RawTerminal
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        use vmm_sys_util::terminal::Terminal;
        let _ = std::io::stdin().lock().set_canon_mode();
    }
}
