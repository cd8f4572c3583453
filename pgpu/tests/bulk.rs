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

fn engines() -> Vec<(&'static str, Box<dyn Engine>)> {
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
                assert!(p.iter().all(|&b| b == 0x5a) && p.len() as u64 % PAGE == 0);
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
