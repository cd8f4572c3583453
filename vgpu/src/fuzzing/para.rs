//! Fuzz harness of the para-virtual interface: arbitrary sequences of hypercalls (argument
//! area, operation, header, entries) against a BAR3 front end on the sim engine. Checked after
//! every call: STATUS matches the result the call wrote, a refused call changes nothing, the
//! selected space's runs are sorted, merged, inside the VA window and equal a page-level model
//! of the accepted calls, at most `MAX_SPACES` spaces, VRAM_ALLOC blocks aligned, inside VRAM and
//! disjoint. At the end, every engine translation of every space equals the model: only pages
//! the guest mapped, onto the VM's partition or its registered RAM (the isolation invariant).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::{Result, Unstructured};
use mmio::pci::MsiMessage;
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{Engine, HostRegionId, MapTarget, Perm, VaWindow};
use shadow::{
    Aperture, GpuLayout, GuestMapping, GuestTarget, PAGE_2M, PAGE_4K, PageSizes, Partition, Pdb,
    RamRegion, SysmemEntry, SysmemMap,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::para::*;
use crate::para_bar::Para;
use crate::state::{IrqSink, Shared};

/// Engine VRAM; partitions are placed inside it.
const ENGINE_VRAM: u64 = 64 << 20;
/// Guest RAM: two regions (the second one only partly backed by the host region).
const RAM: [(u64, u64); 2] = [(0, 256 << 10), (16 << 20, 128 << 10)];
/// Most hypercalls per input.
const MAX_CALLS: usize = 32;

struct NoIrq;

impl IrqSink for NoIrq {
    fn msi(&self, _: MsiMessage) {}
    fn intx(&self, _: bool) {}
}

/// One sim engine per process, with one 2 MiB host region standing for guest RAM.
fn engine() -> &'static (Arc<SimEngine>, HostRegionId) {
    static ENGINE: OnceLock<(Arc<SimEngine>, HostRegionId)> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let cfg = SimConfig {
            vram_size: ENGINE_VRAM,
            workers: 1,
            ..SimConfig::default()
        };
        let e = Arc::new(SimEngine::new(cfg).expect("sim engine"));
        let (region, _) = e.alloc_host_region(PAGE_2M).expect("host region");
        (e, region)
    })
}

/// What a page of the model maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Page {
    target: GuestTarget,
    read_only: bool,
}

/// Page-level model of the accepted calls.
#[derive(Default)]
struct Model {
    spaces: BTreeMap<Pdb, BTreeMap<u64, Page>>,
    current: Option<Pdb>,
    blocks: BTreeMap<u64, u64>,
}

fn pages_of(runs: &[GuestMapping]) -> BTreeMap<u64, Page> {
    let mut out = BTreeMap::new();
    for r in runs {
        for k in 0..r.len / PAGE_4K {
            let target = r.target.offset(k * PAGE_4K).expect("run target wraps");
            let read_only = r.read_only;
            out.insert(r.va + k * PAGE_4K, Page { target, read_only });
        }
    }
    out
}

/// The host configuration of one input.
struct Setup {
    layout: GpuLayout,
    partition: Partition,
    sysmem: SysmemMap,
}

fn setup(u: &mut Unstructured) -> Result<Setup> {
    let vram_size = u.int_in_range(1..=2048u64)? * PAGE_4K;
    let pa_base = u.int_in_range(0..=16u64)? * PAGE_2M;
    let part_size = vram_size - u.int_in_range(0..=2u64)?.min(vram_size / PAGE_4K - 1) * PAGE_4K;
    let base = *u.choose(&[0, PAGE_2M, 1 << 32, (1 << 47) - (16 << 20)])?;
    let va = VaWindow {
        base,
        size: u.int_in_range(1..=8u64)? * PAGE_2M,
    };
    let region = engine().1;
    let mut entries = vec![SysmemEntry {
        gpa: RAM[0].0,
        len: RAM[0].1,
        region,
        offset: *u.choose(&[0, PAGE_2M / 2])?,
    }];
    if u.arbitrary()? {
        entries.push(SysmemEntry {
            gpa: RAM[1].0,
            len: RAM[1].1 / 2,
            region,
            offset: PAGE_2M - RAM[1].1 / 2,
        });
    }
    let layout = GpuLayout {
        vram_size,
        ram: RAM
            .iter()
            .map(|&(gpa, len)| RamRegion { gpa, len })
            .collect(),
        va,
        page_sizes: PageSizes::from_bits(u.int_in_range(1..=3)?),
        sysmem: u.arbitrary()?,
        max_faults: 16,
    };
    layout.validate().expect("harness layout");
    Ok(Setup {
        layout,
        partition: Partition::new(pa_base, part_size).expect("harness partition"),
        sysmem: SysmemMap::new(entries).expect("harness sysmem map"),
    })
}

