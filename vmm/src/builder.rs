//! Building a VM, in the manner of Firecracker's builder: [`build_for_boot`] (an image loaded,
//! the boot vCPU at its entry), [`build_from_snapshot`] (RAM, devices, VM, vCPU and GPU
//! state from a snapshot) and `crate::standby::build::build_on_standby` (the same into a VM
//! made before) all return a [`PausedVm`]: everything created and in place, no vCPU
//! thread started. [`crate::vm`] runs it. Each phase is one function with its own error enum:
//! the KVM VM ([`create_vm`], [`BuildError`]), guest RAM ([`guest_ram`]), the vCPUs
//! ([`create_vcpus`]), the image ([`load_image`]), the devices and buses ([`Devices::create`],
//! the one place a device is added), the GPU ([`attach_gpu`]) and the snapshot's state
//! ([`restore_state`], [`RestoreError`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvm_bindings::{KVM_PIT_SPEAKER_DUMMY, kvm_pit_config};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use mmio::Bus;
use mmio::pci::{CONFIG_ADDRESS_PORT, CONFIG_PORTS_LEN, PciRoot, PciWindows};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::arch;
use crate::devices::{debug_exit::DebugExit, i8042::I8042, serial, testdev::TestDev};
use crate::exit::ExitLatch;
use crate::layout;
use crate::loader::{self, LoadError};
use crate::memory::{self, MemoryError};
use crate::persist::{self, DeviceSnapshot};
use crate::slots::SlotMapper;
use crate::snapshot::load::Loaded;
use crate::snapshot::manifest::BootKind;
use crate::snapshot::restore_report::{RestoreReport, ms_since};
use crate::snapshot::{cpu, ram, vmstate};
use crate::standby::ram::Reservation;
use crate::vm::VmConfig;

/// Errors creating the VM, its RAM, vCPUs and devices, and loading its image.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("open /dev/kvm: {0}")]
    Kvm(kvm_ioctls::Error),
    #[error("{what}: {err}")]
    KvmSetup {
        what: &'static str,
        err: kvm_ioctls::Error,
    },
    #[error("--cpus must be between 1 and {max}, got {got}")]
    Cpus { got: u8, max: usize },
    #[error("restore: the snapshot needs {want} vCPUs, KVM allows {max}")]
    RestoreCpus { want: u8, max: usize },
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
    #[error("virtual GPU: {0}")]
    Gpu(#[from] vgpu::VgpuError),
    #[error("Linux boot: {0}")]
    Linux(#[from] crate::linux::LinuxError),
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskError),
}

