//! The incremental save: a thread preempted again after a resume stores only the registers
//! redefined since (or not restored at) its resume point. Same seeded preemption schedule
//! with the scheme on and off: same correct bytes, fewer register bytes stored with it on.

mod ckpt_support;

use ckpt_support::{Rng, check, run_ckpt, run_plain};
use ptx::ckpt::{Options, PointKind, transform};

#[test]
fn loop_points_resaved_after_a_resume_store_fewer_bytes() {
    for (name, gap) in [("graph", 64), ("matmul", 64), ("reduction", 64)] {
        let w = suite::find(name).expect("workload");
        let on = transform(
            w.ptx,
            &Options {
                max_gap: gap,
                ..Options::default()
            },
        )
        .expect("transforms");
        let plan = on.entry(w.entry).expect("plan");
        let best = plan
            .points
            .iter()
            .map(|p| (p.live_bytes, plan.incremental_bytes(p.id, p.id)))
            .filter(|(full, inc)| inc < full)
            .count();
        assert!(best > 0, "{name}: no point saves fewer bytes on a re-save");
        assert!(
            plan.points.iter().any(|p| p.kind != PointKind::Gap),
            "{name}: no loop or barrier point"
        );
    }
}

#[test]
fn incremental_run_matches_and_stores_less() {
    let w = suite::find("graph").expect("graph workload");
    let inst = w.instance(suite::Size::Small);
    let (orig, _) = run_plain(&inst, w.ptx, 1);
    let mut results = Vec::new();
    for incremental in [true, false] {
        let t = transform(
            w.ptx,
            &Options {
                incremental,
                poll_interval: 1,
                ..Options::default()
            },
        )
        .expect("transforms");
        let mut rng = Rng(0xabc);
        let r = run_ckpt(&inst, &t, 1, Some(&mut rng), 6).expect("runs");
        check(&inst, &r.outs).expect("correct");
        assert_eq!(r.outs, orig);
        eprintln!(
            "graph incremental={incremental}: {} saves, {} bytes (full would be {}), {} thread-instructions",
            r.saved_threads, r.incremental_bytes, r.full_bytes, r.stats.thread_instructions
        );
        results.push(r);
    }
    let (on, off) = (&results[0], &results[1]);
    assert_eq!(on.saved_threads, off.saved_threads, "same schedule");
    assert!(on.relaunches > 1, "some thread must be preempted twice");
    assert_eq!(off.incremental_bytes, off.full_bytes);
    assert!(
        on.incremental_bytes < off.incremental_bytes,
        "{} vs {}",
        on.incremental_bytes,
        off.incremental_bytes
    );
}

/// Every suite kernel, gap 8, the same seeded schedule: register bytes the saves stored with
/// the incremental scheme never exceed what full saves would store (table with
/// `--nocapture`).
#[test]
fn bytes_full_vs_incremental_for_every_suite_kernel() {
    eprintln!(
        "{:<12} {:>6} {:>7} {:>10} {:>10} {:>10}",
        "kernel", "points", "saves", "full B", "incr B", "self-resave"
    );
    let mut any_less = false;
    for w in suite::all().filter(|w| w.name != "spin") {
        let inst = w.instance(suite::Size::Small);
        let t = transform(
            w.ptx,
            &Options {
                max_gap: 8,
                poll_interval: 1,
                ..Options::default()
            },
        )
        .expect("transforms");
        let plan = t.entry(w.entry).expect("plan");
        let mut rng = Rng(0x77);
        let r = run_ckpt(&inst, &t, 1, Some(&mut rng), 6).expect("runs");
        check(&inst, &r.outs).expect("correct");
        assert!(r.incremental_bytes <= r.full_bytes, "{}", w.name);
        any_less |= r.incremental_bytes < r.full_bytes;
        let selfs: Vec<String> = plan
            .points
            .iter()
            .map(|p| format!("{}/{}", plan.incremental_bytes(p.id, p.id), p.live_bytes))
            .collect();
        eprintln!(
            "{:<12} {:>6} {:>7} {:>10} {:>10}  {}",
            w.name,
            plan.points.len(),
            r.saved_threads,
            r.full_bytes,
            r.incremental_bytes,
            selfs.join(" ")
        );
    }
    assert!(any_less, "the incremental scheme never saved a byte");
}
