//! The VM's host memory budget (`--gpu hostmem=`) and the teardown of a device mid-load, driven
//! as a hostile guest would: many modules with large `.global` variables, many page
//! directories over a dense table. Host memory stays under the budget (the accounting
//! counters), evicted modules reload with correct results, work that cannot fit faults
//! RESOURCE_LIMIT, and dropping the device cancels a module load through the cancel flag.

mod common;

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use mmio::pci::PciDevice;
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{
    Engine, EngineError, EngineInfo, EngineSnapshot, HostRegionId, Job, LoadLimits, LoadedModule,
    MapTarget, Mapping, ModuleId, Outcome, PageSize, Perm, PreemptHandle, SavedContext, SpaceId,
    Translation, VaWindow,
};
use vgpu::regs::method::*;
use vgpu::regs::*;
use vgpu::{GpuConfig, Vgpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const SYS_VA_OFF: u64 = 2 << 20;
/// Sysmem offsets (inside the 2 MiB sysmem page at VA_BASE + 2 MiB).
const TEXT: u64 = 0x10_0000;
const ENTRY: u64 = 0x8000;
const PARAMS: u64 = 0x8100;
const OUT: u64 = 0x4000;
const SEM: u64 = 0x3000;

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

/// A module with a `.global` counter (each launch stores the old value to `out` and bumps
/// it) and `pad` further bytes of variables.
fn counter_ptx(pad: u64) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .global .align 4 .u32 counter;\n.global .align 8 .b8 pad[{pad}];\n\
         .visible .entry bump(.param .u64 out)\n{{\n\
         \t.reg .b32 %r<3>;\n\t.reg .b64 %rd<3>;\n\
         \tld.param.u64 %rd1, [out];\n\tmov.u64 %rd2, counter;\n\
         \tatom.global.add.u32 %r1, [%rd2], 1;\n\tst.global.u32 [%rd1], %r1;\n\tret;\n}}\n"
    )
}

/// VA_BASE → VRAM [0, 2M), VA_BASE + 2M → sysmem [SYS, SYS + 2M); channel 0 on PD.
fn setup(b: &Bench) {
    b.map_big(0, 1, 0);
    b.map_big(1, 2, SYS);
    b.bind(0, b.va_base + SYS_VA_OFF, 16);
    b.write(TLB_FLUSH, 1);
}

/// Runs pushbuffer `pb` as GPFIFO entry `slot` of channel 0.
fn submit(b: &Bench, slot: u32, pb: &[u8]) {
    let pb_off = 0x1000 + 0x200 * u64::from(slot);
    b.sys_write(SYS + pb_off, pb);
    let entry = (b.va_base + SYS_VA_OFF + pb_off) | ((pb.len() as u64 / 4) << 48);
    b.sys_write(SYS + 8 * u64::from(slot), &entry.to_le_bytes());
    b.write(DOORBELL_BASE, slot + 1);
}

/// Launches `bump` of `text` (one thread) as entry `slot`, then releases `slot + 1` to SEM.
fn launch(b: &Bench, slot: u32, text: &str) {
    let va = |off: u64| b.va_base + SYS_VA_OFF + off;
    b.sys_write(SYS + TEXT, text.as_bytes());
    b.sys_write(SYS + ENTRY, b"bump");
    b.sys_write(SYS + PARAMS, &va(OUT).to_le_bytes());
    let (code, entry, params, sem) = (va(TEXT), va(ENTRY), va(PARAMS), va(SEM));
    let pb = push(&[
        (
            CODE_HI,
            &[
                hi(code),
                code as u32,
                text.len() as u32,
                hi(entry),
                entry as u32,
                4,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                hi(params),
                params as u32,
                8,
                0,
            ],
        ),
        (
            SEM_ADDR_HI,
            &[hi(sem), sem as u32, slot + 1, SEM_OP_RELEASE],
        ),
    ]);
    submit(b, slot, &pb);
}

/// The launch of `slot` completed: the counter value it stored.
fn completed(b: &Bench, slot: u32) -> u32 {
    b.wait("the launch", |b| {
        b.sys_read(SYS + SEM, 4) == (slot + 1).to_le_bytes()
    });
    let v = b.sys_read(SYS + OUT, 4);
    u32::from_le_bytes([v[0], v[1], v[2], v[3]])
}

