//! The status mirror (`ptx::ckpt::MIRROR_OFF`): with a mirror address next to the flag,
//! every status word a preempted or resumed thread stores in its record is also in the mirror
//! (marked), and no other mirror word is written; without one (the default: the word is 0)
//! nothing changes. Every suite and long kernel, checkpointing and restarting, preempted at
//! seeded random instructions and resumed, still writes the untransformed kernel's bytes.

mod ckpt_support;

use ckpt_support::{Rng, check, run_ckpt, run_ckpt_mirror, run_plain};
use ptx::ckpt::{Options, transform};

#[test]
fn every_stored_status_is_mirrored_and_results_are_unchanged() {
    let mut rng = Rng(0x3172);
    let mut failures = Vec::new();
    let (mut words, mut raised) = (0u64, 0u64);
    for restart in [false, true] {
        let opts = Options {
            restart,
            chunk_instructions: 64,
            poll_interval: 2,
            max_gap: 8,
            ..Options::default()
        };
        for w in suite::all()
            .filter(|w| w.name != "spin")
            .chain(suite::long::all())
        {
            let t = transform(w.ptx, &opts).unwrap_or_else(|e| panic!("{}: {e}", w.name));
            let inst = w.instance(suite::Size::Small);
            let (orig, _) = run_plain(&inst, w.ptx, 1);
            for trial in 0..2u64 {
                let seed = rng.next();
                let mut a = Rng(seed);
                let mut b = Rng(seed);
                let with = run_ckpt_mirror(&inst, &t, 1, Some(&mut a), 1 + trial);
                let without = run_ckpt(&inst, &t, 1, Some(&mut b), 1 + trial);
                match (with, without) {
                    (Ok(m), Ok(p)) => {
                        words += m.mirror_words;
                        raised += m.flags_raised;
                        if let Err(e) = check(&inst, &m.outs) {
                            failures.push(format!("{} trial {trial}: {e}", w.name));
                        } else if m.outs != orig {
                            failures.push(format!("{} trial {trial}: bytes differ", w.name));
                        }
                        // One preempted round (trial 0) stops at the same instruction with
                        // and without the mirror (later rounds count its instructions too):
                        // the mirror changes no record.
                        if trial == 0
                            && (m.relaunches, m.saved_threads) != (p.relaunches, p.saved_threads)
                        {
                            failures.push(format!(
                                "{} trial {trial}: {} relaunches / {} saved with the mirror, {} / {} without",
                                w.name, m.relaunches, m.saved_threads, p.relaunches, p.saved_threads
                            ));
                        }
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        failures.push(format!("{} trial {trial}: {e}", w.name))
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(raised > 0, "no launch was ever preempted");
    assert!(words > 0, "no status word was ever mirrored");
}