/// Errors putting a snapshot's state back.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("restore guest RAM: {0}")]
    Ram(#[from] ram::RamError),
    #[error("restore: the snapshot has {got} bytes of RAM, the configuration {want}")]
    RamSize { got: u64, want: u64 },
    #[error("restore: {0}")]
    Vm(#[from] vmstate::VmStateError),
    #[error("restore: {0}")]
    Cpu(#[from] cpu::CpuStateError),
    #[error("restore: {0}")]
    Device(#[from] persist::PersistError),
    #[error("restore: the virtual GPU: {0}")]
    Gpu(#[from] vgpu::snapshot::SnapshotError),
    #[error("restore: the VM's GPU configuration does not match the snapshot's")]
    GpuMismatch,
    #[error(
        "restore: the standby's GPU engine failed while a migration's rounds were written into \
         it"
    )]
    EngineLost,
    #[error("restore: {0}")]
    Build(#[from] BuildError),
}

pub(crate) fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> BuildError {
    move |err| BuildError::KvmSetup { what, err }
}

pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> BuildError {
    move |err| BuildError::Io { what, err }
}

/// A VM with everything in place and no vCPU running.
pub struct PausedVm {
    pub kvm: Kvm,
    pub vm: Arc<VmFd>,
    pub vcpus: Vec<VcpuFd>,
    pub tsc_khz: u64,
    pub mem: GuestMemoryMmap,
    pub backing: ram::Backing,
    pub boot: BootKind,
    /// What was booted (the manifest's `image`).
    pub image: String,
    pub latch: Arc<ExitLatch>,
    pub devices: Devices,
    pub gpu: Option<Arc<vgpu::Vgpu>>,
    /// `backend=cuda`'s engine, which backs guest RAM: dropped after it.
    pub cuda_engine: Option<Arc<dyn pgpu::EngineSnapshot>>,
    /// A standby's guest RAM mappings (the snapshot's file mapped over them): dropped after
    /// guest memory.
    pub ram_owner: Option<Reservation>,
    /// The MSRs snapshots save, listed before (a standby); `None`: listed when the API starts.
    pub msrs: Option<Vec<u32>>,
    /// A restored VM: its restore's times so far (`vm` adds the start and the total).
    pub restore: Option<RestoreReport>,
}

/// Builds the VM `cfg` describes, its image loaded and the boot vCPU at its entry.
pub fn build_for_boot(cfg: &VmConfig) -> Result<PausedVm, BuildError> {
    let (kvm, vm) = create_vm(cfg, false)?;
    let (name, bytes) = loader::image_bytes(&cfg.image)?;
    let (engine, registered) = cuda_engine(cfg)?;
    let ram_ids = std::cell::RefCell::new(Vec::new());
    let (mem, backing) = guest_ram(&vm, cfg, engine.as_ref(), &ram_ids)?;
    let (vcpus, tsc_khz) = create_vcpus(&kvm, &vm, cfg)?;
    let boot = load_image(cfg, &mem, &vcpus, tsc_khz, &name, &bytes)?;
    let latch = Arc::new(ExitLatch::new().map_err(io("create exit eventfd"))?);
    let mut devices = Devices::create(&vm, cfg, &mem, boot, &latch)?;
    let gpu = attach_gpu(
        &kvm,
        &vm,
        cfg,
        &mem,
        (engine.as_ref(), registered, None),
        ram_ids.take(),
        &mut devices,
    )?;
    let image = match &cfg.image {
        loader::Image::Bundled(n) => n.clone(),
        loader::Image::File(p) => p.display().to_string(),
    };
    let devices = devices.finish()?;
    Ok(PausedVm {
        kvm,
        vm,
        vcpus,
        tsc_khz,
        mem,
        backing,
        boot,
        image,
        latch,
        devices,
        gpu,
        cuda_engine: engine,
        ram_owner: None,
        msrs: None,
        restore: None,
    })
}

/// Builds the VM of snapshot `r` (`cfg` from its manifest) with all its state in place; a
/// migration's destination on the GPU engine it made during the pre-copy rounds (taken from
/// `r`), its figures added to `r.incoming`. The parts' times go into the VM's `restore`.
pub fn build_from_snapshot(cfg: &VmConfig, r: &mut Loaded) -> Result<PausedVm, RestoreError> {
    let t0 = Instant::now();
    let mut report = RestoreReport::default();
    let prepared = r.gpu.as_mut().and_then(|g| g.prepared.take());
    let cuda = cfg
        .gpu
        .as_ref()
        .is_some_and(|g| g.backend == vgpu::config::Backend::Cuda);
    let (kvm, vm) = new_vm(cfg, true)?;
    // Without a cuda engine, guest RAM is the file mapped copy-on-write: its slots are
    // registered on a thread while the rest is made.
    let mut early_ram = None;
    if !cuda {
        let t = Instant::now();
        let mem = ram::map_private(&r.ram, r.manifest.ram_bytes)?;
        let pending = memory::PendingSlots::start(&vm, &mem).map_err(BuildError::from)?;
        report.ram_ms = ms_since(t);
        early_ram = Some((mem, pending));
    }
    setup_vm(&vm)?;
    report.vm_ms = ms_since(t0) - report.ram_ms;
    // The prepared engine is of the configuration `cfg` has (the same manifest and `--gpu`).
    let mut host_ram = Vec::new();
    let t = Instant::now();
    let (engine, registered, sim, applied) = match prepared
        .map(|p| (p.engine, p.vram_applied, p.ram))
    {
        Some((vgpu::PreparedEngine::Cuda(e, reg), applied, ram)) if cuda => {
            host_ram = ram;
            (Some(e), reg.map(|r| *r), None, applied)
        }
        Some((vgpu::PreparedEngine::Sim(e), applied, _)) if !cuda => (None, None, Some(e), applied),
        _ => {
            let (e, reg) = cuda_engine(cfg)?;
            (e, reg, None, false)
        }
    };
    report.engine_ms = ms_since(t);
    let ram_ids = std::cell::RefCell::new(Vec::new());
    let (mem, backing, slots) = match early_ram {
        Some((mem, pending)) => (mem, ram::Backing::Other, Some(pending)),
        None => {
            let t = Instant::now();
            let (mem, backing) = restored_ram(&vm, cfg, engine.as_ref(), &ram_ids, r, host_ram)?;
            report.ram_ms = ms_since(t);
            (mem, backing, None)
        }
    };
    let t = Instant::now();
    let (vcpus, tsc_khz) = create_vcpus(&kvm, &vm, cfg)?;
    report.vcpus_ms = ms_since(t);
    let made = Made {
        kvm,
        vm,
        vcpus,
        tsc_khz,
        mem,
        backing,
        engine,
        registered,
        sim,
        ram_ids: ram_ids.take(),
        applied,
        ram_owner: None,
        msrs: None,
        slots,
    };
    let (vm, delta) = assemble(cfg, r, made, report)?;
    note_incoming(r, &vm, delta);
    Ok(vm)
}

/// A migration's destination (`r` from its stream): the build's parts, and the live image's
/// `delta` bytes, into its figures (`r.incoming`).
pub(crate) fn note_incoming(r: &mut Loaded, vm: &PausedVm, delta: u64) {
    if let (Some((rep, _)), Some(t)) = (&mut r.incoming, &vm.restore) {
        rep.dest_build_ms = t.vm_ms + t.engine_ms + t.ram_ms + t.vcpus_ms + t.devices_ms;
        rep.dest_ram_ms = t.ram_ms;
        rep.dest_gpu_restore_ms = t.gpu_restore_ms;
        rep.dest_state_ms = t.state_ms;
        rep.dest_vram_pages_switch = delta / 4096;
    }
}

/// What a restore has made before its devices: KVM, guest RAM (and what backs it), vCPUs and
/// the GPU's engine.
pub(crate) struct Made {
    pub(crate) kvm: Kvm,
    pub(crate) vm: Arc<VmFd>,
    pub(crate) vcpus: Vec<VcpuFd>,
    pub(crate) tsc_khz: u64,
    pub(crate) mem: GuestMemoryMmap,
    pub(crate) backing: ram::Backing,
    /// A cuda engine (it backs guest RAM: its host regions `ram_ids`) and its vgpud
    /// registration, or a sim engine made before.
    pub(crate) engine: Option<Arc<dyn pgpu::EngineSnapshot>>,
    pub(crate) registered: Option<vgpu::HostRegistration>,
    pub(crate) sim: Option<Arc<pgpu::sim::SimEngine>>,
    pub(crate) ram_ids: Vec<pgpu::HostRegionId>,
    /// A live image's pre-copied VRAM is in the engine already.
    pub(crate) applied: bool,
    pub(crate) ram_owner: Option<Reservation>,
    pub(crate) msrs: Option<Vec<u32>>,
    /// Guest RAM's slots still being registered (waited for before the state goes in).
    pub(crate) slots: Option<memory::PendingSlots>,
}

/// The devices and the GPU's device on `m`, then the snapshot's state put back; the parts'
/// times added to `report`. Returns the VM and a live image's delta bytes.
pub(crate) fn assemble(
    cfg: &VmConfig,
    r: &Loaded,
    m: Made,
    mut report: RestoreReport,
) -> Result<(PausedVm, u64), RestoreError> {
    let t = Instant::now();
    let latch = Arc::new(ExitLatch::new().map_err(io("create exit eventfd"))?);
    let boot = r.manifest.boot;
    let mut devices = Devices::create(&m.vm, cfg, &m.mem, boot, &latch)?;
    let gpu = attach_gpu(
        &m.kvm,
        &m.vm,
        cfg,
        &m.mem,
        (m.engine.as_ref(), m.registered, m.sim),
        m.ram_ids,
        &mut devices,
    )?;
    let devices = devices.finish()?;
    if r.gpu.is_some() != gpu.is_some() {
        return Err(RestoreError::GpuMismatch);
    }
    report.devices_ms = ms_since(t);
    if let Some(p) = m.slots {
        let t = Instant::now();
        report.ram_slots_ms = p.wait().map_err(BuildError::from)?;
        report.ram_ms += ms_since(t);
    }
    let t = Instant::now();
    let delta = restore_state(
        &m.vm,
        &m.vcpus,
        &devices,
        gpu.as_deref(),
        r,
        m.applied,
        &mut report,
    )?;
    report.state_ms = ms_since(t) - report.gpu_restore_ms;
    log::debug!("restore: built and restored ({})", report.parts());
    let vm = PausedVm {
        kvm: m.kvm,
        vm: m.vm,
        vcpus: m.vcpus,
        tsc_khz: m.tsc_khz,
        mem: m.mem,
        backing: m.backing,
        boot,
        image: r.manifest.image.clone(),
        latch,
        devices,
        gpu,
        cuda_engine: m.engine,
        ram_owner: m.ram_owner,
        msrs: m.msrs,
        restore: Some(report),
    };
    Ok((vm, delta))
}

/// The KVM VM with its in-kernel irqchip and PIT (`cfg.cpus` checked against what KVM allows).
pub fn create_vm(cfg: &VmConfig, restoring: bool) -> Result<(Kvm, Arc<VmFd>), BuildError> {
    let (kvm_fd, vm) = new_vm(cfg, restoring)?;
    setup_vm(&vm)?;
    Ok((kvm_fd, vm))
}

/// The KVM VM without its irqchip and PIT ([`setup_vm`] adds them).
fn new_vm(cfg: &VmConfig, restoring: bool) -> Result<(Kvm, Arc<VmFd>), BuildError> {
    log::debug!("creating the VM");
    let kvm_fd = Kvm::new().map_err(BuildError::Kvm)?;
    let max = kvm_fd.get_max_vcpus().min(usize::from(u8::MAX));
    if cfg.cpus == 0 || usize::from(cfg.cpus) > max {
        return Err(match restoring {
            true => BuildError::RestoreCpus {
                want: cfg.cpus,
                max,
            },
            false => BuildError::Cpus { got: cfg.cpus, max },
        });
    }
    let vm = Arc::new(kvm_fd.create_vm().map_err(kvm("create VM"))?);
    Ok((kvm_fd, vm))
}

/// The identity map and TSS addresses, the in-kernel irqchip and PIT.
fn setup_vm(vm: &VmFd) -> Result<(), BuildError> {
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
    Ok(())
}

/// `backend=cuda`: the engine comes first and backs guest RAM (CUDA maps only memory it
/// allocated at a chosen GPU VA). Shared (`host=`), the VM registers with vgpud before it, to
/// open the device the daemon placed it on.
type CudaEngine = (
    Option<Arc<dyn pgpu::EngineSnapshot>>,
    Option<vgpu::HostRegistration>,
);

fn cuda_engine(cfg: &VmConfig) -> Result<CudaEngine, BuildError> {
    match &cfg.gpu {
        Some(g) if g.backend == vgpu::config::Backend::Cuda => {
            let (e, reg) = vgpu::Vgpu::cuda_engine(g)?;
            Ok((Some(e), reg))
        }
        _ => Ok((None, None)),
    }
}

type RamIds = std::cell::RefCell<Vec<pgpu::HostRegionId>>;

/// Guest RAM from `engine` (recording its host regions in `ids`), else anonymous memory.
fn guest_ram(
    vm: &VmFd,
    cfg: &VmConfig,
    engine: Option<&Arc<dyn pgpu::EngineSnapshot>>,
    ids: &RamIds,
) -> Result<(GuestMemoryMmap, ram::Backing), BuildError> {
    let alloc = |len: usize| {
        let engine = engine.ok_or("no engine")?;
        let (id, ptr) = engine
            .alloc_host_region(len as u64)
            .map_err(|e| e.to_string())?;
        ids.borrow_mut().push(id);
        Ok(ptr)
    };
    let allocator = engine.map(|_| &alloc as memory::RamAllocator<'_>);
    let mem = memory::create(vm, cfg.memory_mib, allocator)?;
    let backing = match engine {
        Some(_) => ram::Backing::Other,
        None => ram::Backing::Anonymous,
    };
    log::debug!("VM and {} MiB of RAM ready", cfg.memory_mib);
    Ok((mem, backing))
}

/// A snapshot's RAM: its file mapped copy-on-write, or with `backend=cuda` copied into
/// engine-allocated RAM (not lazy). `prepared`: guest RAM a migration's destination allocated
/// from `engine` during the rounds (host region, address, bytes, in the layout's order), with
/// every received page in it already: taken as it is, nothing copied.
fn restored_ram(
    vm: &VmFd,
    cfg: &VmConfig,
    engine: Option<&Arc<dyn pgpu::EngineSnapshot>>,
    ids: &RamIds,
    r: &Loaded,
    prepared: Vec<(pgpu::HostRegionId, usize, u64)>,
) -> Result<(GuestMemoryMmap, ram::Backing), RestoreError> {
    if engine.is_none() {
        let mem = ram::map_private(&r.ram, r.manifest.ram_bytes)?;
        memory::register(vm, &mem).map_err(BuildError::from)?;
        return Ok((mem, ram::Backing::Other));
    }
    if r.manifest.ram_bytes != cfg.memory_mib << 20 {
        return Err(RestoreError::RamSize {
            got: r.manifest.ram_bytes,
            want: cfg.memory_mib << 20,
        });
    }
    if !prepared.is_empty() {
        let next = std::cell::Cell::new(0usize);
        let alloc = |len: usize| {
            let i = next.get();
            next.set(i + 1);
            match prepared.get(i) {
                Some(&(id, addr, n)) if n == len as u64 => {
                    ids.borrow_mut().push(id);
                    std::ptr::NonNull::new(addr as *mut u8).ok_or_else(|| "null".to_owned())
                }
                _ => Err(format!("no prepared guest RAM region {i} of {len} bytes")),
            }
        };
        let mem = memory::create(vm, cfg.memory_mib, Some(&alloc)).map_err(BuildError::from)?;
        log::debug!("restore: guest RAM allocated and received during the rounds");
        return Ok((mem, ram::Backing::Other));
    }
    let (mem, backing) = guest_ram(vm, cfg, engine, ids)?;
    let t = Instant::now();
    let n = ram::copy_into(&r.ram, r.manifest.ram_bytes, &mem)?;
    log::debug!(
        "restore: {n} bytes of RAM copied into engine memory in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok((mem, backing))
}

/// The vCPUs with their CPUID and LAPIC, and the TSC rate (vCPU 0's).
pub(crate) fn create_vcpus(
    kvm_fd: &Kvm,
    vm: &VmFd,
    cfg: &VmConfig,
) -> Result<(Vec<VcpuFd>, u64), BuildError> {
    let mut vcpus = Vec::new();
    let mut tsc_khz = 0;
    for id in 0..cfg.cpus {
        let fd = vm.create_vcpu(u64::from(id)).map_err(kvm("create vCPU"))?;
        arch::setup_cpuid(kvm_fd, &fd, id, cfg.cpus).map_err(|err| BuildError::Cpu { id, err })?;
        arch::setup_lapic(&fd).map_err(|err| BuildError::Cpu { id, err })?;
        if id == 0 {
            tsc_khz = fd.get_tsc_khz().map(u64::from).unwrap_or(0);
        }
        vcpus.push(fd);
    }
    Ok((vcpus, tsc_khz))
}

/// Loads the image (a Linux kernel, or a bare-metal ELF with its boot tables and boot info)
/// and points the boot vCPU at its entry. The vCPUs come first: a Linux command line gets the
/// TSC rate.
fn load_image(
    cfg: &VmConfig,
    mem: &GuestMemoryMmap,
    vcpus: &[VcpuFd],
    tsc_khz: u64,
    name: &str,
    bytes: &[u8],
) -> Result<BootKind, BuildError> {
    let boot = &vcpus[0];
    if cfg.linux || crate::linux::is_bzimage(bytes) {
        let cmdline = crate::linux::guest::with_tsc(
            match cfg.cmdline.as_str() {
                "" => crate::linux::DEFAULT_CMDLINE,
                c => c,
            },
            tsc_khz,
        ) + &crate::disk::cmdline(cfg.disks.len());
        let ram = layout::ram_regions(cfg.memory_mib << 20);
        let initrd = cfg.initramfs.as_ref();
        let linux = crate::linux::load(mem, &ram, name, bytes, initrd, &cmdline)?;
        arch::write_boot_tables(mem)?;
        arch::setup_boot_vcpu(boot, linux.entry, 0)
            .map_err(|err| BuildError::Cpu { id: 0, err })?;
        crate::linux::setup_vcpu(boot, &linux)?;
        return Ok(BootKind::Linux);
    }
    let entry = loader::load_elf(mem, name, bytes)?;
    arch::write_boot_tables(mem)?;
    let info = loader::write_boot_info(mem, &cfg.cmdline, cfg.cpus, memory::split(mem), tsc_khz)?;
    arch::setup_boot_vcpu(boot, entry, info).map_err(|err| BuildError::Cpu { id: 0, err })?;
    Ok(BootKind::BareMetal)
}

/// The buses and devices. [`Devices::create`] is the one place a device is added: create it,
/// put it on its bus, and push it onto `saved` if it has state for snapshots
/// ([`crate::persist::Persist`]).
pub struct Devices {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    /// The UART (console input goes to it; its output is flushed at a pause).
    pub serial: Arc<Mutex<serial::SerialDevice>>,
    /// The PCI root complex (devices are added while building, then it goes on the PIO bus).
    root: Option<PciRoot>,
    /// The disks (`--disk`, `--run`'s image) on the MMIO bus.
    pub disks: crate::disk::Disks,
    /// Every device with state in the state file, in the order a restore puts it back.
    pub saved: Vec<Arc<dyn DeviceSnapshot>>,
}

impl Devices {
    /// The legacy devices, the CMOS and POST ports on Linux boots, the disks (virtio-mmio),
    /// the PCI root and its devices but the GPU ([`attach_gpu`]).
    pub fn create(
        vm: &VmFd,
        cfg: &VmConfig,
        mem: &GuestMemoryMmap,
        boot: BootKind,
        latch: &Arc<ExitLatch>,
    ) -> Result<Devices, BuildError> {
        let pio = Arc::new(Bus::new("pio"));
        let mmio = Arc::new(Bus::new("mmio"));
        let range = |r: std::ops::Range<u64>| (r.start, r.end - r.start);

        let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(io("create serial irqfd"))?;
        vm.register_irqfd(&irq, layout::SERIAL_IRQ)
            .map_err(kvm("register serial irqfd"))?;
        let out = crate::devices::console_out::console_out(cfg.console_prefix.clone());
        let serial = Arc::new(Mutex::new(serial::SerialDevice::new(irq, out)));
        let (base, len) = range(layout::SERIAL_PORTS);
        pio.insert("serial", base, len, serial.clone())?;
        let mut saved: Vec<Arc<dyn DeviceSnapshot>> = vec![serial.clone()];

        let (base, len) = range(layout::I8042_PORTS);
        let i8042 = Arc::new(Mutex::new(I8042::new(latch.clone())));
        pio.insert("i8042", base, len, i8042)?;
        let exit = Arc::new(Mutex::new(DebugExit::new(latch.clone())));
        pio.insert("debug-exit", layout::DEBUG_EXIT_PORT, 4, exit)?;
        if boot == BootKind::Linux {
            let cmos = Arc::new(Mutex::new(crate::linux::cmos::Cmos::default()));
            let (base, len) = range(layout::CMOS_PORTS);
            pio.insert("cmos", base, len, cmos.clone())?;
            saved.push(cmos);
            let post = Arc::new(Mutex::new(crate::linux::cmos::PostPort));
            pio.insert("post", layout::POST_PORT, 1, post)?;
        }
        let disks = crate::disk::Disks::attach(&cfg.disks, vm, &mmio, mem)?;
        for d in disks.devices() {
            saved.push(d.clone());
        }

        let windows = PciWindows {
            mmio32: layout::PCI_MMIO32,
            mmio64: layout::PCI_MMIO64,
            pio: layout::PCI_PIO,
        };
        let mut root = PciRoot::new(mmio.clone(), pio.clone(), windows);
        if cfg.testdev {
            let dev = Arc::new(Mutex::new(TestDev::new()?));
            root.add_device("testdev", dev.clone())?;
            saved.push(dev);
        }
        Ok(Devices {
            pio,
            mmio,
            serial,
            root: Some(root),
            disks,
            saved,
        })
    }

    /// Puts the PCI root on the PIO bus (no device is added after this); it is saved and
    /// restored last of the devices, after every function it holds.
    fn finish(mut self) -> Result<Devices, BuildError> {
        if let Some(root) = self.root.take() {
            let root = Arc::new(Mutex::new(root));
            self.pio.insert(
                "pci-config",
                CONFIG_ADDRESS_PORT,
                CONFIG_PORTS_LEN,
                root.clone(),
            )?;
            self.saved.push(root);
        }
        Ok(self)
    }
}

/// What a GPU is built on: a cuda engine and its vgpud registration, or a sim engine made
/// before (a migration's destination); none of them: a sim engine of its own.
type GpuEngine<'a> = (
    Option<&'a Arc<dyn pgpu::EngineSnapshot>>,
    Option<vgpu::HostRegistration>,
    Option<Arc<pgpu::sim::SimEngine>>,
);

/// The virtual GPU (`--gpu`) on the PCI root: on `engine` (`backend=cuda`, guest RAM its host
/// regions `ram_ids`, and its registration with vgpud when shared), else its own engine with its
/// aperture remapped through KVM slots (on `sim`, a sim engine made before, if given).
fn attach_gpu(
    kvm_fd: &Kvm,
    vm: &Arc<VmFd>,
    cfg: &VmConfig,
    mem: &GuestMemoryMmap,
    (engine, registered, sim): GpuEngine<'_>,
    ram_ids: Vec<pgpu::HostRegionId>,
    devices: &mut Devices,
) -> Result<Option<Arc<vgpu::Vgpu>>, BuildError> {
    let Some(g) = &cfg.gpu else {
        return Ok(None);
    };
    let irq = Arc::new(crate::vm::GpuIrq(vm.clone()));
    let gpu = match engine {
        Some(engine) => vgpu::Vgpu::with_engine(
            g.clone(),
            engine.clone(),
            mem.clone(),
            ram_ids,
            irq,
            registered,
        )?,
        None => {
            let slots = kvm_fd.get_nr_memslots();
            let mapper: Arc<dyn vgpu::remap::ApertureMapper> =
                Arc::new(SlotMapper::new(vm.clone(), slots));
            match sim {
                Some(e) => {
                    vgpu::Vgpu::with_prepared_sim(g.clone(), e, mem.clone(), irq, Some(mapper))?
                }
                None => vgpu::Vgpu::with_mapper(g.clone(), mem.clone(), irq, Some(mapper))?,
            }
        }
    };
    if let Some(root) = devices.root.as_mut() {
        root.add_device("vgpu", gpu.device())?;
    }
    Ok(Some(Arc::new(gpu)))
}

/// Puts a snapshot's state back, in Firecracker's order: every device's section (the PCI
/// root's places the BARs again, so that the GPU's `bar_moved` maps its apertures, and sets up
/// MSI), the VM (PIT, clock, irqchips), each vCPU, and the GPU last: it runs as soon as it is
/// restored, and an interrupt it raises must find the interrupt controllers' and LAPICs'
/// restored state, not be overwritten by it. `applied`: a live image's pre-copied VRAM is in
/// the GPU's partition already (a migration's prepared engine). The GPU's restore time and
/// parts go into `report`; returns a live image's delta bytes.
fn restore_state(
    vm: &VmFd,
    vcpus: &[VcpuFd],
    devices: &Devices,
    gpu: Option<&vgpu::Vgpu>,
    r: &Loaded,
    applied: bool,
    report: &mut RestoreReport,
) -> Result<u64, RestoreError> {
    let saved: Vec<&dyn DeviceSnapshot> = devices.saved.iter().map(|d| d.as_ref()).collect();
    persist::restore_all(&saved, &r.state.devices)?;
    vmstate::apply(vm, &r.state.vm)?;
    for (fd, s) in vcpus.iter().zip(&r.state.vcpus) {
        cpu::apply(fd, s)?;
    }
    if let (Some(gpu), Some(img)) = (gpu, &r.gpu) {
        let t = Instant::now();
        let checked = || {
            crate::snapshot::gpu::CheckedReader::new(
                std::io::BufReader::with_capacity(1 << 20, &img.file),
                img.bytes,
                img.crc32,
            )
        };
        // The file's CRC-32 (the manifest's) is reported first: the device stops at the first
        // section whose own CRC-32 fails, before the file's last byte; the rest of the file is
        // read through the check then.
        let file_first = |rd: &mut dyn std::io::Read| match std::io::copy(rd, &mut std::io::sink())
        {
            Err(io) => Err(vgpu::snapshot::SnapshotError::Io(io)),
            Ok(_) => Ok(()),
        };
        // A whole image is read at offsets by several threads (`restore_file`, which checks
        // the manifest's length and CRC-32 too, and leaves the file's position at 0); a live
        // snapshot's delta as a stream.
        let restored = match &img.vram_base {
            Some(base) => {
                let mut rd = checked();
                let r = match applied {
                    true => gpu.restore_live_applied(&mut rd),
                    false => gpu.restore_live(&mut rd, base),
                };
                if r.is_err() {
                    file_first(&mut rd)?;
                }
                r
            }
            None => {
                let r = gpu.restore_file_parts(&img.file, Some((img.bytes, img.crc32)));
                if r.is_err() {
                    file_first(&mut checked())?;
                }
                r.map(|p| report.gpu_parts(p))
            }
        };
        let delta = restored?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        report.gpu_restore_ms = ms;
        log::debug!(
            "restore: GPU image of {} bytes restored in {ms:.1} ms (VRAM pre-copied into the \
             engine during the rounds: {applied})",
            img.bytes,
        );
        return Ok(delta);
    }
    Ok(0)
}
