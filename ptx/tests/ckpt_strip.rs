//! Strip-mined loops (`Options::chunk_instructions`): counted loops of many forms (`lt`, `le`,
//! `ne` counting up and down, swapped operands, a negated back branch, 64-bit and signed
//! counters, an immediate bound of zero, forward branches inside, a barrier loop of a `Cta`
//! kernel) become an inner loop with a clamped bound plus the original test; loops that are
//! not counted keep the counted poll. Each kernel, never preempted and preempted at seeded
//! random instructions with small and default chunks, writes the original's bytes.

mod ckpt_support;

use ckpt_support::{Rng, run_ckpt, run_plain};
use ptx::ckpt::{Options, transform};
use suite::{Buffer, Instance, Launch, Param, Size};

const HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// A kernel `k(out)` whose thread `gid` runs `setup` then the loop `body` (label `$L`), then
/// stores `%r1` and `%r2` to `out[2 gid]`, `out[2 gid + 1]`. `%r0` is `gid`.
fn kernel(decls: &str, setup: &str, body: &str) -> String {
    format!(
        "{HEAD}.visible .entry k(.param .u64 out)\n{{\n\
         .reg .b32 %r<8>;\n.reg .b64 %rd<8>;\n.reg .pred %p<4>;\n{decls}\
         ld.param.u64 %rd1, [out];\n\
         mov.u32 %r5, %ctaid.x;\nmov.u32 %r6, %ntid.x;\nmov.u32 %r7, %tid.x;\n\
         mad.lo.u32 %r0, %r5, %r6, %r7;\n\
         mov.u32 %r1, 7;\nmov.u32 %r2, 0;\n{setup}\
         $L:\n{body}\
         mul.wide.u32 %rd2, %r0, 8;\nadd.s64 %rd2, %rd1, %rd2;\n\
         st.global.u32 [%rd2], %r1;\nst.global.u32 [%rd2+4], %r2;\nret;\n}}\n"
    )
}

fn instance(text: String, shared_words: u32) -> Instance {
    let _ = shared_words;
    Instance {
        workload: "strip",
        size: Size::Small,
        ptx: Box::leak(text.into_boxed_str()),
        buffers: vec![Buffer::input("out", vec![0; 2 * 64 * 8])],
        launches: vec![Launch {
            entry: "k",
            grid: [2, 1, 1],
            block: [64, 1, 1],
            shared_bytes: 0,
            params: vec![Param::Buffer(0)],
        }],
        approx_thread_instrs: 128 * 60,
    }
}

