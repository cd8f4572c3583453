//! Tests of `ShadowSpace::sync` against the real sim engine: installed translations, diffs that
//! touch only changed pages, pages outside the partition, refused and failed engine calls.

mod common;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{
    Engine, EngineError, EngineInfo, HostRegionId, Job, LoadLimits, LoadedModule, MapTarget,
    Mapping, ModuleId, Outcome, PageSize, Perm, PreemptHandle, SavedContext, SpaceId, Translation,
    VaWindow,
};
use shadow::{
    Aperture::{Sysmem, Vram},
    FaultKind, Partition, Plan, Rule, ShadowError, ShadowSpace, SysmemEntry, SysmemMap,
    VecGuestMem, plan,
};

const PT: u64 = 0x20_0000;
const PT2: u64 = 0x20_1000;
/// Physical base of the VM's partition.
const BASE: u64 = 256 * MIB;

fn engine() -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 512 * MIB,
        workers: 1,
        ..SimConfig::default()
    })
    .unwrap()
}

fn window() -> VaWindow {
    layout().va
}

fn partition() -> Partition {
    Partition::new(BASE, VRAM).unwrap()
}

fn plan_of(e: &dyn Engine, m: &VecGuestMem, p: &Partition, s: &SysmemMap) -> Plan {
    plan(m, &layout(), p, s, &e.info().page_sizes, pdb()).unwrap()
}

/// Guest tables: PDE 0 → PT: PTEs 0..5 contiguous VRAM from 4 MiB (PTE 5 read-only);
/// PDE 1 → big read-only page at 6 MiB; PDE 2 → PT2: PTE 0 beyond VRAM.
fn tables() -> VecGuestMem {
    let mut m = mem();
    set_pde(&mut m, 0, pde_pt(Vram, PT));
    for j in 0..6 {
        set_pte(&mut m, Vram, PT, j, pte(Vram, 4 * MIB + j * 4096, j == 5));
    }
    set_pde(&mut m, 1, pde_big(Vram, 6 * MIB, true));
    set_pde(&mut m, 2, pde_pt(Vram, PT2));
    set_pte(&mut m, Vram, PT2, 0, pte(Vram, VRAM, false));
    m
}

fn look(e: &dyn Engine, s: &ShadowSpace, va: u64) -> Option<Translation> {
    e.lookup(s.space().unwrap(), va).unwrap()
}

fn vram_at(pa: u64, perm: Perm, page_size: PageSize) -> Option<Translation> {
    Some(Translation {
        target: MapTarget::Vram { pa },
        perm,
        page_size,
    })
}

#[test]
fn sync_installs_the_shadow() {
    let e = engine();
    let m = tables();
    let p = plan_of(&e, &m, &partition(), &SysmemMap::default());
    assert_eq!(p.fault_count, 1);
    assert_eq!(
        (p.faults[0].kind, p.faults[0].addr),
        (FaultKind::PteVramRange, va(2, 0))
    );
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    let st = s.sync(&e, &p.mappings).unwrap();
    assert_eq!((st.mapped_pages, st.unmapped_pages), (7, 0));
    assert_eq!(st.mapped_bytes, 6 * 4096 + 2 * MIB);
    assert_eq!(st.map_calls, 1);
    assert!(!st.full_rebuild);
    let rw = Perm::ReadWrite;
    let ro = Perm::ReadOnly;
    assert_eq!(
        look(&e, &s, va(0, 0)),
        vram_at(BASE + 4 * MIB, rw, PageSize::Size4K)
    );
    assert_eq!(
        look(&e, &s, va(0, 4) + 5),
        vram_at(BASE + 4 * MIB + 0x4005, rw, PageSize::Size4K)
    );
    assert_eq!(
        look(&e, &s, va(0, 5)),
        vram_at(BASE + 4 * MIB + 0x5000, ro, PageSize::Size4K)
    );
    assert_eq!(look(&e, &s, va(0, 6)), None);
    assert_eq!(
        look(&e, &s, va(1, 0) + 123),
        vram_at(BASE + 6 * MIB + 123, ro, PageSize::Size2M)
    );
    assert_eq!(look(&e, &s, va(2, 0)), None);
    // Data really lands in the partition.
    e.copy_to_space(s.space().unwrap(), va(0, 1) + 8, b"shadowed")
        .unwrap();
    let mut b = [0u8; 8];
    e.vram_read(BASE + 4 * MIB + 0x1008, &mut b).unwrap();
    assert_eq!(&b, b"shadowed");
    assert_eq!(s.installed_pages(), 7);
    let c = s.counters();
    assert_eq!((c.syncs, c.rebuilds, c.pages_shadowed), (1, 1, 7));
    s.destroy(&e).unwrap();
}

