//! Fuzz harness of instance-block and page-table parsing (`instance`, `walk`, `translate`,
//! `plan`, `space`, `diff`), shared by the cargo-fuzz target `shadow` in `/fuzz` (feature
//! `fuzzing`) and by this crate's tests (docs/fuzzing.md).
//!
//! The input is a host configuration (VRAM size, partition, VA window, page sizes, RAM regions,
//! sysmem map) and arbitrary guest memory: an instance block and 8-byte words anywhere in guest
//! VRAM and RAM (PDEs, PTEs, junk). Checked: an accepted instance block obeys its rules; every
//! guest mapping of the walk is inside the window and inside guest VRAM or one RAM region; every
//! engine mapping is inside the VM's partition or a registered RAM entry and is exactly the
//! translation of a guest mapping (the isolation invariant); faults are bounded; and after
//! `ShadowSpace::sync` (twice, the guest rewriting its tables in between) every page of the
//! engine's window translates exactly as the installed mappings say.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::{Result, Unstructured};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{Engine, HostRegionId, MapTarget, Mapping, PageSize, Perm, VaWindow};

use crate::{
    Aperture, GpuLayout, GuestMem, GuestTarget, INSTANCE_BYTES, Instance, MemError, PAGE_2M,
    PAGE_4K, PageSizes, Partition, Pdb, Plan, RamRegion, ShadowSpace, SysmemEntry, SysmemMap, plan,
};

/// Engine VRAM; partitions are placed inside it.
const ENGINE_VRAM: u64 = 64 << 20;
/// The host region standing for guest RAM.
const HOST_REGION: u64 = PAGE_2M;

fn engine() -> &'static (SimEngine, HostRegionId) {
    static ENGINE: OnceLock<(SimEngine, HostRegionId)> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let cfg = SimConfig {
            vram_size: ENGINE_VRAM,
            workers: 1,
            ..SimConfig::default()
        };
        let e = SimEngine::new(cfg).expect("sim engine");
        let (region, _) = e.alloc_host_region(HOST_REGION).expect("host region");
        (e, region)
    })
}

/// Sparse guest memory: the 8-byte words the input wrote, zero elsewhere; reads outside guest
/// VRAM or a RAM region fail, as the device's do.
struct SparseMem {
    vram_size: u64,
    ram: Vec<RamRegion>,
    words: BTreeMap<(Aperture, u64), u64>,
}

impl SparseMem {
    fn fill(
        &self,
        aperture: Aperture,
        addr: u64,
        buf: &mut [u8],
    ) -> std::result::Result<(), MemError> {
        let len = buf.len() as u64;
        let end = addr.checked_add(len).ok_or(MemError::OutOfRange {
            aperture,
            addr,
            len,
        })?;
        buf.fill(0);
        for (&(_, a), v) in self
            .words
            .range((aperture, addr.saturating_sub(7))..(aperture, end))
        {
            for (i, b) in v.to_le_bytes().iter().enumerate() {
                let pos = a + i as u64;
                if (addr..end).contains(&pos) {
                    buf[(pos - addr) as usize] = *b;
                }
            }
        }
        Ok(())
    }
}

impl GuestMem for SparseMem {
    fn read_vram(&self, addr: u64, buf: &mut [u8]) -> std::result::Result<(), MemError> {
        let len = buf.len() as u64;
        if addr.checked_add(len).is_none_or(|e| e > self.vram_size) {
            return Err(MemError::OutOfRange {
                aperture: Aperture::Vram,
                addr,
                len,
            });
        }
        self.fill(Aperture::Vram, addr, buf)
    }

    fn read_ram(&self, gpa: u64, buf: &mut [u8]) -> std::result::Result<(), MemError> {
        let len = buf.len() as u64;
        let inside = self
            .ram
            .iter()
            .any(|r| r.gpa <= gpa && gpa.checked_add(len).is_some_and(|e| e <= r.gpa + r.len));
        if !inside {
            return Err(MemError::OutOfRange {
                aperture: Aperture::Sysmem,
                addr: gpa,
                len,
            });
        }
        self.fill(Aperture::Sysmem, gpa, buf)
    }
}

/// The host configuration of one input.
struct Setup {
    layout: GpuLayout,
    partition: Partition,
    sysmem: SysmemMap,
    engine_pages: Vec<PageSize>,
}