/// A guest address: mostly inside VRAM or RAM, sometimes just outside or anything.
fn guest_addr(u: &mut Unstructured, layout: &GpuLayout) -> Result<u64> {
    Ok(match u.int_in_range(0..=4)? {
        0 => u.int_in_range(0..=layout.vram_size / PAGE_4K)? * PAGE_4K,
        1 => u.int_in_range(0..=RAM[0].1 / PAGE_4K)? * PAGE_4K,
        2 => RAM[1].0 + u.int_in_range(0..=RAM[1].1 / PAGE_4K)? * PAGE_4K,
        3 => u.int_in_range(0..=8u64)? * PAGE_2M,
        _ => u.arbitrary::<u64>()? & !0xfff,
    })
}

/// An entry value: target, BIG, READ_ONLY and an address, sometimes with stray bits.
fn entry_bits(u: &mut Unstructured, layout: &GpuLayout) -> Result<u64> {
    let mut v = guest_addr(u, layout)? | u.int_in_range(0..=15u64)?;
    if u.ratio(1, 16)? {
        v |= u.arbitrary::<u64>()? & 0xfff;
    }
    Ok(v)
}

/// Writes one call's argument area (where it is RAM) and returns its operation.
fn write_call(
    u: &mut Unstructured,
    ram: &GuestMemoryMmap,
    layout: &GpuLayout,
    args: u64,
    model: &Model,
) -> Result<u32> {
    let op = if u.ratio(1, 32)? {
        u.arbitrary::<u32>()?
    } else {
        u.int_in_range(OP_SET_PD..=OP_VRAM_FREE + 1)?
    };
    let arg = match op & 0xff {
        OP_SET_PD => entry_bits(u, layout)?,
        OP_VRAM_ALLOC if u.ratio(7, 8)? => u.int_in_range(1..=layout.vram_size)?,
        OP_VRAM_FREE if !model.blocks.is_empty() && u.ratio(3, 4)? => {
            let keys: Vec<u64> = model.blocks.keys().copied().collect();
            *u.choose(&keys)?
        }
        _ => u.arbitrary()?,
    };
    let count: u32 = match op & 0xff {
        OP_VRAM_ALLOC if u.ratio(3, 4)? => u.int_in_range(12..=24)?,
        _ if u.ratio(1, 32)? => u.arbitrary()?,
        _ => u.int_in_range(0..=16)?,
    };
    let n = u.int_in_range(0..=count.min(24))?;
    let mut bytes = Vec::with_capacity(n as usize * ENTRY_BYTES);
    for _ in 0..n {
        let window_pages = layout.va.size / PAGE_4K;
        let va = match u.int_in_range(0..=7)? {
            0 => u.arbitrary()?,
            1 => layout.va.base + u.int_in_range(0..=window_pages / 512)? * PAGE_2M,
            _ => layout.va.base + u.int_in_range(0..=window_pages)? * PAGE_4K,
        };
        let pte = entry_bits(u, layout)?;
        let pages: u32 = if u.ratio(1, 16)? {
            u.arbitrary()?
        } else {
            u.int_in_range(0..=8)?
        };
        let reserved: u32 = if u.ratio(1, 32)? { u.arbitrary()? } else { 0 };
        bytes.extend_from_slice(&va.to_le_bytes());
        bytes.extend_from_slice(&pte.to_le_bytes());
        bytes.extend_from_slice(&pages.to_le_bytes());
        bytes.extend_from_slice(&reserved.to_le_bytes());
    }
    // Outside RAM these writes fail, as a guest's would: the call must then be refused.
    let _ = ram.write_slice(&arg.to_le_bytes(), GuestAddress(args.wrapping_add(OFF_ARG)));
    let _ = ram.write_slice(
        &count.to_le_bytes(),
        GuestAddress(args.wrapping_add(OFF_COUNT)),
    );
    let _ = ram.write_slice(&bytes, GuestAddress(args.wrapping_add(OFF_ENTRIES)));
    Ok(op)
}