#[test]
fn second_sync_touches_only_changed_pages() {
    let e = engine();
    let mut m = tables();
    let part = partition();
    let none = SysmemMap::default();
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();

    // Unchanged tables: nothing to do.
    let st = s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();
    assert_eq!(
        (
            st.mapped_pages,
            st.unmapped_pages,
            st.unmap_calls,
            st.map_calls
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(s.counters().rebuilds, 1);

    // One PTE in the middle of a run now points elsewhere.
    set_pte(&mut m, Vram, PT, 2, pte(Vram, 9 * MIB, false));
    let st = s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();
    assert_eq!(
        (st.mapped_pages, st.unmapped_pages, st.unmap_calls),
        (1, 1, 1)
    );
    let rw = Perm::ReadWrite;
    assert_eq!(
        look(&e, &s, va(0, 2)),
        vram_at(BASE + 9 * MIB, rw, PageSize::Size4K)
    );
    assert_eq!(
        look(&e, &s, va(0, 1)),
        vram_at(BASE + 4 * MIB + 0x1000, rw, PageSize::Size4K)
    );
    assert_eq!(
        look(&e, &s, va(0, 3)),
        vram_at(BASE + 4 * MIB + 0x3000, rw, PageSize::Size4K)
    );

    // Only the permission changes.
    set_pte(&mut m, Vram, PT, 3, pte(Vram, 4 * MIB + 0x3000, true));
    let st = s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();
    assert_eq!((st.mapped_pages, st.unmapped_pages), (1, 1));
    assert_eq!(look(&e, &s, va(0, 3)).unwrap().perm, Perm::ReadOnly);

    // A PTE goes away; another appears.
    set_pte(&mut m, Vram, PT, 4, 0);
    set_pte(&mut m, Vram, PT, 100, pte(Vram, 0x1000, false));
    let st = s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();
    assert_eq!((st.mapped_pages, st.unmapped_pages), (1, 1));
    assert_eq!(look(&e, &s, va(0, 4)), None);
    assert_eq!(
        look(&e, &s, va(0, 100)),
        vram_at(BASE + 0x1000, rw, PageSize::Size4K)
    );
    let c = s.counters();
    assert_eq!(
        (c.syncs, c.rebuilds, c.pages_shadowed, c.pages_unshadowed),
        (5, 4, 10, 3)
    );
    assert_eq!(s.installed_pages(), 7);
    s.destroy(&e).unwrap();
}

#[test]
fn big_page_replaced_by_a_table() {
    let e = engine();
    let mut m = tables();
    let part = partition();
    let none = SysmemMap::default();
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();
    set_pde(&mut m, 1, pde_pt(Vram, PT2 + 0x1000));
    set_pte(&mut m, Vram, PT2 + 0x1000, 0, pte(Vram, 6 * MIB, false));
    set_pte(
        &mut m,
        Vram,
        PT2 + 0x1000,
        1,
        pte(Vram, 6 * MIB + 4096, false),
    );
    let st = s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();
    assert_eq!((st.mapped_pages, st.unmapped_pages), (2, 1));
    assert_eq!(st.unmapped_bytes, 2 * MIB);
    assert_eq!(
        look(&e, &s, va(1, 1)),
        vram_at(BASE + 6 * MIB + 4096, Perm::ReadWrite, PageSize::Size4K)
    );
    assert_eq!(look(&e, &s, va(1, 2)), None);
    // And back.
    set_pde(&mut m, 1, pde_big(Vram, 6 * MIB, true));
    let st = s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();
    assert_eq!((st.mapped_pages, st.unmapped_pages), (1, 2));
    assert_eq!(look(&e, &s, va(1, 2)).unwrap().page_size, PageSize::Size2M);
    s.destroy(&e).unwrap();
}

#[test]
fn pages_outside_the_partition_are_never_mapped() {
    let e = engine();
    let mut m = tables();
    // The host gave this VM only 32 MiB although the guest was told 64.
    let small = Partition::new(BASE, 32 * MIB).unwrap();
    set_pte(&mut m, Vram, PT, 50, pte(Vram, 40 * MIB, false));
    set_pte(&mut m, Vram, PT, 51, pte(Vram, 32 * MIB - 4096, false));
    let p = plan_of(&e, &m, &small, &SysmemMap::default());
    let got: Vec<_> = p.faults.iter().map(|f| (f.kind, f.rule, f.addr)).collect();
    assert_eq!(
        got,
        [
            (FaultKind::PteVramRange, Rule::PartitionRange, va(0, 50)),
            (FaultKind::PteVramRange, Rule::VramRange, va(2, 0)),
        ]
    );
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    s.sync(&e, &p.mappings).unwrap();
    assert_eq!(look(&e, &s, va(0, 50)), None);
    assert_eq!(look(&e, &s, va(2, 0)), None);
    assert!(look(&e, &s, va(0, 51)).is_some());
    for x in s.installed() {
        let MapTarget::Vram { pa } = x.target else {
            panic!("{x:?}")
        };
        assert!(pa >= BASE && pa + x.len <= BASE + 32 * MIB, "{x:?}");
    }
    s.destroy(&e).unwrap();
}

/// Guest RAM backing: a 4 KiB aligned host buffer.
struct HostBuf {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl HostBuf {
    fn new(len: usize) -> Self {
        let mut buf = vec![0u8; len + 4096];
        let off = buf.as_mut_ptr().align_offset(4096);
        Self { buf, off, len }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.buf[self.off..].as_mut_ptr()
    }
    fn read(&self, at: usize, n: usize) -> &[u8] {
        &self.buf[self.off + at..self.off + at + n]
    }
}

#[test]
fn system_memory_pages_map_onto_host_regions() {
    let e = engine();
    let mut host = HostBuf::new(4 * MIB as usize);
    // SAFETY: `host` stays alive and unmoved (its Vec is not resized) until the region is
    // unregistered at the end of the test.
    let region = unsafe { e.register_host_region(host.ptr(), host.len) }.unwrap();
    // Guest RAM [32, 35) MiB is the host buffer from byte 1 MiB on.
    let map = SysmemMap::new(vec![SysmemEntry {
        gpa: 32 * MIB,
        len: 3 * MIB,
        region,
        offset: MIB,
    }])
    .unwrap();
    let mut m = mem();
    set_pde(&mut m, 0, pde_pt(Vram, PT));
    set_pte(&mut m, Vram, PT, 0, pte(Sysmem, 32 * MIB + 0x3000, false));
    set_pte(&mut m, Vram, PT, 1, pte(Sysmem, 0x1000, false)); // RAM, but no host memory here
    let p = plan_of(&e, &m, &partition(), &map);
    assert_eq!(p.fault_count, 1);
    assert_eq!(p.faults[0].rule, Rule::SysmemUnbacked);
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    s.sync(&e, &p.mappings).unwrap();
    assert_eq!(
        look(&e, &s, va(0, 0)).unwrap().target,
        MapTarget::Host {
            region,
            offset: MIB + 0x3000
        }
    );
    assert_eq!(look(&e, &s, va(0, 1)), None);
    e.copy_to_space(s.space().unwrap(), va(0, 0) + 16, b"ram")
        .unwrap();
    assert_eq!(host.read((MIB + 0x3010) as usize, 3), b"ram");
    s.destroy(&e).unwrap();
    e.unregister_host_region(region).unwrap();
}

#[test]
fn refused_mappings_are_left_out() {
    let e = engine();
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    let ok = Mapping {
        va: VA,
        len: 8 * KIB,
        target: MapTarget::Vram { pa: BASE },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size4K,
    };
    let unknown = Mapping {
        va: VA + MIB,
        target: MapTarget::Host {
            region: HostRegionId(999),
            offset: 0,
        },
        ..ok
    };
    let st = s.sync(&e, &[unknown, ok]).unwrap();
    assert_eq!(st.refused.len(), 1);
    assert_eq!(st.refused[0].0, unknown);
    assert_eq!(st.mapped_pages, 2);
    assert_eq!(s.installed(), [ok]);
    assert!(look(&e, &s, VA + 4096).is_some());
    assert_eq!(look(&e, &s, VA + MIB), None);
    // The next sync tries the refused one again (it is still not installed).
    let st = s.sync(&e, &[ok, unknown]).unwrap();
    assert_eq!((st.refused.len(), st.mapped_pages), (1, 0));
    s.destroy(&e).unwrap();
}

#[test]
fn bad_wanted_mappings_change_nothing() {
    let e = engine();
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    let a = Mapping {
        va: VA,
        len: 8 * KIB,
        target: MapTarget::Vram { pa: BASE },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size4K,
    };
    s.sync(&e, &[a]).unwrap();
    let overlap = Mapping { va: VA + 4096, ..a };
    assert!(matches!(s.sync(&e, &[a, overlap]), Err(ShadowError::Overlap(v)) if v == VA + 4096));
    for bad in [
        Mapping { va: VA - 4096, ..a },
        Mapping {
            va: VA + VA_SIZE - 4096,
            ..a
        },
        Mapping { len: 0, ..a },
        Mapping { va: VA + 1, ..a },
        Mapping {
            page_size: PageSize::Size2M,
            ..a
        },
        Mapping {
            target: MapTarget::Vram { pa: BASE + 1 },
            ..a
        },
        Mapping { va: !0xfffu64, ..a },
    ] {
        assert!(
            matches!(s.sync(&e, &[bad]), Err(ShadowError::BadMapping { .. })),
            "{bad:?}"
        );
    }
    assert_eq!(s.installed(), [a]);
    assert!(look(&e, &s, VA).is_some());
    s.destroy(&e).unwrap();
}

#[test]
fn destroy_frees_the_space() {
    let e = engine();
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    assert_eq!(s.key(), pdb());
    assert_eq!(s.window(), window());
    let id: SpaceId = s.space().unwrap();
    s.destroy(&e).unwrap();
    assert_eq!(s.space(), None);
    assert!(matches!(
        e.lookup(id, VA),
        Err(EngineError::UnknownSpace(_))
    ));
    assert!(matches!(s.sync(&e, &[]), Err(ShadowError::Destroyed)));
    s.destroy(&e).unwrap();
    // A window the engine refuses.
    let bad = VaWindow {
        base: VA + 4096,
        size: VA_SIZE,
    };
    assert!(matches!(
        ShadowSpace::create(&e, pdb(), bad),
        Err(ShadowError::Engine(_))
    ));
}

/// The sim engine, with switches that make the next `unmap` or `map_batch` fail.
struct Flaky {
    inner: SimEngine,
    fail_unmap: AtomicBool,
    fail_batch: AtomicBool,
}

impl Engine for Flaky {
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
        // SAFETY: the caller's guarantees are passed on unchanged.
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
        if self.fail_batch.swap(false, Ordering::Relaxed) {
            return Err(EngineError::SpaceBusy(space));
        }
        self.inner.map_batch(space, mappings)
    }
    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError> {
        if self.fail_unmap.swap(false, Ordering::Relaxed) {
            return Err(EngineError::SpaceBusy(space));
        }
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

#[test]
fn failed_engine_calls_lead_to_a_full_rebuild() {
    let e = Flaky {
        inner: engine(),
        fail_unmap: AtomicBool::new(false),
        fail_batch: AtomicBool::new(false),
    };
    let mut m = tables();
    let part = partition();
    let none = SysmemMap::default();
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    s.sync(&e, &plan_of(&e, &m, &part, &none).mappings).unwrap();

    set_pte(&mut m, Vram, PT, 0, pte(Vram, 12 * MIB, false));
    let wanted = plan_of(&e, &m, &part, &none).mappings;
    e.fail_unmap.store(true, Ordering::Relaxed);
    let err = s.sync(&e, &wanted).unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert!(!ShadowError::Destroyed.is_busy());
    let st = s.sync(&e, &wanted).unwrap();
    assert!(st.full_rebuild);
    assert_eq!(st.mapped_pages, 7);
    assert_eq!(
        look(&e, &s, va(0, 0)),
        vram_at(BASE + 12 * MIB, Perm::ReadWrite, PageSize::Size4K)
    );

    // A refused batch: nothing of it is installed; the next sync rebuilds.
    set_pte(&mut m, Vram, PT, 0, pte(Vram, 13 * MIB, false));
    let wanted = plan_of(&e, &m, &part, &none).mappings;
    e.fail_batch.store(true, Ordering::Relaxed);
    assert!(s.sync(&e, &wanted).is_err());
    assert_eq!(look(&e, &s, va(0, 0)), None);
    let st = s.sync(&e, &wanted).unwrap();
    assert!(st.full_rebuild);
    assert_eq!(
        look(&e, &s, va(0, 0)),
        vram_at(BASE + 13 * MIB, Perm::ReadWrite, PageSize::Size4K)
    );
    assert_eq!(look(&e, &s, va(1, 0)).unwrap().page_size, PageSize::Size2M);
    s.destroy(&e).unwrap();
}

#[test]
fn engine_with_2m_pages_only() {
    // What a cuda engine offers: 2 MiB pages only; the guest is told PAGE_SIZES = 2 MiB.
    let e = SimEngine::new(SimConfig {
        vram_size: 512 * MIB,
        workers: 1,
        page_sizes: vec![PageSize::Size2M],
        ..SimConfig::default()
    })
    .unwrap();
    let mut l = layout();
    l.page_sizes = shadow::PageSizes::of_engine(&e.info().page_sizes);
    let mut m = mem();
    set_pde(&mut m, 0, pde_big(Vram, 2 * MIB, false));
    set_pde(&mut m, 1, pde_big(Vram, 4 * MIB, false));
    set_pde(&mut m, 2, pde_pt(Vram, PT));
    set_pte(&mut m, Vram, PT, 0, pte(Vram, 0, false));
    let p = plan(
        &m,
        &l,
        &partition(),
        &SysmemMap::default(),
        &e.info().page_sizes,
        pdb(),
    )
    .unwrap();
    assert_eq!(p.fault_count, 1);
    assert_eq!(
        (p.faults[0].kind, p.faults[0].rule, p.faults[0].addr),
        (FaultKind::BadEntry, Rule::PageSizeUnsupported, va(2, 0))
    );
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    let st = s.sync(&e, &p.mappings).unwrap();
    assert_eq!(st.mapped_pages, 2);
    assert_eq!(
        look(&e, &s, va(1, 7)),
        vram_at(BASE + 4 * MIB + 0x7000, Perm::ReadWrite, PageSize::Size2M)
    );
    assert_eq!(look(&e, &s, va(2, 0)), None);
    s.destroy(&e).unwrap();
}

#[test]
fn plan_faults_are_sorted_and_capped() {
    let e = engine();
    let mut l = layout();
    l.max_faults = 3;
    let mut m = mem();
    set_pde(&mut m, 0, pde_pt(Vram, PT));
    // Walk faults at PTEs 1 and 3, translation faults (outside a small partition) at 0 and 2.
    for j in 0..4 {
        let e = if j % 2 == 1 {
            3
        } else {
            pte(Vram, 40 * MIB, false)
        };
        set_pte(&mut m, Vram, PT, j, e);
    }
    let small = Partition::new(BASE, 32 * MIB).unwrap();
    let p = plan(
        &m,
        &l,
        &small,
        &SysmemMap::default(),
        &e.info().page_sizes,
        pdb(),
    )
    .unwrap();
    assert_eq!(p.fault_count, 4);
    let got: Vec<_> = p.faults.iter().map(|f| (f.addr, f.kind.code())).collect();
    assert_eq!(got, [(va(0, 0), 3), (va(0, 1), 5), (va(0, 2), 3)]);
    assert!(p.mappings.is_empty());
    assert_eq!(p.guest.len(), 2);
    assert_eq!(p.pdb, pdb());
    assert_eq!(p.watch.len(), 2);
}

#[test]
fn full_4g_window() {
    // 2048 PDEs, each with its own page table mapping the same 2 MiB of VRAM: 1M PTEs.
    let e = engine();
    let mut l = layout();
    l.va.size = 4 << 30;
    let mut m = mem();
    let tables = 0x100_0000;
    for i in 0..2048 {
        let pt = tables + i * 4096;
        m.write_u64(Vram, PD + i * 8, pde_pt(Vram, pt)).unwrap();
        let mut bytes = vec![0u8; 4096];
        for j in 0..512u64 {
            let e = pte(Vram, j * 4096, false).to_le_bytes();
            bytes[j as usize * 8..j as usize * 8 + 8].copy_from_slice(&e);
        }
        m.write(Vram, pt, &bytes).unwrap();
    }
    let pages = e.info().page_sizes.clone();
    let none = SysmemMap::default();
    let p = plan(&m, &l, &partition(), &none, &pages, pdb()).unwrap();
    assert_eq!(p.fault_count, 0);
    assert_eq!(p.guest.len(), 2048);
    assert_eq!(p.watch.len(), 4 + 2048);
    let mut s = ShadowSpace::create(&e, pdb(), l.va).unwrap();
    let st = s.sync(&e, &p.mappings).unwrap();
    assert_eq!((st.mapped_pages, st.mapped_bytes), (2048, 4 << 30));
    // One PTE changes: its 2 MiB page becomes 511 + 1 small pages, nothing else moves.
    let i = 1000;
    m.write_u64(Vram, tables + i * 4096 + 7 * 8, pte(Vram, 8 * MIB, false))
        .unwrap();
    let p = plan(&m, &l, &partition(), &none, &pages, pdb()).unwrap();
    let st = s.sync(&e, &p.mappings).unwrap();
    assert_eq!(
        (st.unmapped_pages, st.mapped_pages, st.unmap_calls),
        (1, 512, 1)
    );
    assert_eq!(
        look(&e, &s, va(i, 7)),
        vram_at(BASE + 8 * MIB, Perm::ReadWrite, PageSize::Size4K)
    );
    assert_eq!(
        look(&e, &s, va(i + 1, 7)).unwrap().page_size,
        PageSize::Size2M
    );
    s.destroy(&e).unwrap();
}

#[test]
fn host_bytes_follow_the_installed_mappings() {
    use shadow::host_bytes_of;
    let w = VaWindow {
        base: 0,
        size: 4 << 30,
    };
    let small = |va: u64| Mapping {
        va,
        len: 4096,
        target: MapTarget::Vram { pa: 0 },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size4K,
    };
    let empty = host_bytes_of(w, &[]);
    let one = host_bytes_of(w, &[small(0)]);
    let entry = std::mem::size_of::<Mapping>() as u64;
    // The first 4 KiB page: its entry, a directory and a leaf table.
    assert_eq!(one - empty, entry + (8 << 10) + (4 << 10));
    // A second page in the same 2 MiB region costs only its entry; one in another region of
    // the same GiB a leaf table more; one in another GiB a directory more.
    assert_eq!(host_bytes_of(w, &[small(0), small(4096)]) - one, entry);
    assert_eq!(
        host_bytes_of(w, &[small(0), small(2 << 20)]) - one,
        entry + (4 << 10)
    );
    assert_eq!(
        host_bytes_of(w, &[small(0), small(1 << 30)]) - one,
        entry + (8 << 10) + (4 << 10)
    );
    // A 2 MiB page needs no leaf table.
    let big = Mapping {
        len: 2 << 20,
        page_size: PageSize::Size2M,
        ..small(2 << 20)
    };
    assert_eq!(host_bytes_of(w, &[small(0), big]) - one, entry);

    // A synced space is charged for what it installed.
    let e = engine();
    let m = tables();
    let p = plan_of(&e, &m, &partition(), &SysmemMap::default());
    let mut s = ShadowSpace::create(&e, pdb(), window()).unwrap();
    assert_eq!(s.host_bytes(), host_bytes_of(window(), &[]));
    s.sync(&e, &p.mappings).unwrap();
    assert_eq!(s.host_bytes(), host_bytes_of(window(), s.installed()));
    assert!(s.host_bytes() > host_bytes_of(window(), &[]));
    s.destroy(&e).unwrap();
}