fn setup(u: &mut Unstructured) -> Result<Option<Setup>> {
    let vram_size = if u.ratio(1, 8)? {
        1 << 34
    } else {
        u.int_in_range(1..=4096u64)? * PAGE_4K
    };
    let pa_base = u.int_in_range(0..=16u64)? * PAGE_2M;
    let part_max = vram_size.min(ENGINE_VRAM - pa_base);
    let part_size = part_max - u.int_in_range(0..=2u64)?.min(part_max / PAGE_4K) * PAGE_4K;
    let base = *u.choose(&[
        0,
        PAGE_2M,
        1 << 32,
        (1 << 47) - (16 << 20),
        0u64.wrapping_sub(16 << 20),
    ])?;
    let va = VaWindow {
        base,
        size: u.int_in_range(1..=8u64)? * PAGE_2M,
    };
    let region = engine().1;
    let (mut ram, mut entries) = (Vec::new(), Vec::new());
    let mut gpa = 0u64;
    for _ in 0..u.int_in_range(0..=3)? {
        gpa += if u.ratio(1, 8)? {
            1 << 32
        } else {
            u.int_in_range(0..=1024u64)? * PAGE_4K
        };
        let len = u.int_in_range(1..=512u64)? * PAGE_4K;
        ram.push(RamRegion { gpa, len });
        // Backed wholly, a part of it, or not at all by the host region.
        let skip = u.int_in_range(0..=len / PAGE_4K - 1)? * PAGE_4K;
        match u.int_in_range(0..=3)? {
            0 => {}
            1 => entries.push(SysmemEntry {
                gpa: gpa + skip,
                len: len - skip,
                region,
                offset: u.int_in_range(0..=HOST_REGION / PAGE_4K)? * PAGE_4K,
            }),
            _ => entries.push(SysmemEntry {
                gpa,
                len,
                region,
                offset: u.int_in_range(0..=HOST_REGION / PAGE_4K)? * PAGE_4K,
            }),
        }
        gpa += len;
    }
    let layout = GpuLayout {
        vram_size,
        ram,
        va,
        page_sizes: PageSizes::from_bits(u.int_in_range(1..=3)?),
        sysmem: u.arbitrary()?,
        max_faults: u.int_in_range(0..=8)?,
    };
    let engine_pages = u
        .choose(&[
            &[PageSize::Size4K, PageSize::Size2M][..],
            &[PageSize::Size4K],
            &[PageSize::Size2M],
        ])?
        .to_vec();
    // Only valid host configurations: the host validates its own.
    let (Ok(()), Ok(partition), Ok(sysmem)) = (
        layout.validate(),
        Partition::new(pa_base, part_size),
        SysmemMap::new(entries),
    ) else {
        return Ok(None);
    };
    Ok(Some(Setup {
        layout,
        partition,
        sysmem,
        engine_pages,
    }))
}

/// A guest address: mostly a page of VRAM or of a RAM region, sometimes anything.
fn guest_page(u: &mut Unstructured, layout: &GpuLayout) -> Result<(Aperture, u64)> {
    let vram_pages = (layout.vram_size / PAGE_4K).min(1 << 16);
    Ok(match u.int_in_range(0..=5)? {
        0..=2 => (Aperture::Vram, u.int_in_range(0..=vram_pages)? * PAGE_4K),
        3 | 4 if !layout.ram.is_empty() => {
            let r = *u.choose(&layout.ram)?;
            (
                Aperture::Sysmem,
                r.gpa + u.int_in_range(0..=r.len / PAGE_4K)? * PAGE_4K,
            )
        }
        _ => (
            *u.choose(&[Aperture::Vram, Aperture::Sysmem])?,
            u.arbitrary::<u64>()? & !0xfff,
        ),
    })
}

/// A PDE / PTE: target, BIG, READ_ONLY and an address, sometimes with stray bits; or anything.
fn entry(u: &mut Unstructured, layout: &GpuLayout) -> Result<u64> {
    if u.ratio(1, 16)? {
        return u.arbitrary();
    }
    let (aperture, mut addr) = guest_page(u, layout)?;
    if u.ratio(1, 2)? {
        addr &= !(PAGE_2M - 1);
    }
    let mut v = addr | aperture.target_bits() | u.int_in_range(0..=3u64)? << 2;
    if u.ratio(1, 16)? {
        v |= u.arbitrary::<u64>()? & 0xfff;
    }
    Ok(v)
}

