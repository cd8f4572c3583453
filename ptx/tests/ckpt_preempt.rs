//! Preemptible kernels (`ptx::ckpt::transform`) on the interpreter: every suite kernel,
//! stopped at random (seeded) instructions with the flag raised, saved, relaunched and
//! resumed until done, computes bytes identical to the untransformed kernel, with one and
//! two workers, shared memory and barriers in flight included.

mod ckpt_support;

use ckpt_support::{Rng, check, run_ckpt, run_plain};
use ptx::ckpt::{Options, transform};

fn preempt_all(workers: usize, seed: u64, trials: u64, max_gap: u32, poll_interval: u32) {
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    let mut saved = 0;
    let opts = Options {
        max_gap,
        poll_interval,
        ..Options::default()
    };
    for w in suite::all()
        .filter(|w| w.name != "spin")
        .chain(suite::long::all())
    {
        let inst = w.instance(suite::Size::Small);
        let (orig, _) = run_plain(&inst, w.ptx, 1);
        let t = transform(w.ptx, &opts).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        for trial in 0..trials {
            match run_ckpt(&inst, &t, workers, Some(&mut rng), 1 + trial) {
                Ok(r) => {
                    saved += r.saved_threads;
                    eprintln!(
                        "{} trial {trial}: flags {} relaunches {} saved {}",
                        w.name, r.flags_raised, r.relaunches, r.saved_threads
                    );
                    if let Err(e) = check(&inst, &r.outs) {
                        failures.push(format!("{} trial {trial}: {e}", w.name));
                    } else if r.outs != orig {
                        failures.push(format!("{} trial {trial}: bytes differ", w.name));
                    }
                }
                Err(e) => failures.push(format!("{} trial {trial}: {e}", w.name)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(saved > 0, "no thread was ever saved at a point");
}

#[test]
fn suite_preempted_and_resumed_one_worker() {
    preempt_all(1, 0x5eed_0001, 4, 8, 1);
}

#[test]
fn suite_preempted_and_resumed_two_workers() {
    preempt_all(2, 0x5eed_0002, 3, 8, 2);
}

#[test]
fn suite_preempted_and_resumed_counted_polls() {
    preempt_all(1, 0x5eed_0004, 3, 4, 3);
}

#[test]
fn suite_preempted_and_resumed_default_gap() {
    preempt_all(1, 0x5eed_0003, 2, Options::default().max_gap, 1);
}