/// Transformed with `chunk` (instructions per poll), is the loop strip-mined, and do the
/// preempted runs write the original's bytes?
fn check(inst: &Instance, chunk: u32) -> bool {
    let (orig, _) = run_plain(inst, inst.ptx, 1);
    assert!(orig[0].iter().any(|&b| b != 0));
    let t = transform(
        inst.ptx,
        &Options {
            chunk_instructions: chunk,
            poll_interval: 2,
            max_gap: 16,
            ..Options::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", inst.ptx));
    let never = run_ckpt(inst, &t, 1, None, 0).expect("runs");
    assert_eq!(
        never.outs, orig,
        "never preempted, chunk {chunk}\n{}",
        t.ptx
    );
    let mut rng = Rng(0x5717 + u64::from(chunk));
    let mut saved = 0;
    for trial in 0..6 {
        for workers in [1, 2] {
            let r = run_ckpt(inst, &t, workers, Some(&mut rng), 1 + trial).expect("runs");
            assert_eq!(r.outs, orig, "chunk {chunk} trial {trial}\n{}", t.ptx);
            saved += r.saved_threads;
        }
    }
    // A default chunk holds these short loops whole: the flag is seen at the next point
    // after the loop or never, so only small chunks must have saved threads.
    assert!(
        saved > 0 || !(1..=24).contains(&chunk),
        "never saved, chunk {chunk}\n{}",
        t.ptx
    );
    t.ptx.contains("$__ck_in")
}

/// Counted loops: strip-mined, and correct with chunks of one iteration, a few, and the
/// default.
#[test]
fn counted_loops_are_strip_mined_and_resume_identically() {
    let lcg = "mad.lo.u32 %r1, %r1, 1664525, 1013904223;\nxor.b32 %r2, %r2, %r1;\n";
    let cases: Vec<(&str, String, String)> = vec![
        (
            "lt up",
            "mov.u32 %r3, 0;\nadd.u32 %r4, %r0, 20;\n".into(),
            format!("{lcg}add.u32 %r3, %r3, 1;\nsetp.lt.u32 %p1, %r3, %r4;\n@%p1 bra $L;\n"),
        ),
        (
            "le up by 3, swapped",
            "mov.u32 %r3, 0;\nadd.u32 %r4, %r0, 40;\n".into(),
            format!("{lcg}add.s32 %r3, %r3, 3;\nsetp.ge.s32 %p1, %r4, %r3;\n@%p1 bra $L;\n"),
        ),
        (
            "ne down to zero",
            "add.u32 %r3, %r0, 25;\n".into(),
            format!("{lcg}add.s32 %r3, %r3, -1;\nsetp.ne.s32 %p1, %r3, 0;\n@%p1 bra $L;\n"),
        ),
        (
            "unsigned ne down to zero",
            "add.u32 %r3, %r0, 25;\n".into(),
            format!("{lcg}sub.u32 %r3, %r3, 1;\nsetp.ne.u32 %p1, %r3, 0;\n@%p1 bra $L;\n"),
        ),
        (
            "negated exit test, sub",
            "add.u32 %r3, %r0, 30;\n".into(),
            format!("{lcg}sub.s32 %r3, %r3, 2;\nsetp.le.s32 %p1, %r3, 4;\n@!%p1 bra $L;\n"),
        ),
        (
            "ne up by 4 from negative",
            "mul.lo.s32 %r3, %r0, -4;\nadd.s32 %r3, %r3, -24;\n".into(),
            format!("{lcg}add.s32 %r3, %r3, 4;\nsetp.ne.s32 %p1, %r3, 0;\n@%p1 bra $L;\n"),
        ),
        (
            "64-bit",
            "mov.u64 %rd3, 0;\ncvt.u64.u32 %rd4, %r0;\nadd.u64 %rd4, %rd4, 17;\n".into(),
            format!("{lcg}add.u64 %rd3, %rd3, 1;\nsetp.lt.u64 %p1, %rd3, %rd4;\n@%p1 bra $L;\n"),
        ),
        (
            "branch inside",
            "mov.u32 %r3, 0;\nadd.u32 %r4, %r0, 20;\n".into(),
            format!(
                "{lcg}and.b32 %r5, %r1, 1;\nsetp.eq.u32 %p2, %r5, 0;\n@%p2 bra $Skip;\n\
                  add.u32 %r2, %r2, 5;\n$Skip:\nadd.u32 %r3, %r3, 1;\n\
                  setp.lt.u32 %p1, %r3, %r4;\n@%p1 bra $L;\n"
            ),
        ),
    ];
    for (name, setup, body) in cases {
        let inst = instance(kernel("", &setup, &body), 0);
        for chunk in [1, 8, 512] {
            assert!(
                check(&inst, chunk),
                "{name}: not strip-mined (chunk {chunk})"
            );
        }
        assert!(!check(&inst, 0), "{name}: chunk 0 keeps the counted poll");
    }
}

/// Loops that are not counted keep the counted poll, and stay correct.
#[test]
fn other_loops_keep_the_counted_poll() {
    let lcg = "mad.lo.u32 %r1, %r1, 1664525, 1013904223;\nxor.b32 %r2, %r2, %r1;\n";
    let cases: Vec<(&str, &str, String)> = vec![
        // The bound changes in the loop.
        (
            "moving bound",
            "mov.u32 %r3, 0;\nadd.u32 %r4, %r0, 20;\n",
            format!(
                "{lcg}add.u32 %r3, %r3, 2;\nadd.u32 %r4, %r4, 1;\nsetp.lt.u32 %p1, %r3, %r4;\n@%p1 bra $L;\n"
            ),
        ),
        // Data-dependent exit.
        (
            "data exit",
            "",
            format!("{lcg}and.b32 %r3, %r1, 15;\nsetp.ne.u32 %p1, %r3, 0;\n@%p1 bra $L;\n"),
        ),
        // The counter is stepped twice.
        (
            "two steps",
            "mov.u32 %r3, 0;\n",
            format!(
                "{lcg}add.u32 %r3, %r3, 1;\nadd.u32 %r3, %r3, 1;\nsetp.lt.u32 %p1, %r3, 30;\n@%p1 bra $L;\n"
            ),
        ),
        // The predicate is read in the loop.
        (
            "predicate read",
            "mov.u32 %r3, 0;\n",
            format!(
                "{lcg}add.u32 %r3, %r3, 1;\nsetp.lt.u32 %p1, %r3, 30;\nselp.u32 %r4, 1, 2, %p1;\nadd.u32 %r2, %r2, %r4;\n@%p1 bra $L;\n"
            ),
        ),
    ];
    for (name, setup, body) in cases {
        let inst = instance(kernel("", setup, &body), 0);
        assert!(!check(&inst, 8), "{name}: strip-mined");
    }
}

/// A `Cta` loop with shared memory and two barriers: its point moves to the loop header
/// (one extra `bar.red` per chunk) and the barriers stay plain.
#[test]
fn a_barrier_loop_is_strip_mined_at_its_header() {
    let text = format!(
        "{HEAD}.visible .entry k(.param .u64 out)\n{{\n\
         .reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n.reg .pred %p<3>;\n\
         .shared .align 4 .b8 sh[256];\n\
         ld.param.u64 %rd1, [out];\n\
         mov.u32 %r5, %ctaid.x;\nmov.u32 %r6, %ntid.x;\nmov.u32 %r7, %tid.x;\n\
         mad.lo.u32 %r0, %r5, %r6, %r7;\n\
         mov.u32 %r8, sh;\nshl.b32 %r9, %r7, 2;\nadd.u32 %r9, %r8, %r9;\n\
         add.u32 %r10, %r7, 1;\nrem.u32 %r10, %r10, %r6;\nshl.b32 %r10, %r10, 2;\nadd.u32 %r10, %r8, %r10;\n\
         mov.u32 %r1, %r0;\nmov.u32 %r2, 0;\nmov.u32 %r3, 0;\n\
         st.shared.u32 [%r9], %r1;\nbar.sync 0;\n\
         $L:\nld.shared.u32 %r4, [%r10];\nmad.lo.u32 %r1, %r1, 1664525, %r4;\n\
         bar.sync 0;\nst.shared.u32 [%r9], %r1;\nbar.sync 0;\nadd.u32 %r2, %r2, %r4;\n\
         add.u32 %r3, %r3, 1;\nsetp.lt.u32 %p1, %r3, 40;\n@%p1 bra $L;\n\
         mul.wide.u32 %rd2, %r0, 8;\nadd.s64 %rd2, %rd1, %rd2;\n\
         st.global.u32 [%rd2], %r1;\nst.global.u32 [%rd2+4], %r2;\nret;\n}}\n"
    );
    let inst = instance(text, 64);
    for chunk in [1, 24, 512] {
        assert!(check(&inst, chunk), "not strip-mined (chunk {chunk})");
    }
    assert!(!check(&inst, 0));
}

#[test]
fn the_tight_loop_of_lcg_spin_keeps_its_shape() {
    let t = transform(suite::lcg::PTX, &Options::default()).expect("transforms");
    let p = &t.ptx;
    // The inner loop is the original four instructions with the clamped bound.
    let inner = p.split("$__ck_in1:").nth(1).expect("inner loop");
    let body: Vec<&str> = inner
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect();
    assert_eq!(body[0], "mad.lo.s32 %r7, %r7, 1664525, 1013904223;");
    assert_eq!(body[1], "add.s32 %r8, %r8, 1;");
    assert_eq!(body[2], "setp.lt.u32 %p2, %r8, %__ck_l32;");
    assert_eq!(body[3], "@%p2 bra $__ck_in1;");
    // No countdown anywhere.
    assert!(!p.contains("%__ck_n, %__ck_n"), "{p}");
}

/// An unsigned loop counting down to zero runs whole chunks to the end (the chunk's bound
/// does not wrap below zero): never preempted, it costs a few instructions per chunk.
#[test]
fn an_unsigned_countdown_keeps_whole_chunks() {
    let body = "mad.lo.u32 %r1, %r1, 1664525, 1013904223;\nsub.u32 %r3, %r3, 1;\n\
                setp.ne.u32 %p1, %r3, 0;\n@%p1 bra $L;\n";
    let inst = instance(kernel("", "add.u32 %r3, %r0, 100;\n", body), 0);
    let (orig, so) = run_plain(&inst, inst.ptx, 1);
    let t = transform(inst.ptx, &Options::default()).expect("transforms");
    assert!(t.ptx.contains("$__ck_in1:"), "{}", t.ptx);
    let r = run_ckpt(&inst, &t, 1, None, 0).expect("runs");
    assert_eq!(r.outs, orig);
    // 100..227 iterations of 4 instructions per thread, one or two chunks each.
    let extra = r.stats.thread_instructions as f64 / so.thread_instructions as f64;
    assert!(extra < 1.10, "{extra}");
    let _ = Rng(1);
}

/// Whole chunks of a loop whose counter only steps and tests run as a constant-trip copy
/// (`$__ck_fa`), the last partial chunk as the clamped loop; a loop that reads its counter
/// in the body, and `fast_chunks: false`, get no copy. Counters near the top of their range
/// (the chunk's end wraps) take the clamped loop. Every form writes the original's bytes,
/// never preempted and preempted at random instructions.
#[test]
fn whole_chunks_run_as_a_constant_trip_copy() {
    let lcg = "mad.lo.u32 %r1, %r1, 1664525, 1013904223;\nxor.b32 %r2, %r2, %r1;\n";
    let cases: Vec<(&str, String, String, bool)> = vec![
        (
            "counter only steps",
            "mov.u32 %r3, 0;\nadd.u32 %r4, %r0, 300;\n".into(),
            format!("{lcg}add.u32 %r3, %r3, 1;\nsetp.lt.u32 %p1, %r3, %r4;\n@%p1 bra $L;\n"),
            true,
        ),
        (
            "counter read in the body",
            "mov.u32 %r3, 0;\nadd.u32 %r4, %r0, 300;\n".into(),
            format!(
                "{lcg}xor.b32 %r2, %r2, %r3;\nadd.u32 %r3, %r3, 1;\n\
                 setp.lt.u32 %p1, %r3, %r4;\n@%p1 bra $L;\n"
            ),
            false,
        ),
        (
            "unsigned counter whose chunk end wraps",
            "mov.u32 %r3, -300;\nmov.u32 %r4, -1;\n".into(),
            format!("{lcg}add.u32 %r3, %r3, 1;\nsetp.lt.u32 %p1, %r3, %r4;\n@%p1 bra $L;\n"),
            true,
        ),
        (
            "signed counter near the top",
            "mov.u32 %r3, 2147483000;\nmov.u32 %r4, 2147483600;\n".into(),
            format!("{lcg}add.s32 %r3, %r3, 3;\nsetp.lt.s32 %p1, %r3, %r4;\n@%p1 bra $L;\n"),
            true,
        ),
        (
            "signed counting down by 2",
            "add.u32 %r3, %r0, 400;\n".into(),
            format!("{lcg}sub.s32 %r3, %r3, 2;\nsetp.gt.s32 %p1, %r3, 0;\n@%p1 bra $L;\n"),
            true,
        ),
        (
            "64-bit",
            "mov.u64 %rd3, 0;\ncvt.u64.u32 %rd4, %r0;\nadd.u64 %rd4, %rd4, 270;\n".into(),
            format!("{lcg}add.u64 %rd3, %rd3, 1;\nsetp.lt.u64 %p1, %rd3, %rd4;\n@%p1 bra $L;\n"),
            true,
        ),
    ];
    for (name, setup, body, fast) in cases {
        let inst = instance(kernel("", &setup, &body), 0);
        for chunk in [8, 64, 512] {
            assert!(check(&inst, chunk), "{name}: not strip-mined");
        }
        let t = transform(inst.ptx, &Options::default()).expect("transforms");
        assert_eq!(t.ptx.contains("$__ck_fa1:"), fast, "{name}\n{}", t.ptx);
        let off = transform(
            inst.ptx,
            &Options {
                fast_chunks: false,
                ..Options::default()
            },
        )
        .expect("transforms");
        assert!(!off.ptx.contains("$__ck_fa"), "{name}: fast_chunks off");
        let (orig, _) = run_plain(&inst, inst.ptx, 1);
        assert_eq!(run_ckpt(&inst, &off, 1, None, 0).expect("runs").outs, orig);
    }
}

/// The copy of `lcg_spin`'s loop: the body, the counter and the one-time step.
#[test]
fn the_copy_of_lcg_spin_counts_down_and_steps_once() {
    let t = transform(suite::lcg::PTX, &Options::default()).expect("transforms");
    let copy = t.ptx.split("$__ck_fa1:").nth(1).expect("copy");
    let body: Vec<&str> = copy
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(6)
        .collect();
    assert_eq!(
        body,
        [
            "mad.lo.s32 %r7, %r7, 1664525, 1013904223;",
            "sub.u32 %__ck_k, %__ck_k, 1;",
            "setp.ne.u32 %p2, %__ck_k, 0;",
            "@%p2 bra $__ck_fa1;",
            "mov.b32 %r8, %__ck_l32;",
            "bra.uni $__ck_te1;",
        ]
    );
}

/// `Options::atomic_weight`: a loop of one global atomic per iteration (`long_atomic`, not
/// idempotent) gets shorter chunks, so more polls, the larger the weight (the cuda engine's
/// 64 against the default 8), and keeps the original's bytes never preempted and preempted
/// at seeded random instructions.
#[test]
fn the_atomic_weight_shortens_the_chunks_of_a_loop_of_atomics() {
    let inst = suite::long::find("long_atomic")
        .unwrap()
        .instance(Size::Small);
    let (orig, plain) = run_plain(&inst, inst.ptx, 1);
    let mut instrs = Vec::new();
    for weight in [1, ptx::ckpt::DEFAULT_ATOMIC_WEIGHT, 64] {
        let t = transform(
            inst.ptx,
            &Options {
                atomic_weight: weight,
                ..Options::default()
            },
        )
        .unwrap();
        assert!(t.ptx.contains("$__ck_in"), "strip-mined at weight {weight}");
        let never = run_ckpt(&inst, &t, 1, None, 0).expect("runs");
        assert_eq!(never.outs, orig, "never preempted, weight {weight}");
        let mut rng = Rng(0xa70 + u64::from(weight));
        for trial in 0..4 {
            let r = run_ckpt(&inst, &t, 2, Some(&mut rng), 1 + trial).expect("runs");
            assert_eq!(r.outs, orig, "weight {weight} trial {trial}");
        }
        instrs.push(never.stats.thread_instructions);
    }
    // More chunks, more polls: strictly more instructions at each larger weight, and the
    // cuda engine's weight still within 1.25x of the untransformed kernel here.
    assert!(instrs[0] < instrs[1] && instrs[1] < instrs[2], "{instrs:?}");
    let over = instrs[2] as f64 / plain.thread_instructions as f64;
    assert!(
        over < 1.25,
        "weight 64: {over:.3}x the original's instructions"
    );
}