/// The decoded entries of the argument area, as the model reads them (raw; only accepted calls
/// are applied, so validation is the device's).
fn model_ops(ram: &GuestMemoryMmap, args: u64, op: u32) -> Vec<(u64, u64, Option<Page>)> {
    let mut header = [0u8; 16];
    if ram.read_slice(&mut header, GuestAddress(args)).is_err() {
        return Vec::new();
    }
    let count = match op {
        OP_MAP => 1,
        OP_MAP_BATCH | OP_UNMAP_BATCH => u32_at(&header, OFF_COUNT as usize).min(MAX_BATCH),
        _ => return Vec::new(),
    };
    let mut bytes = vec![0u8; count as usize * ENTRY_BYTES];
    if ram
        .read_slice(&mut bytes, GuestAddress(args + OFF_ENTRIES))
        .is_err()
    {
        return Vec::new();
    }
    bytes
        .chunks_exact(ENTRY_BYTES)
        .map(|e| {
            let (va, pte, pages) = (u64_at(e, 0), u64_at(e, 8), u64::from(u32_at(e, 16)));
            let page = if pte & 4 != 0 { PAGE_2M } else { PAGE_4K };
            let target = Aperture::from_target(pte).map(|a| Page {
                target: GuestTarget::new(a, pte & !0xfff),
                read_only: pte & 8 != 0,
            });
            (
                va,
                pages * page,
                if op == OP_UNMAP_BATCH { None } else { target },
            )
        })
        .collect()
}

/// Runs the harness on `data`.
pub fn run(data: &[u8]) {
    let _ = run_inner(&mut Unstructured::new(data));
}

