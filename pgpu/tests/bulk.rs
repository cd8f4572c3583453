//! The bulk VRAM calls (`Engine::vram_nonzero_pages`, `vram_read_runs`, `vram_write_pages`,
//! `vram_zero`) on the sim engine (its in-place scan) and on the trait's default
//! implementations (a wrapper that forwards only the plain calls), checked by
//! `pgpu::bulk_check` against byte-by-byte scans: ranges not aligned to the 4 MiB chunk of the
//! defaults, runs across chunk boundaries, all zero and all non-zero.

use std::ops::ControlFlow;
use std::ptr::NonNull;

use pgpu::bulk_check::check_bulk;
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

fn sim(vram: u64) -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: vram,
        ..SimConfig::default()
    })
    .unwrap()
}

/// The sim engine with the bulk calls left to the trait's defaults.
struct Plain(SimEngine);

impl Engine for Plain {
    fn info(&self) -> &EngineInfo {
        self.0.info()
    }
    fn vram_read(&self, pa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.0.vram_read(pa, buf)
    }
    fn vram_write(&self, pa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.0.vram_write(pa, data)
    }
    fn vram_fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), EngineError> {
        self.0.vram_fill(pa, len, byte)
    }
    unsafe fn register_host_region(
        &self,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegionId, EngineError> {
        // SAFETY: forwarded from our caller.
        unsafe { self.0.register_host_region(base, len) }
    }
    fn alloc_host_region(&self, len: u64) -> Result<(HostRegionId, NonNull<u8>), EngineError> {
        self.0.alloc_host_region(len)
    }
    fn unregister_host_region(&self, region: HostRegionId) -> Result<(), EngineError> {
        self.0.unregister_host_region(region)
    }
    fn create_space(&self, window: VaWindow) -> Result<SpaceId, EngineError> {
        self.0.create_space(window)
    }
    fn destroy_space(&self, space: SpaceId) -> Result<(), EngineError> {
        self.0.destroy_space(space)
    }
    fn map(&self, space: SpaceId, mapping: &Mapping) -> Result<(), EngineError> {
        self.0.map(space, mapping)
    }
    fn map_batch(&self, space: SpaceId, mappings: &[Mapping]) -> Result<(), EngineError> {
        self.0.map_batch(space, mappings)
    }
    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError> {
        self.0.unmap(space, va, len)
    }
    fn lookup(&self, space: SpaceId, va: u64) -> Result<Option<Translation>, EngineError> {
        self.0.lookup(space, va)
    }
    fn copy_to_space(&self, space: SpaceId, va: u64, data: &[u8]) -> Result<(), EngineError> {
        self.0.copy_to_space(space, va, data)
    }
    fn copy_from_space(&self, space: SpaceId, va: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.0.copy_from_space(space, va, buf)
    }
    fn load_module(&self, ptx: &str, limits: &LoadLimits) -> Result<LoadedModule, EngineError> {
        self.0.load_module(ptx, limits)
    }
    fn unload_module(&self, module: ModuleId) -> Result<(), EngineError> {
        self.0.unload_module(module)
    }
    fn execute(&self, job: &Job, preempt: &PreemptHandle) -> Result<Outcome, EngineError> {
        self.0.execute(job, preempt)
    }
    fn resume(
        &self,
        context: SavedContext,
        preempt: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        self.0.resume(context, preempt)
    }
}

impl EngineSnapshot for Plain {}

fn engines() -> Vec<(&'static str, Box<dyn EngineSnapshot>)> {
    vec![
        ("sim", Box::new(sim(32 * MIB))),
        ("defaults", Box::new(Plain(sim(32 * MIB)))),
    ]
}

#[test]
fn bulk_calls_match_byte_scans() {
    for (name, e) in engines() {
        // Not aligned to the 4 MiB chunk, runs crossing chunk boundaries; the whole VRAM (no
        // guard pages); one page; a range ending at the last page.
        for (pa, pages, seed) in [
            (3 * PAGE, 3 * 1024 + 17, 1),
            (0, 32 * MIB / PAGE, 2),
            (5 * MIB, 1, 3),
            (32 * MIB - 70 * PAGE, 70, 4),
        ] {
            let r = check_bulk(&*e, pa, pages, seed)
                .unwrap_or_else(|m| panic!("{name} at {pa:#x}+{pages} pages: {m}"));
            assert!(r.nonzero > 0 && r.runs > 0, "{name}: {r:?}");
            if pages > 1024 {
                assert!(r.runs > 10, "{name}: {r:?}");
            }
        }
    }
}