/// Writes up to 64 words (entries of page directories / tables, or junk) into guest memory.
fn write_words(u: &mut Unstructured, layout: &GpuLayout, mem: &mut SparseMem) -> Result<()> {
    for _ in 0..u.int_in_range(0..=64)? {
        let (aperture, page) = guest_page(u, layout)?;
        let index = u.int_in_range(0..=511u64)?;
        let count = u.int_in_range(1..=8u64)?;
        let value = entry(u, layout)?;
        // A run of entries mapping consecutive pages, as a driver writes them.
        let step = if value & 4 != 0 { PAGE_2M } else { PAGE_4K };
        for k in 0..count {
            let v = value.wrapping_add(k * step);
            mem.words
                .insert((aperture, page.wrapping_add((index + k) * 8)), v);
        }
    }
    Ok(())
}

/// Writes an instance block and reads it back; returns the page directory to walk.
fn instance(u: &mut Unstructured, layout: &GpuLayout, mem: &mut SparseMem) -> Result<Pdb> {
    let (_, addr) = guest_page(u, layout)?;
    let pd = entry(u, layout)?;
    let gpfifo = layout
        .va
        .base
        .wrapping_add(u.int_in_range(0..=layout.va.size / 8)? * 8);
    let entries: u64 = if u.ratio(1, 8)? {
        u.arbitrary()?
    } else {
        1 << u.int_in_range(0..=17)?
    };
    let ctx = if u.arbitrary()? {
        0
    } else {
        layout
            .va
            .base
            .wrapping_add(u.int_in_range(0..=layout.va.size)?)
    };
    let words = [pd, gpfifo, entries, ctx];
    for (i, w) in words.iter().enumerate() {
        mem.words
            .insert((Aperture::Vram, addr.wrapping_add(8 * i as u64)), *w);
    }
    let mut bytes = [0u8; INSTANCE_BYTES];
    for (i, w) in words.iter().enumerate() {
        bytes[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    if let Ok(inst) = Instance::read(mem, layout, addr) {
        assert_eq!(Instance::parse(layout, addr, &bytes), Ok(inst));
        assert!(Instance::check_addr(layout, addr).is_ok());
        let pd_ok = layout.check_range(inst.pdb.aperture, inst.pdb.addr, layout.pd_bytes());
        assert!(pd_ok.is_ok(), "accepted PD outside guest memory: {inst:?}");
        assert!(inst.pdb.addr.is_multiple_of(PAGE_4K));
        let n = inst.gpfifo_entries;
        assert!(n.is_power_of_two() && (2..=65536).contains(&n), "{inst:?}");
        assert!(inst.gpfifo_base.is_multiple_of(8));
        assert!(
            layout.va_contains(inst.gpfifo_base, u64::from(n) * 8),
            "{inst:?}"
        );
        assert!(inst.engine_ctx == 0 || layout.va_contains(inst.engine_ctx, 4096));
        assert!(inst.pdb.aperture == Aperture::Vram || layout.sysmem);
        return Ok(inst.pdb);
    }
    let (aperture, addr) = guest_page(u, layout)?;
    Ok(Pdb { aperture, addr })
}

/// The isolation invariant and the plan's other promises.
fn check_plan(s: &Setup, p: &Plan) {
    let layout = &s.layout;
    assert!(
        p.faults.len() <= layout.max_faults,
        "more faults kept than max_faults"
    );
    assert!(p.fault_count >= p.faults.len() as u64);
    assert!(
        p.watch.contains(p.pdb.aperture, p.pdb.addr),
        "PD not watched"
    );
    assert!(p.watch.len() as u64 <= layout.pd_bytes().div_ceil(PAGE_4K) + 1 + layout.pd_entries());
    for w in p.guest.windows(2) {
        assert!(
            w[0].va + w[0].len <= w[1].va,
            "guest mappings unsorted or overlapping"
        );
    }
    for g in &p.guest {
        assert!(g.len > 0 && g.len.is_multiple_of(PAGE_4K) && g.va.is_multiple_of(PAGE_4K));
        assert!(
            layout.va_contains(g.va, g.len),
            "guest mapping outside the window: {g:?}"
        );
        let t = g.target;
        assert!(
            layout.check_range(t.aperture(), t.addr(), g.len).is_ok(),
            "guest mapping outside guest memory: {g:?}"
        );
        assert!(t.aperture() == Aperture::Vram || layout.sysmem);
    }
    for w in p.mappings.windows(2) {
        assert!(
            w[0].va + w[0].len <= w[1].va,
            "engine mappings unsorted or overlapping"
        );
    }
    for m in &p.mappings {
        let page = m.page_size.bytes();
        assert!(
            s.engine_pages.contains(&m.page_size),
            "page size the engine lacks: {m:?}"
        );
        assert!(
            m.len > 0 && m.va.is_multiple_of(page) && m.len.is_multiple_of(page),
            "{m:?}"
        );
        let g = p
            .guest
            .iter()
            .find(|g| g.va <= m.va && m.va + m.len <= g.va + g.len)
            .unwrap_or_else(|| panic!("engine mapping {m:?} maps no guest mapping"));
        let gaddr = g.target.addr() + (m.va - g.va);
        let want = match g.target {
            GuestTarget::Vram(_) => MapTarget::Vram {
                pa: s
                    .partition
                    .to_phys(gaddr, m.len)
                    .unwrap_or_else(|| panic!("{m:?} outside the partition")),
            },
            GuestTarget::Sysmem(_) => {
                let (region, offset) = s
                    .sysmem
                    .lookup(gaddr, m.len)
                    .unwrap_or_else(|| panic!("{m:?} outside the registered RAM"));
                MapTarget::Host { region, offset }
            }
        };
        assert_eq!(
            m.target, want,
            "engine mapping is not its guest mapping's translation"
        );
        let perm = if g.read_only {
            Perm::ReadOnly
        } else {
            Perm::ReadWrite
        };
        assert_eq!(m.perm, perm);
        let taddr = match m.target {
            MapTarget::Vram { pa } => pa,
            MapTarget::Host { offset, .. } => offset,
        };
        assert!(taddr.is_multiple_of(page), "target misaligned: {m:?}");
    }
}

/// What `list` (sorted, non-overlapping) translates `va` to.
fn at(list: &[Mapping], va: u64) -> Option<(MapTarget, Perm, PageSize)> {
    let i = list.partition_point(|m| m.va + m.len <= va);
    let m = list.get(i).filter(|m| m.va <= va)?;
    let d = va - m.va;
    let target = match m.target {
        MapTarget::Vram { pa } => MapTarget::Vram { pa: pa + d },
        MapTarget::Host { region, offset } => MapTarget::Host {
            region,
            offset: offset + d,
        },
    };
    Some((target, m.perm, m.page_size))
}

/// Syncs `wanted` into `space` and checks the pages around every boundary of the wanted,
/// refused and installed mappings (first and last page, the pages just outside; a lookup of
/// every page of the window made the harness too slow to fuzz): installed = wanted less what
/// the engine refused, and the engine translates exactly as installed.
fn sync_and_check(space: &mut ShadowSpace, wanted: &[Mapping], window: VaWindow) {
    let (engine, _) = engine();
    let stats = space.sync(engine, wanted).expect("sync of a checked plan");
    let refused: Vec<Mapping> = stats.refused.iter().map(|(m, _)| *m).collect();
    let id = space.space().expect("live space");
    let mut probes: Vec<u64> = wanted
        .iter()
        .chain(&refused)
        .chain(space.installed())
        .flat_map(|m| {
            let end = m.va + m.len;
            [m.va.wrapping_sub(PAGE_4K), m.va, end - PAGE_4K, end]
        })
        .filter(|&va| window.base <= va && va - window.base < window.size)
        .collect();
    probes.extend([window.base, window.base + window.size - PAGE_4K]);
    probes.sort_unstable();
    probes.dedup();
    for va in probes {
        let want =
            at(wanted, va).filter(|_| !refused.iter().any(|r| r.va <= va && va < r.va + r.len));
        let installed = at(space.installed(), va);
        assert_eq!(installed, want, "installed differs from wanted at {va:#x}");
        let got = engine.lookup(id, va).expect("lookup");
        assert_eq!(
            got.map(|t| (t.target, t.perm, t.page_size)),
            installed,
            "engine translation of {va:#x} differs from the installed mappings"
        );
    }
}

/// Runs the harness on `data`.
pub fn run(data: &[u8]) {
    let _ = run_inner(&mut Unstructured::new(data));
}

fn run_inner(u: &mut Unstructured) -> Result<()> {
    let Some(s) = setup(u)? else { return Ok(()) };
    let mut mem = SparseMem {
        vram_size: s.layout.vram_size,
        ram: s.layout.ram.clone(),
        words: BTreeMap::new(),
    };
    write_words(u, &s.layout, &mut mem)?;
    let pdb = instance(u, &s.layout, &mut mem)?;
    let plan1 = || {
        plan(
            &mem,
            &s.layout,
            &s.partition,
            &s.sysmem,
            &s.engine_pages,
            pdb,
        )
    };
    let Ok(p1) = plan1() else { return Ok(()) };
    check_plan(&s, &p1);
    let (engine, _) = engine();
    let Ok(mut space) = ShadowSpace::create(engine, pdb, s.layout.va) else {
        return Ok(());
    };
    sync_and_check(&mut space, &p1.mappings, s.layout.va);
    // The guest rewrites some entries; the next sync applies only the difference.
    let r = write_words(u, &s.layout, &mut mem);
    if r.is_ok() {
        let p2 = plan(
            &mem,
            &s.layout,
            &s.partition,
            &s.sysmem,
            &s.engine_pages,
            pdb,
        )
        .expect("the page directory stayed valid");
        check_plan(&s, &p2);
        sync_and_check(&mut space, &p2.mappings, s.layout.va);
    }
    space.destroy(engine).expect("destroy");
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks themselves, on tables that map: 16 VRAM pages, a 2 MiB page, RAM pages
    /// (half of them without a host region behind them), then a rewrite.
    #[test]
    fn checks_pass_on_mapping_tables() {
        let region = engine().1;
        let layout = GpuLayout {
            vram_size: 8 << 20,
            ram: vec![RamRegion {
                gpa: 1 << 20,
                len: 64 << 10,
            }],
            va: VaWindow {
                base: PAGE_2M,
                size: 4 * PAGE_2M,
            },
            page_sizes: PageSizes::from_bits(3),
            sysmem: true,
            max_faults: 4,
        };
        let s = Setup {
            partition: Partition::new(4 * PAGE_2M, 8 << 20).unwrap(),
            sysmem: SysmemMap::new(vec![SysmemEntry {
                gpa: 1 << 20,
                len: 32 << 10,
                region,
                offset: 0,
            }])
            .unwrap(),
            engine_pages: vec![PageSize::Size4K, PageSize::Size2M],
            layout,
        };
        let mut mem = SparseMem {
            vram_size: s.layout.vram_size,
            ram: s.layout.ram.clone(),
            words: BTreeMap::new(),
        };
        let pdb = Pdb {
            aperture: Aperture::Vram,
            addr: 0x1000,
        };
        let mut put = |ap, a: u64, v: u64| mem.words.insert((ap, a), v);
        put(Aperture::Vram, 0x1000, 0x2000 | 1);
        put(Aperture::Vram, 0x1008, (2 * PAGE_2M) | 4 | 1);
        put(Aperture::Vram, 0x1010, 0x3000 | 1);
        for k in 0..16 {
            put(Aperture::Vram, 0x2000 + 8 * k, (0x10000 + k * PAGE_4K) | 1);
        }
        for k in 0..16 {
            put(
                Aperture::Vram,
                0x3000 + 8 * k,
                ((1 << 20) + k * PAGE_4K) | 2,
            );
        }
        let p = plan(
            &mem,
            &s.layout,
            &s.partition,
            &s.sysmem,
            &s.engine_pages,
            pdb,
        )
        .unwrap();
        check_plan(&s, &p);
        assert_eq!(p.guest.len(), 3);
        assert_eq!(p.mappings.len(), 3, "{:?}", p.mappings);
        assert_eq!(
            p.fault_count, 1,
            "8 RAM pages without a host region: one range"
        );
        let (engine, _) = engine();
        let mut space = ShadowSpace::create(engine, pdb, s.layout.va).unwrap();
        sync_and_check(&mut space, &p.mappings, s.layout.va);
        assert_eq!(space.installed_pages(), 16 + 1 + 8);
        mem.words.insert((Aperture::Vram, 0x2008), 0x40000 | 8 | 1);
        mem.words.remove(&(Aperture::Vram, 0x1008));
        let p = plan(
            &mem,
            &s.layout,
            &s.partition,
            &s.sysmem,
            &s.engine_pages,
            pdb,
        )
        .unwrap();
        check_plan(&s, &p);
        sync_and_check(&mut space, &p.mappings, s.layout.va);
        assert_eq!(space.installed_pages(), 16 + 8);
        space.destroy(engine).unwrap();
    }

    #[test]
    fn harness_runs_on_random_inputs() {
        let mut s = 0x51ad_0e11_u64;
        for _ in 0..300 {
            let mut next = || {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                s.wrapping_mul(0x2545_f491_4f6c_dd1d)
            };
            let len = (next() % 4096) as usize;
            let input: Vec<u8> = (0..len).map(|_| (next() >> 56) as u8).collect();
            run(&input);
        }
    }
}
