//! The restart method (`Options::restart`): idempotent entries (no global atomics, no
//! parameter both read and written through) stop without saving and rerun from the start;
//! the others still checkpoint. Every suite and long kernel, preempted at seeded random
//! instructions and resumed, writes the untransformed kernel's bytes; the verdicts per
//! kernel are the expected ones and restarting records hold only the status word.

mod ckpt_support;

use ckpt_support::{Rng, check, run_ckpt, run_plain};
use ptx::ckpt::{HEADER_BYTES, Options, transform};

#[test]
fn idempotent_kernels_restart_and_the_others_checkpoint() {
    let expect_idempotent = [
        ("vecadd", true),
        ("saxpy", false),
        ("matmul", true),
        ("reduction", false),
        ("stencil", true),
        ("graph", false),
        ("histogram", false),
        ("atomics64", false),
        ("long_tight", true),
        ("long_many", true),
        ("long_loose", true),
        ("long_smem", true),
        ("long_atomic", false),
    ];
    let opts = Options {
        restart: true,
        chunk_instructions: 64,
        poll_interval: 2,
        max_gap: 8,
        ..Options::default()
    };
    let mut rng = Rng(0x2e57);
    let mut restarted = 0;
    let mut failures = Vec::new();
    for w in suite::all()
        .filter(|w| w.name != "spin")
        .chain(suite::long::all())
    {
        let t = transform(w.ptx, &opts).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        let plan = t.entry(w.entry).expect("plan");
        if let Some((_, want)) = expect_idempotent.iter().find(|(n, _)| *n == w.name) {
            assert_eq!(
                plan.idempotence.idempotent, *want,
                "{}: {:?}",
                w.name, plan.idempotence
            );
        }
        assert_eq!(plan.restart, plan.idempotence.idempotent, "{}", w.name);
        if plan.restart {
            assert_eq!(plan.record_bytes, HEADER_BYTES, "{}", w.name);
            assert!(!plan.saves_shared);
            assert!(!plan.idempotence.writes.is_empty(), "{}", w.name);
        } else {
            assert!(!plan.idempotence.reason.is_empty(), "{}", w.name);
        }
        let inst = w.instance(suite::Size::Small);
        let (orig, _) = run_plain(&inst, w.ptx, 1);
        for trial in 0..3 {
            match run_ckpt(&inst, &t, 1 + trial as usize % 2, Some(&mut rng), 1 + trial) {
                Ok(r) => {
                    if plan.restart {
                        restarted += r.relaunches;
                        assert_eq!(r.saved_threads, 0, "{}: a restarting thread saved", w.name);
                    }
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
    assert!(restarted > 0, "no restarting kernel was ever relaunched");
}

#[test]
fn a_kernel_reading_what_it_writes_is_not_idempotent() {
    let text = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 a)\n{\n.reg .b32 %r<3>;\n.reg .b64 %rd<4>;\n\
        ld.param.u64 %rd1, [a];\ncvta.to.global.u64 %rd2, %rd1;\nmov.u32 %r1, %tid.x;\n\
        mul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd3, %rd2, %rd3;\nld.global.u32 %r2, [%rd3];\n\
        add.u32 %r2, %r2, 1;\nst.global.u32 [%rd3], %r2;\nret;\n}\n";
    let t = transform(
        text,
        &Options {
            restart: true,
            ..Options::default()
        },
    )
    .expect("transforms");
    let p = &t.entries[0];
    assert!(!p.restart);
    assert!(
        p.idempotence.reason.contains("read and written"),
        "{:?}",
        p.idempotence
    );
}