fn kind(b: &Bench) -> u32 {
    b.fault().0 & 0xff
}

#[test]
fn modules_are_evicted_under_the_budget_and_reload_with_fresh_variables() {
    // 16 MiB: one module with 6 MiB of variables fits at a time, not two.
    let b = Bench::with(|c| {
        c.hostmem = 16 << 20;
        // Loads count against the job's limit: room for slow machines.
        c.job_timeout = Duration::from_secs(20);
    });
    setup(&b);
    let a = counter_ptx(6 << 20);
    let other = counter_ptx((6 << 20) + 8);
    launch(&b, 0, &a);
    assert_eq!(completed(&b, 0), 0);
    launch(&b, 1, &a);
    assert_eq!(completed(&b, 1), 1, "cached: the variables persist");
    launch(&b, 2, &other);
    assert_eq!(completed(&b, 2), 0);
    launch(&b, 3, &a);
    assert_eq!(
        completed(&b, 3),
        0,
        "evicted and loaded again: fresh variables, correct result"
    );
    launch(&b, 4, &a);
    assert_eq!(completed(&b, 4), 1);
    let h = b.gpu.stats().counters.hostmem;
    assert_eq!((h.module_loads, h.modules_evicted), (3, 2), "{h:?}");
    assert!(
        h.peak <= h.limit && h.modules + h.spaces <= h.limit,
        "{h:?}"
    );
    assert!(h.modules >= 6 << 20, "the cached module is charged: {h:?}");
    assert_eq!(b.fault().0 & (1 << 31), 0, "no fault");
}

#[test]
fn many_modules_with_large_variables_stay_under_the_budget() {
    // Before the budget, every module stayed loaded: 10 x 6 MiB of variables for this VM.
    let b = Bench::with(|c| {
        c.hostmem = 16 << 20;
        // Loads count against the job's limit: room for slow machines.
        c.job_timeout = Duration::from_secs(20);
    });
    setup(&b);
    for i in 0..10u32 {
        launch(&b, i, &counter_ptx((6 << 20) + 8 * u64::from(i)));
        assert_eq!(completed(&b, i), 0);
        let h = b.gpu.stats().counters.hostmem;
        assert!(h.modules + h.spaces <= h.limit, "{h:?}");
    }
    let h = b.gpu.stats().counters.hostmem;
    assert_eq!((h.module_loads, h.modules_evicted), (10, 9), "{h:?}");
    assert!(h.peak <= h.limit, "{h:?}");
    // A module that cannot fit even alone: RESOURCE_LIMIT, ADDR = CODE_VA, INFO = 1.
    launch(&b, 10, &counter_ptx(20 << 20));
    b.wait("the fault", |b| b.read(CHAN_BASE + 4) & 0xf == CHAN_FAULTED);
    let (_, ch, addr, info) = b.fault();
    assert_eq!(
        (kind(&b), ch, addr, info),
        (
            u32::from(FaultKind::ResourceLimit.code()),
            0,
            b.va_base + SYS_VA_OFF + TEXT,
            1
        )
    );
    let h = b.gpu.stats().counters.hostmem;
    assert!(h.peak <= h.limit && h.refused == 1, "{h:?}");
}

/// Guest VRAM: a page table whose 512 PTEs all map one page, and page directories (16 KiB each)
/// whose PDEs from 2 on point at it: a dense shadow per directory (no two pages merge).
const PT: u64 = 0x60_0000;
const PAGE: u64 = 0x61_0000;
const PDS: u64 = 0x80_0000;
const INSTS: u64 = 0x70_0000;

fn dense_pd(b: &Bench, k: u64, pdes: u64) -> u64 {
    let pd = PDS + k * 0x4000;
    b.vram_write_u64(pd + 8, SYS | 1 << 2 | 2);
    for i in 2..pdes {
        b.vram_write_u64(pd + 8 * i, PT | 1);
    }
    pd
}

