//! The sim engine's dirty log (`Engine::dirty_log_*`, issue 17): on every suite workload the
//! pages harvested while it ran (preempted at random points, harvested between runs) include
//! every VRAM page whose bytes changed, and nothing outside the workload's buffers; 2 MiB pages
//! are logged per 4 KiB page; copies, fills, host writes and guest-RAM (host region) stores are
//! logged; rounds of copies racing a running kernel end with an exact copy of VRAM; and the
//! write sets the PTX analysis gives each launch (`ptx::Module::write_set`) contain every page
//! the log saw it write.

mod common;

use common::runner::{check, place, run};
use common::*;
use pgpu::dirty::{self, DirtyLogKind, PAGE};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

const VRAM: u64 = 64 * MIB;

fn harvest(e: &SimEngine, pa: u64, len: u64) -> Vec<u64> {
    let mut b = vec![0u64; dirty::words(len)];
    e.dirty_log_harvest(MapTarget::Vram { pa }, len, &mut b)
        .unwrap();
    b
}

fn vram(e: &SimEngine) -> Vec<u8> {
    let mut v = vec![0u8; VRAM as usize];
    e.vram_read(0, &mut v).unwrap();
    v
}

#[test]
fn every_workload_writes_only_pages_the_log_reports() {
    let mut rng = Rng(0xd1e7);
    let mut failures = Vec::new();
    for w in suite::all() {
        let inst = w.instance(suite::Size::Small);
        let e = SimEngine::new(SimConfig {
            vram_size: VRAM,
            workers: 2,
            ..SimConfig::default()
        })
        .unwrap();
        let p = place(&e, &inst, 0);
        let placed: u64 = inst
            .buffers
            .iter()
            .map(|b| (b.init.len().max(1) as u64).next_multiple_of(4096))
            .sum();
        let before = vram(&e);
        assert_eq!(e.dirty_log_start().unwrap(), DirtyLogKind::Exact);
        // Harvest between preempted runs too: pages the run keeps in its TLB must come back.
        let mut seen = vec![0u64; dirty::words(VRAM)];
        let approx = (inst.approx_thread_instrs / 32).max(16);
        let mut steps = 0;
        let result = run(&e, &p, &inst, || {
            steps += 1;
            for (s, h) in seen.iter_mut().zip(harvest(&e, 0, VRAM)) {
                *s |= h;
            }
            (steps < 6).then(|| 1 + rng.below(approx / 4 + 1))
        });
        let outs = match result {
            Ok((outs, _)) => outs,
            Err(err) => {
                failures.push(format!("{}: {err}", w.name));
                continue;
            }
        };
        for (s, h) in seen.iter_mut().zip(harvest(&e, 0, VRAM)) {
            *s |= h;
        }
        e.dirty_log_stop();
        if let Err(err) = check(&inst, &outs) {
            failures.push(format!("{}: {err}", w.name));
            continue;
        }
        let after = vram(&e);
        let changed: Vec<u64> = (0..VRAM / PAGE)
            .filter(|&p| {
                let r = (p * PAGE) as usize..((p + 1) * PAGE) as usize;
                before[r.clone()] != after[r]
            })
            .collect();
        if let Some(p) = changed.iter().find(|&&p| !dirty::is_set(&seen, p)) {
            failures.push(format!("{}: page {p:#x} changed, not logged", w.name));
        }
        if let Some(p) = (placed / PAGE..VRAM / PAGE).find(|&p| dirty::is_set(&seen, p)) {
            failures.push(format!(
                "{}: page {p:#x} logged outside the buffers",
                w.name
            ));
        }
        if changed.is_empty() {
            failures.push(format!("{}: wrote nothing", w.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn large_pages_copies_fills_and_host_regions_are_logged_per_page() {
    let e = engine();
    let s = space(&e);
    e.map(
        s,
        &Mapping {
            va: BASE,
            len: 2 * MIB,
            target: MapTarget::Vram { pa: 2 * MIB },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let host = HostBuf::new(2 * MIB as usize);
    // SAFETY: the buffer lives until the end of the test, after the region is unregistered.
    let region = unsafe { e.register_host_region(host.ptr(), 2 * MIB as usize) }.unwrap();
    e.map(
        s,
        &Mapping {
            va: BASE + 2 * MIB,
            len: 64 * 1024,
            target: MapTarget::Host { region, offset: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size4K,
        },
    )
    .unwrap();
    // Nothing is logged before the start.
    e.copy_to_space(s, BASE, &[1; 8]).unwrap();
    e.dirty_log_start().unwrap();
    assert_eq!(harvest(&e, 0, VRAM), vec![0; dirty::words(VRAM)]);
    // A host copy into the large page: its 4 KiB page only (page 512 + 3 of VRAM).
    e.copy_to_space(s, BASE + 3 * 4096 + 100, &[7; 8]).unwrap();
    let h = harvest(&e, 2 * MIB, 2 * MIB);
    assert_eq!(dirty::count(&h), 1);
    assert!(dirty::is_set(&h, 3));
    // A copy job: source in VRAM, destination in the host region (pages 1 and 2 of it).
    let job = Job::Copy(CopyJob {
        space: s,
        src: BASE,
        dst: BASE + 2 * MIB + 4096 + 4000,
        len: 200,
    });
    let out = e.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let mut hb = vec![0u64; 1];
    e.dirty_log_harvest(MapTarget::Host { region, offset: 0 }, 64 * PAGE, &mut hb)
        .unwrap();
    assert_eq!(hb, vec![0b110]);
    assert_eq!(
        dirty::count(&harvest(&e, 0, VRAM)),
        0,
        "a copy's source is clean"
    );
    // The hypervisor's own writes and fills.
    e.vram_write(5 * PAGE + 4090, &[1; 10]).unwrap();
    e.vram_fill(9 * PAGE, 2 * PAGE, 0).unwrap();
    let h = harvest(&e, 0, 16 * PAGE);
    assert_eq!(h, vec![(1 << 5) | (1 << 6) | (1 << 9) | (1 << 10)]);
    // Hostile requests: misaligned, short bitmap, outside the target.
    let mut b = vec![0u64; 1];
    assert!(
        e.dirty_log_harvest(MapTarget::Vram { pa: 1 }, PAGE, &mut b)
            .is_err()
    );
    assert!(
        e.dirty_log_harvest(MapTarget::Vram { pa: 0 }, 65 * PAGE, &mut b)
            .is_err()
    );
    assert!(
        e.dirty_log_harvest(MapTarget::Vram { pa: VRAM - PAGE }, 2 * PAGE, &mut b)
            .is_err()
    );
    e.dirty_log_stop();
    // Off: every page.
    assert_eq!(harvest(&e, 0, 64 * PAGE), vec![u64::MAX]);
    e.unmap(s, BASE + 2 * MIB, 64 * 1024).unwrap();
    e.unregister_host_region(region).unwrap();
}

/// The VRAM pages of the run of mapped, writable pages from `va` on in `space` (a buffer: the
/// runner leaves an unmapped page after each): the extent a write-set parameter may reach.
fn extent(e: &SimEngine, space: SpaceId, va: u64, out: &mut [u64]) {
    let mut page = va & !(PAGE - 1);
    while let Ok(Some(t)) = e.lookup(space, page) {
        let MapTarget::Vram { pa } = t.target else {
            break;
        };
        if t.perm != Perm::ReadWrite {
            break;
        }
        let p = pa / PAGE;
        out[(p / 64) as usize] |= 1 << (p % 64);
        page += PAGE;
    }
}

/// The write sets the PTX analysis gives (`ptx::Module::write_set`: the parameters stored
/// through, each reaching its buffer) contain every page the sim engine's exact log saw each
/// launch write, on every suite workload; and most workloads are bounded (not "everything").
#[test]
fn analysed_write_sets_contain_every_page_written() {
    let mut failures = Vec::new();
    let (mut bounded, mut launches) = (0, 0);
    for w in suite::all() {
        let inst = w.instance(suite::Size::Small);
        let e = SimEngine::new(SimConfig {
            vram_size: VRAM,
            workers: 2,
            ..SimConfig::default()
        })
        .unwrap();
        let p = place(&e, &inst, 0);
        let module = ptx::parse(inst.ptx).unwrap();
        e.dirty_log_start().unwrap();
        let h = PreemptHandle::new();
        for l in &inst.launches {
            launches += 1;
            let params = suite::layout_params(&l.params, &p.addrs).unwrap();
            let ws = module.write_set(l.entry).unwrap();
            let mut allowed = vec![0u64; dirty::words(VRAM)];
            if ws.unbounded {
                dirty::set_all(&mut allowed, VRAM);
            } else {
                bounded += 1;
                for &off in &ws.params {
                    let o = off as usize;
                    let ptr = u64::from_le_bytes(params[o..o + 8].try_into().unwrap());
                    extent(&e, p.space, ptr, &mut allowed);
                }
            }
            let job = Job::Launch(LaunchJob {
                space: p.space,
                module: p.module,
                entry: l.entry.to_string(),
                grid: l.grid,
                block: l.block,
                dynamic_shared: l.shared_bytes,
                params,
            });
            let out = e.execute(&job, &h).unwrap();
            assert!(
                matches!(out, Outcome::Completed { .. }),
                "{}: {out:?}",
                w.name
            );
            let written = harvest(&e, 0, VRAM);
            if let Some(p) = (0..VRAM / PAGE)
                .find(|&p| dirty::is_set(&written, p) && !dirty::is_set(&allowed, p))
            {
                failures.push(format!(
                    "{} {}: page {p:#x} written outside the analysed write set {ws:?}",
                    w.name, l.entry
                ));
            }
        }
        e.dirty_log_stop();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The analysis is of use: it bounds nearly every launch of the suite.
    assert!(
        bounded * 10 >= launches * 9,
        "{bounded} of {launches} bounded"
    );
}

/// Pre-copy against a running kernel: a copy of VRAM taken before it, refreshed after every
/// harvest with the pages the harvest names (read while the kernel runs on), and once more after
/// a harvest at the end, equals VRAM, though the kernel's stores after a harvest went through
/// its TLB (pages it translated stay reported, and are dirty again when it ends).
#[test]
fn rounds_racing_a_run_end_with_an_exact_copy() {
    let mut failures = Vec::new();
    for name in ["lcg", "matmul", "stencil", "histogram", "vecadd"] {
        let inst = if name == "lcg" {
            lcg_instance()
        } else {
            suite::find(name).unwrap().instance(suite::Size::Medium)
        };
        let e = std::sync::Arc::new(
            SimEngine::new(SimConfig {
                vram_size: VRAM,
                workers: 2,
                ..SimConfig::default()
            })
            .unwrap(),
        );
        let p = place(&e, &inst, 0);
        let mut copy = vram(&e);
        e.dirty_log_start().unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runner = {
            let (e, done) = (e.clone(), done.clone());
            let (space, module, addrs) = (p.space, p.module, p.addrs.clone());
            let inst = inst.clone();
            std::thread::spawn(move || {
                let p = common::runner::Placed {
                    space,
                    module,
                    addrs,
                };
                let r = run(&e, &p, &inst, || None).map(|_| ());
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                r
            })
        };
        let round = |copy: &mut Vec<u8>| {
            let h = harvest(&e, 0, VRAM);
            for (first, n) in dirty::runs(&h, VRAM / PAGE, 256) {
                let r = (first * PAGE) as usize..((first + n) * PAGE) as usize;
                e.vram_read(first * PAGE, &mut copy[r]).unwrap();
            }
        };
        let mut rounds = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            round(&mut copy);
            rounds += 1;
        }
        if let Err(err) = runner.join().unwrap() {
            failures.push(format!("{name}: {err}"));
            continue;
        }
        round(&mut copy);
        let now = vram(&e);
        if let Some(pg) = (0..VRAM / PAGE).find(|&pg| {
            let r = (pg * PAGE) as usize..((pg + 1) * PAGE) as usize;
            copy[r.clone()] != now[r]
        }) {
            failures.push(format!(
                "{name}: page {pg:#x} of the copy is stale ({rounds} rounds)"
            ));
        }
        if name == "lcg" && rounds < 2 {
            failures.push(format!("{name}: only {rounds} rounds while it ran"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `lcg_spin` (the fairness guest's kernel): 16 warps each spinning, then storing its 32
/// outputs into one shared page at its own moment, so that the page stays in a worker's TLB
/// while harvests pass.
fn lcg_instance() -> suite::Instance {
    let mut inst = suite::find("vecadd").unwrap().instance(suite::Size::Small);
    let n = 512u32;
    inst.ptx = suite::lcg::PTX;
    inst.buffers.truncate(1);
    inst.buffers[0].init = vec![0; n as usize * 4];
    inst.launches = vec![suite::Launch::linear(
        suite::lcg::ENTRY,
        n / 64,
        64,
        vec![
            suite::Param::Buffer(0),
            suite::Param::U32(200_000),
            suite::Param::U32(7),
        ],
    )];
    inst
}