#[test]
fn all_zero_and_all_nonzero_ranges() {
    for (name, e) in engines() {
        let (pa, pages) = (PAGE, 1024 * 2 + 3);
        let mut bm = vec![u64::MAX; (pages as usize).div_ceil(64)];
        e.vram_nonzero_pages(pa, pages, &mut bm).unwrap();
        assert!(bm.iter().all(|&w| w == 0), "{name}: fresh VRAM is zero");
        let mut calls = 0;
        let flow = e
            .vram_read_runs(&[], &mut |_| {
                calls += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
        assert!(flow.is_continue());
        assert_eq!(calls, 0, "{name}");
        e.vram_fill(pa, pages * PAGE, 0x5a).unwrap();
        e.vram_nonzero_pages(pa, pages, &mut bm).unwrap();
        let full = bm.iter().map(|w| w.count_ones() as u64).sum::<u64>();
        assert_eq!(
            full, pages,
            "{name}: every page non-zero, no bit past the range"
        );
        // One run of all of it comes back in pieces of whole pages, all 0x5a.
        let mut got = 0u64;
        let flow = e
            .vram_read_runs(&[(pa, pages * PAGE)], &mut |p| {
                assert!(p.iter().all(|&b| b == 0x5a) && (p.len() as u64).is_multiple_of(PAGE));
                got += p.len() as u64;
                ControlFlow::Continue(())
            })
            .unwrap();
        assert!(flow.is_continue());
        assert_eq!(got, pages * PAGE, "{name}");
        e.vram_zero(pa, pages * PAGE).unwrap();
        e.vram_nonzero_pages(pa, pages, &mut bm).unwrap();
        assert!(bm.iter().all(|&w| w == 0), "{name}: zeroed");
        // A short bitmap is refused.
        assert!(e.vram_nonzero_pages(pa, 65, &mut [0]).is_err(), "{name}");
    }
}

/// Runs `entry(a, n, c)` of the cuda engine's bulk kernels on `e` over `grid` blocks of 256.
fn launch(e: &SimEngine, space: SpaceId, module: ModuleId, entry: &str, grid: u32, a: [u64; 3]) {
    let params: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
    let job = Job::Launch(LaunchJob {
        space,
        module,
        entry: entry.into(),
        grid: [grid, 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        params,
    });
    let out = e.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{entry}: {out:?}");
}

#[test]
fn cuda_bulk_kernels_on_the_sim_interpreter() {
    // VRAM mapped at VA = BASE + pa; the kernels see device addresses as the cuda engine's
    // private mapping gives them.
    const BASE: u64 = 0x4_0000_0000;
    let vram = 8 * MIB;
    let e = sim(vram);
    let space = e
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    e.map(
        space,
        &Mapping {
            va: BASE,
            len: vram,
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let module = e
        .load_module(pgpu::cuda::BULK_PTX, &LoadLimits::default())
        .unwrap()
        .id;
    // 300 pages at 1 MiB: page p non-zero when p % 7 is 0 or 3, with one byte at an offset
    // that walks the page (first and last bytes included).
    let (src, pages) = (MIB, 300u64);
    let mut want = vec![0u64; 5];
    for p in 0..pages {
        if p % 7 == 0 || p % 7 == 3 {
            let off = [0, PAGE - 1, (p * 37) % PAGE][(p % 3) as usize];
            e.vram_write(src + p * PAGE + off, &[0x80]).unwrap();
            want[(p / 64) as usize] |= 1 << (p % 64);
        }
    }
    // Bitmap at 6 MiB (u32 words), zeroed; 3 blocks of 8 warps stride over 300 pages.
    let bm = 6 * MIB;
    launch(
        &e,
        space,
        module,
        "vram_nonzero",
        3,
        [BASE + src, pages, BASE + bm],
    );
    let mut got = vec![0u8; 40];
    e.vram_read(bm, &mut got).unwrap();
    let got: Vec<u64> = got
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want, "bitmap");
    // Gather the non-zero pages (descending) to 4 MiB, packed; scatter them back to 2.5 MiB
    // on (the layout: sources 1-2.2 MiB, copies 2.5-3.7, packed 4-4.4, bitmap 6, list 7).
    const DST: u64 = BASE + 2560 * 1024;
    let list: Vec<u64> = (0..pages)
        .rev()
        .filter(|p| want[(p / 64) as usize] >> (p % 64) & 1 == 1)
        .map(|p| BASE + src + p * PAGE)
        .collect();
    let lpa = 7 * MIB;
    let lb: Vec<u8> = list.iter().flat_map(|v| v.to_le_bytes()).collect();
    e.vram_write(lpa, &lb).unwrap();
    let n = list.len() as u64;
    launch(
        &e,
        space,
        module,
        "vram_gather",
        2,
        [BASE + lpa, n, BASE + 4 * MIB],
    );
    for (i, &va) in list.iter().enumerate() {
        let (mut a, mut b) = (vec![0u8; PAGE as usize], vec![0u8; PAGE as usize]);
        e.vram_read(va - BASE, &mut a).unwrap();
        e.vram_read(4 * MIB + i as u64 * PAGE, &mut b).unwrap();
        assert!(a == b, "gathered page {i}");
    }
    let dst: Vec<u64> = list.iter().map(|va| va - BASE - src + DST).collect();
    let db: Vec<u8> = dst.iter().flat_map(|v| v.to_le_bytes()).collect();
    e.vram_write(lpa, &db).unwrap();
    launch(
        &e,
        space,
        module,
        "vram_scatter",
        2,
        [BASE + lpa, n, BASE + 4 * MIB],
    );
    let (mut a, mut b) = (
        vec![0u8; (pages * PAGE) as usize],
        vec![0u8; (pages * PAGE) as usize],
    );
    e.vram_read(src, &mut a).unwrap();
    e.vram_read(DST - BASE, &mut b).unwrap();
    assert!(
        a == b,
        "scattered pages equal the sources, the other pages zero"
    );
}