/// Binds channel 0 to a new instance block on `pd` and releases `payload` through it.
fn run_on(b: &Bench, k: u64, pd: u64, payload: u32) {
    let inst = INSTS + 0x1000 * k;
    b.vram_write_u64(inst, pd | 1);
    b.vram_write_u64(inst + 8, b.va_base + SYS_VA_OFF);
    b.vram_write_u64(inst + 16, 16);
    b.vram_write_u64(inst + 24, 0);
    b.write(CHAN_BASE, CHAN_INST_VALID | (inst >> 12) as u32);
    b.dev
        .lock()
        .unwrap()
        .bar_write(1, RUNLIST, &0u32.to_le_bytes());
    b.write(RUNLIST_BASE, (RUNLIST >> 12) as u32);
    b.write(RUNLIST_SUBMIT, 1);
    let sem = b.va_base + SYS_VA_OFF + SEM;
    submit(
        b,
        0,
        &push(&[(SEM_ADDR_HI, &[hi(sem), sem as u32, payload, SEM_OP_RELEASE])]),
    );
}

fn write_dense_table(b: &Bench) {
    for i in 0..512 {
        b.vram_write_u64(PT + 8 * i, PAGE | 1);
    }
}

#[test]
fn shadow_spaces_of_many_page_directories_stay_under_the_budget() {
    const PDES: u64 = 256;
    let b = Bench::with(|c| {
        c.hostmem = 16 << 20;
        // Loads count against the job's limit: room for slow machines.
        c.job_timeout = Duration::from_secs(20);
    });
    write_dense_table(&b);
    // What one directory's shadow costs (the accounting's own model of it).
    let mappings: Vec<Mapping> = (2..PDES)
        .flat_map(|i| {
            (0..512).map(move |j| Mapping {
                va: (i << 21) + (j << 12),
                len: 4096,
                target: MapTarget::Vram { pa: 0 },
                perm: Perm::ReadWrite,
                page_size: PageSize::Size4K,
            })
        })
        .collect();
    let window = VaWindow {
        base: 0,
        size: GpuConfig::default().va_size,
    };
    let one = shadow::host_bytes_of(window, &mappings);
    assert!(
        one > 4 << 20 && 3 * one > 16 << 20,
        "three shadows must not fit: {one}"
    );
    for k in 0..8u64 {
        let pd = dense_pd(&b, k, PDES);
        run_on(&b, k, pd, k as u32 + 1);
        b.wait("the release", |b| {
            b.sys_read(SYS + SEM, 4) == (k as u32 + 1).to_le_bytes()
        });
        let h = b.gpu.stats().counters.hostmem;
        assert!(h.modules + h.spaces <= h.limit, "{h:?}");
    }
    let h = b.gpu.stats().counters.hostmem;
    assert!(h.peak <= h.limit, "{h:?}");
    assert!(h.spaces_evicted >= 6, "{h:?}");
    assert!(h.spaces >= one, "the live shadow is charged: {h:?}");
    assert_eq!(b.fault().0 & (1 << 31), 0, "no fault: {:x?}", b.fault());
}

#[test]
fn a_shadow_that_cannot_fit_faults_resource_limit() {
    let b = Bench::with(|c| {
        c.hostmem = 16 << 20;
        // Loads count against the job's limit: room for slow machines.
        c.job_timeout = Duration::from_secs(20);
    });
    write_dense_table(&b);
    // 2048 PDEs of 512 distinct 4 KiB mappings: ~56 MiB of shadow for one directory.
    let pd = dense_pd(&b, 0, 2048);
    run_on(&b, 0, pd, 1);
    b.wait("the fault", |b| b.read(CHAN_BASE + 4) & 0xf == CHAN_FAULTED);
    let (_, ch, addr, info) = b.fault();
    assert_eq!(
        (kind(&b), ch, addr, info),
        (u32::from(FaultKind::ResourceLimit.code()), 0, pd, 2)
    );
    let h = b.gpu.stats().counters.hostmem;
    assert!(h.peak <= h.limit && h.spaces == 0, "{h:?}");
}

/// An engine whose module loads never end by themselves: they wait for the load's cancel flag
/// (ignoring the deadline), for up to a minute.
struct EndlessLoad {
    inner: SimEngine,
    started: AtomicBool,
    /// Whether a load ended because its cancel flag was set.
    cancelled: AtomicBool,
}