fn run_inner(u: &mut Unstructured) -> Result<()> {
    let Setup {
        layout,
        partition,
        sysmem,
    } = setup(u)?;
    let (engine, _) = engine();
    let ram = GuestMemoryMmap::<()>::from_ranges(
        &RAM.iter()
            .map(|&(gpa, len)| (GuestAddress(gpa), len as usize))
            .collect::<Vec<_>>(),
    )
    .expect("guest RAM");
    let spaces = Arc::new(Mutex::new(ParaSpaces::new(
        engine.clone() as Arc<dyn Engine>,
        layout.clone(),
        partition,
        sysmem.clone(),
    )));
    let shared = Arc::new(Shared::new(4, Arc::new(NoIrq)));
    let mut para = Para::new(spaces.clone(), ram.clone(), shared);
    let mut model = Model::default();
    let mut args = 0u64;
    let mut calls = 0;
    while !u.is_empty() && calls < MAX_CALLS {
        args = match u.int_in_range(0..=7)? {
            0 => 0,
            1 => 0x1000,
            2 => RAM[1].0,
            3 => 0x1008,
            4 => RAM[0].1 - 0x8000,
            5 => u.arbitrary()?,
            _ => args,
        };
        para.write(u64::from(ARGS_LO), args as u32);
        para.write(u64::from(ARGS_HI), (args >> 32) as u32);
        let op = write_call(u, &ram, &layout, args, &model)?;
        let before = lock(&spaces).runs().to_vec();
        para.write(u64::from(CALL), op);
        calls += 1;
        check_call(
            &para,
            &spaces,
            &ram,
            &layout,
            args,
            op & 0xff,
            &before,
            &mut model,
        );
    }
    assert_eq!(lock(&spaces).counters.hypercalls, calls as u64);
    check_engine(&spaces, &layout, &partition, &sysmem, &model);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn check_call(
    para: &Para,
    spaces: &SharedSpaces,
    ram: &GuestMemoryMmap,
    layout: &GpuLayout,
    args: u64,
    op: u32,
    before: &[GuestMapping],
    model: &mut Model,
) {
    let area_ok = args != 0
        && args.is_multiple_of(PAGE_4K)
        && layout
            .check_range(Aperture::Sysmem, args, ARGS_BYTES)
            .is_ok();
    let status = para.read(u64::from(STATUS)) & 0xff;
    if !area_ok {
        assert_eq!(status, ST_BAD_CALL, "call without a valid argument area");
        assert_eq!(lock(spaces).runs(), before, "refused call changed the runs");
        return;
    }
    let mut result = [0u8; 24];
    ram.read_slice(&mut result, GuestAddress(args + OFF_RESULT))
        .expect("result area");
    assert_eq!(
        u32_at(&result, 0),
        status,
        "STATUS and the result area differ"
    );
    let ok = status == ST_OK;
    match op {
        OP_SET_PD if ok => {
            let mut header = [0u8; 8];
            ram.read_slice(&mut header, GuestAddress(args))
                .expect("header");
            let raw = u64::from_le_bytes(header);
            let pdb = Pdb {
                aperture: Aperture::from_target(raw).expect("accepted PDB target"),
                addr: raw & !0xfff,
            };
            assert!(
                layout
                    .check_range(pdb.aperture, pdb.addr, layout.pd_bytes())
                    .is_ok(),
                "accepted page directory {pdb:?} outside guest memory"
            );
            model.spaces.entry(pdb).or_default();
            assert!(
                model.spaces.len() <= MAX_SPACES,
                "more than MAX_SPACES spaces"
            );
            model.current = Some(pdb);
        }
        OP_MAP | OP_MAP_BATCH | OP_UNMAP_BATCH if ok => {
            let pdb = model.current.expect("a map call succeeded without SET_PD");
            let pages = model.spaces.get_mut(&pdb).expect("current space");
            for (va, len, target) in model_ops(ram, args, op) {
                for k in 0..len / PAGE_4K {
                    let pva = va + k * PAGE_4K;
                    match target {
                        Some(p) => {
                            let t = p.target.offset(k * PAGE_4K).expect("target wraps");
                            pages.insert(pva, Page { target: t, ..p });
                        }
                        None => {
                            pages.remove(&pva);
                        }
                    }
                }
            }
        }
        OP_VRAM_ALLOC if ok => {
            let mut header = [0u8; 16];
            ram.read_slice(&mut header, GuestAddress(args))
                .expect("header");
            let len = u64_at(&header, 0).next_multiple_of(PAGE_4K);
            let align = match u32_at(&header, 8) {
                0 => 12,
                n => n,
            };
            let addr = u64_at(&result, 16);
            assert!(addr.is_multiple_of(1 << align), "VRAM block misaligned");
            assert!(addr + len <= layout.vram_size, "VRAM block outside VRAM");
            let overlaps = model
                .blocks
                .iter()
                .any(|(&a, &l)| a < addr + len && addr < a + l);
            assert!(
                !overlaps,
                "VRAM block {addr:#x}+{len:#x} overlaps a live one"
            );
            model.blocks.insert(addr, len);
        }
        OP_VRAM_FREE => {
            let mut header = [0u8; 8];
            ram.read_slice(&mut header, GuestAddress(args))
                .expect("header");
            let live = model.blocks.remove(&u64::from_le_bytes(header)).is_some();
            assert_eq!(ok, live, "VRAM_FREE result disagrees with the live blocks");
        }
        _ => {}
    }
    let s = lock(spaces);
    let runs = s.runs();
    if !ok {
        assert_eq!(runs, before, "refused call changed the runs");
    }
    assert!(runs.len() <= MAX_RUNS);
    for w in runs.windows(2) {
        assert!(
            w[0].va + w[0].len <= w[1].va,
            "runs unsorted or overlapping"
        );
        let merged = w[0].va + w[0].len == w[1].va
            && w[0].read_only == w[1].read_only
            && w[0].target.offset(w[0].len) == Some(w[1].target);
        assert!(!merged, "contiguous runs not merged: {:?}", w);
    }
    for r in runs {
        assert!(r.len > 0 && r.len.is_multiple_of(PAGE_4K), "bad run {r:?}");
        assert!(
            layout.va_contains(r.va, r.len),
            "run outside the window: {r:?}"
        );
        let t = r.target;
        assert!(
            layout.check_range(t.aperture(), t.addr(), r.len).is_ok(),
            "run outside guest memory: {r:?}"
        );
    }
    let want = model
        .current
        .and_then(|p| model.spaces.get(&p))
        .cloned()
        .unwrap_or_default();
    assert_eq!(pages_of(runs), want, "runs differ from the model");
}

/// Every page of every window translates as the model says, onto the partition or the
/// registered RAM.
fn check_engine(
    spaces: &SharedSpaces,
    layout: &GpuLayout,
    partition: &Partition,
    sysmem: &SysmemMap,
    model: &Model,
) {
    let (engine, _) = engine();
    let s = lock(spaces);
    let seen: HashSet<_> = model
        .spaces
        .keys()
        .filter_map(|p| s.space_for(*p))
        .collect();
    assert_eq!(
        seen.len(),
        model.spaces.len(),
        "a set page directory has no space"
    );
    for (pdb, pages) in &model.spaces {
        let space = s.space_for(*pdb).expect("space");
        for k in 0..layout.va.size / PAGE_4K {
            let va = layout.va.base + k * PAGE_4K;
            let got = engine.lookup(space, va).expect("lookup");
            let want = pages.get(&va).map(|p| {
                let target = match p.target {
                    GuestTarget::Vram(a) => MapTarget::Vram {
                        pa: partition
                            .to_phys(a, PAGE_4K)
                            .expect("page outside the partition"),
                    },
                    GuestTarget::Sysmem(a) => {
                        let (region, offset) = sysmem
                            .lookup(a, PAGE_4K)
                            .expect("RAM page without host region");
                        MapTarget::Host { region, offset }
                    }
                };
                let perm = if p.read_only {
                    Perm::ReadOnly
                } else {
                    Perm::ReadWrite
                };
                (target, perm)
            });
            assert_eq!(
                got.map(|t| (t.target, t.perm)),
                want,
                "engine translation of {va:#x} in {pdb:?} differs from the model"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks themselves, on calls that succeed: SET_PD, a batch mapping VRAM, a 2 MiB
    /// page and RAM, an unmap cutting a run, VRAM_ALLOC and VRAM_FREE.
    #[test]
    fn checks_pass_on_accepted_calls() {
        let (engine, region) = engine();
        let layout = GpuLayout {
            vram_size: 8 << 20,
            ram: RAM
                .iter()
                .map(|&(gpa, len)| RamRegion { gpa, len })
                .collect(),
            va: VaWindow {
                base: PAGE_2M,
                size: 4 * PAGE_2M,
            },
            page_sizes: PageSizes::from_bits(3),
            sysmem: true,
            max_faults: 16,
        };
        let partition = Partition::new(4 * PAGE_2M, 8 << 20).unwrap();
        let sysmem = SysmemMap::new(vec![SysmemEntry {
            gpa: 0,
            len: RAM[0].1,
            region: *region,
            offset: 0,
        }])
        .unwrap();
        let ram = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), RAM[0].1 as usize),
            (GuestAddress(RAM[1].0), RAM[1].1 as usize),
        ])
        .unwrap();
        let spaces = Arc::new(Mutex::new(ParaSpaces::new(
            engine.clone() as Arc<dyn Engine>,
            layout.clone(),
            partition,
            sysmem.clone(),
        )));
        let mut para = Para::new(
            spaces.clone(),
            ram.clone(),
            Arc::new(Shared::new(4, Arc::new(NoIrq))),
        );
        let mut model = Model::default();
        let args = 0x1000;
        para.write(u64::from(ARGS_LO), args as u32);
        let mut call =
            |model: &mut Model, op: u32, arg: u64, count: u32, entries: &[(u64, u64, u32)]| {
                let mut b = Vec::new();
                for &(va, pte, pages) in entries {
                    b.extend_from_slice(&va.to_le_bytes());
                    b.extend_from_slice(&pte.to_le_bytes());
                    b.extend_from_slice(&pages.to_le_bytes());
                    b.extend_from_slice(&0u32.to_le_bytes());
                }
                ram.write_slice(&arg.to_le_bytes(), GuestAddress(args))
                    .unwrap();
                ram.write_slice(&count.to_le_bytes(), GuestAddress(args + OFF_COUNT))
                    .unwrap();
                ram.write_slice(&b, GuestAddress(args + OFF_ENTRIES))
                    .unwrap();
                let before = lock(&spaces).runs().to_vec();
                para.write(u64::from(CALL), op);
                check_call(&para, &spaces, &ram, &layout, args, op, &before, model);
                para.read(u64::from(STATUS)) & 0xff
            };
        assert_eq!(call(&mut model, OP_SET_PD, 0x1000 | 1, 0, &[]), ST_OK);
        let map = [
            (PAGE_2M, 0x10000 | 1, 16),
            (2 * PAGE_2M, PAGE_2M | 4 | 1, 1),
            (3 * PAGE_2M, 0x20000 | 8 | 2, 4),
        ];
        assert_eq!(call(&mut model, OP_MAP_BATCH, 0, 3, &map), ST_OK);
        assert_eq!(
            call(
                &mut model,
                OP_UNMAP_BATCH,
                0,
                1,
                &[(PAGE_2M + 0x4000, 0, 2)]
            ),
            ST_OK
        );
        assert_eq!(lock(&spaces).runs().len(), 4);
        assert_eq!(
            call(&mut model, OP_MAP, 0, 0, &[(PAGE_2M, 0x3000 | 3, 1)]),
            ST_ENTRY_FAULT
        );
        assert_eq!(call(&mut model, OP_VRAM_ALLOC, 8192, 16, &[]), ST_OK);
        let block = *model.blocks.keys().next().unwrap();
        assert_eq!(call(&mut model, OP_VRAM_FREE, block, 0, &[]), ST_OK);
        assert_eq!(call(&mut model, OP_VRAM_FREE, block, 0, &[]), ST_BAD_CALL);
        check_engine(&spaces, &layout, &partition, &sysmem, &model);
        assert_eq!(model.spaces.values().next().unwrap().len(), 14 + 512 + 4);
    }

    #[test]
    fn harness_runs_on_random_inputs() {
        for input in super::super::random_inputs(0x5eed_0a7a, 300, 2048) {
            run(&input);
        }
    }
}
