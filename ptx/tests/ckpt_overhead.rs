//! Steady-state cost of the checkpoint transformation: every suite kernel transformed and
//! never preempted computes the original's bytes and executes a bounded number of extra
//! instructions (interpreter `Stats`). Run with `--nocapture` for the table.

mod ckpt_support;

use ckpt_support::{check, run_ckpt, run_plain};
use ptx::ckpt::{Options, transform};

#[test]
fn never_preempted_kernels_match_and_overhead_is_bounded() {
    eprintln!(
        "{:<12} {:>6} {:>12} {:>12} {:>8} {:>7} {:>6}",
        "kernel", "class", "orig", "ckpt", "extra%", "points", "record"
    );
    let mut long = Vec::new();
    for w in suite::all()
        .filter(|w| w.name != "spin")
        .chain(suite::long::all())
    {
        let inst = w.instance(suite::Size::Small);
        let (orig, so) = run_plain(&inst, w.ptx, 1);
        let t = transform(w.ptx, &Options::default()).expect("transforms");
        let r = run_ckpt(&inst, &t, 1, None, 0).expect("runs");
        check(&inst, &r.outs).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        assert_eq!(r.outs, orig, "{}", w.name);
        assert_eq!(r.relaunches, 0, "{}: relaunched without a flag", w.name);
        let (a, b) = (so.thread_instructions, r.stats.thread_instructions);
        let plan = t.entry(w.entry).expect("plan");
        eprintln!(
            "{:<12} {:>6} {:>12} {:>12} {:>7.1}% {:>7} {:>6}",
            w.name,
            format!("{:?}", plan.class),
            a,
            b,
            (b as f64 / a as f64 - 1.0) * 100.0,
            plan.points.len(),
            plan.record_bytes
        );
        assert!(b > a, "{}: the polls must cost something", w.name);
        // Loose bound: prologue + completion (about 12 per thread) and 3-4 per point crossed
        // (at most one per `max_gap` = 64 instructions, or per barrier).
        let threads: u64 = inst.launches.iter().map(|l| l.threads()).sum();
        assert!(
            b <= a + a / 8 + 16 * threads,
            "{}: {b} instructions vs {a} original",
            w.name
        );
        if w.name.starts_with("long_") {
            // Long loops: the strip-mined ones (Thread kernels) poll once per chunk of about
            // 512 instructions; a Cta loop counts its first barrier down every iteration.
            let limit = if plan.class == ptx::ckpt::Class::Cta {
                1.30
            } else {
                1.05
            };
            let extra = b as f64 / a as f64;
            if w.name != "long_many" {
                assert!(extra <= limit, "{}: {extra:.3}x the original", w.name);
            }
            long.push(extra);
        }
    }
    // long_many runs 50 iterations per thread at this size: the prologue shows.
    let geo = (long.iter().map(|x: &f64| x.ln()).sum::<f64>() / long.len() as f64).exp();
    eprintln!("long kernels: geomean {geo:.3}x the original's instructions");
    assert!(geo <= 1.10, "geomean {geo:.3}");
}