impl Engine for EndlessLoad {
    fn info(&self) -> &EngineInfo {
        self.inner.info()
    }
    fn vram_read(&self, pa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.inner.vram_read(pa, buf)
    }
    fn vram_write(&self, pa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.inner.vram_write(pa, data)
    }
    fn vram_fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), EngineError> {
        self.inner.vram_fill(pa, len, byte)
    }
    unsafe fn register_host_region(
        &self,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegionId, EngineError> {
        // SAFETY: the caller's promise is passed on unchanged.
        unsafe { self.inner.register_host_region(base, len) }
    }
    fn alloc_host_region(&self, len: u64) -> Result<(HostRegionId, NonNull<u8>), EngineError> {
        self.inner.alloc_host_region(len)
    }
    fn unregister_host_region(&self, region: HostRegionId) -> Result<(), EngineError> {
        self.inner.unregister_host_region(region)
    }
    fn create_space(&self, window: VaWindow) -> Result<SpaceId, EngineError> {
        self.inner.create_space(window)
    }
    fn destroy_space(&self, space: SpaceId) -> Result<(), EngineError> {
        self.inner.destroy_space(space)
    }
    fn map(&self, space: SpaceId, mapping: &Mapping) -> Result<(), EngineError> {
        self.inner.map(space, mapping)
    }
    fn map_batch(&self, space: SpaceId, mappings: &[Mapping]) -> Result<(), EngineError> {
        self.inner.map_batch(space, mappings)
    }
    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError> {
        self.inner.unmap(space, va, len)
    }
    fn lookup(&self, space: SpaceId, va: u64) -> Result<Option<Translation>, EngineError> {
        self.inner.lookup(space, va)
    }
    fn copy_to_space(&self, space: SpaceId, va: u64, data: &[u8]) -> Result<(), EngineError> {
        self.inner.copy_to_space(space, va, data)
    }
    fn copy_from_space(&self, space: SpaceId, va: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.inner.copy_from_space(space, va, buf)
    }
    fn load_module(&self, ptx: &str, limits: &LoadLimits) -> Result<LoadedModule, EngineError> {
        self.started.store(true, Ordering::SeqCst);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if limits
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::SeqCst))
            {
                self.cancelled.store(true, Ordering::SeqCst);
                return Err(EngineError::LoadCancelled);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.inner.load_module(ptx, limits)
    }
    fn unload_module(&self, module: ModuleId) -> Result<(), EngineError> {
        self.inner.unload_module(module)
    }
    fn execute(&self, job: &Job, preempt: &PreemptHandle) -> Result<Outcome, EngineError> {
        self.inner.execute(job, preempt)
    }
    fn resume(&self, c: SavedContext, preempt: &PreemptHandle) -> Result<Outcome, EngineError> {
        self.inner.resume(c, preempt)
    }
}

/// Snapshots are not what this engine tests: the extension's defaults.
impl EngineSnapshot for EndlessLoad {}

#[test]
fn dropping_the_device_cancels_a_module_load() {
    let cfg = GpuConfig {
        vram: VRAM,
        channels: 4,
        // Far beyond the test: only the cancel flag can end the load.
        job_timeout: Duration::from_secs(600),
        ..GpuConfig::default()
    };
    let engine = Arc::new(EndlessLoad {
        inner: SimEngine::new(SimConfig {
            vram_size: cfg.vram + 2 * cfg.guard,
            workers: 1,
            ..SimConfig::default()
        })
        .unwrap(),
        started: AtomicBool::new(false),
        cancelled: AtomicBool::new(false),
    });
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
    // Guest RAM as a host region of the engine, as the VMM registers it.
    let host = vm_memory::GuestMemoryBackend::get_host_address(&ram, GuestAddress(0)).unwrap();
    // SAFETY: `ram` maps RAM bytes at `host` and outlives the device and the engine's use.
    let region = unsafe { engine.register_host_region(host, RAM as usize) }.unwrap();
    let irq = Arc::new(CountingIrq::default());
    let gpu = Vgpu::with_engine(cfg, engine.clone(), ram.clone(), vec![region], irq, None).unwrap();
    let b = Bench {
        dev: gpu.device(),
        gpu,
        ram,
        irq: Arc::new(CountingIrq::default()),
        va_base: GpuConfig::default().va_base,
    };
    setup(&b);
    launch(&b, 0, &counter_ptx(64));
    let t = Instant::now();
    while !engine.started.load(Ordering::SeqCst) {
        assert!(t.elapsed() < Duration::from_secs(5), "the load never began");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(b);
    assert!(
        engine.cancelled.load(Ordering::SeqCst),
        "the device's teardown ended the load through its cancel flag"
    );
}
