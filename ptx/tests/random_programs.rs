//! Random (valid) PTX programs with loops, divergent branches, barriers, shuffles, votes and
//! memory accesses that may fault: the interpreter must always return (completed, faulted or
//! preempted by the step limit) without panicking, and kernels (racy ones included, with one
//! worker) must give the same memory and state whether they run straight through or are
//! preempted, saved and restored at random points.

mod common;
use common::*;

use ptx::{Launch, Limits, RunControl, RunOutcome};

const REGS: usize = 6;

fn reg(r: &mut Rng) -> String {
    format!("%r{}", r.u32() as usize % REGS)
}

fn program(r: &mut Rng, n: usize) -> String {
    let mut body = String::new();
    let labels = n.div_ceil(4);
    for i in 0..n {
        if i % 4 == 0 {
            body.push_str(&format!("$L{}:\n", i / 4));
        }
        let (d, a, b) = (reg(r), reg(r), reg(r));
        let line = match r.u32() % 29 {
            0 => format!("add.s32 {d}, {a}, {b};"),
            1 => format!("mul.lo.s32 {d}, {a}, {};", r.u32() % 7),
            2 => format!("div.s32 {d}, {a}, {b};"),
            3 => format!("rem.u32 {d}, {a}, {b};"),
            4 => format!("shl.b32 {d}, {a}, {b};"),
            5 => format!("xor.b32 {d}, {a}, %tid.x;"),
            6 => format!("setp.lt.s32 %p1, {a}, {b};"),
            7 => format!("@%p1 bra $L{};", r.u32() as usize % labels),
            8 => format!("@!%p1 bra $L{};", r.u32() as usize % labels),
            9 => {
                // bounded shared access: offset masked into the 256-byte array
                format!(
                    "and.b32 %r9, {a}, 252;\nmov.u32 %r8, sh;\nadd.s32 %r9, %r9, %r8;\nst.shared.u32 [%r9], {b};\nld.shared.u32 {d}, [%r9];"
                )
            }
            10 => {
                // mostly in range; sometimes misaligned or unmapped
                let off = match r.u32() % 10 {
                    0 => 4098,
                    1 => 8192,
                    k => k * 4 + (r.u32() % 70) * 4,
                };
                format!("ld.global.u32 {d}, [%rd1+{off}];")
            }
            11 => format!("st.global.u32 [%rd1+{}], {a};", (r.u32() % 64) * 4),
            12 => "bar.sync 0;".to_string(),
            13 => format!("shfl.sync.bfly.b32 {d}, {a}, {}, 31, -1;", r.u32() % 32),
            14 => format!("shfl.sync.idx.b32 {d}|%p2, {a}, {b}, 31, -1;"),
            15 => format!("vote.sync.ballot.b32 {d}, %p1, -1;"),
            16 => format!(
                "atom.global.add.u32 {d}, [%rd1+{}], {a};",
                (r.u32() % 16) * 4
            ),
            17 => format!(
                "cvt.rn.f32.s32 %f1, {a};\nsqrt.rn.f32 %f1, %f1;\ncvt.rzi.s32.f32 {d}, %f1;"
            ),
            18 => "@%p1 exit;".to_string(),
            19 => format!("selp.b32 {d}, {a}, {b}, %p2;"),
            20 => format!("min.s32 {d}, {a}, {b};"),
            21 => format!("atom.shared.cas.b32 {d}, [sh+8], {a}, {b};"),
            22 => format!("mov.u32 {d}, %laneid;"),
            23 => format!("bar.red.popc.u32 {d}, 0, %p1;\nbar.red.or.pred %p2, 0, !%p1;"),
            24 => format!(
                "add.cc.u32 {d}, {a}, {b};\naddc.cc.u32 {a}, {a}, {d};\nsubc.u32 {b}, {b}, 1;"
            ),
            25 => format!("shf.l.wrap.b32 {d}, {a}, {b}, {a};\nlop3.b32 {a}, {a}, {b}, {d}, 0xE8;"),
            26 => format!("redux.sync.add.u32 {d}, {a}, -1;\nset.lt.u32.s32 {b}, {a}, {d};"),
            27 => format!("bfind.s32 {d}, {a};\nprmt.b32 {b}, {a}, {d}, 0x3210;"),
            _ => format!("sub.s32 {d}, {a}, 1;"),
        };
        body.push_str(&line);
        body.push('\n');
    }
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p0)\n{{\n.reg .b32 %r<10>;\n.reg .b64 %rd<3>;\n.reg .pred %p<3>;\n.reg .f32 %f<2>;\n.shared .align 4 .b8 sh[256];\nld.param.u64 %rd1, [p0];\n{body}\nld.param.u64 %rd2, [p0];\nmov.u32 %r9, %tid.x;\nmul.wide.u32 %rd2, %r9, 4;\nadd.s64 %rd2, %rd2, %rd1;\nadd.s64 %rd2, %rd2, 512;\nst.global.u32 [%rd2], %r0;\nret;\n}}\n"
    )
}

fn outcome_kind(o: &RunOutcome) -> u8 {
    match o {
        RunOutcome::Completed(_) => 0,
        RunOutcome::Preempted(_) => 1,
        RunOutcome::Faulted(_) => 2,
    }
}

#[test]
fn random_programs_never_panic_and_resume_identically() {
    let mut r = Rng(2024);
    let mut kinds = [0u32; 3];
    let stress: usize = std::env::var("PTX_STRESS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for case in 0..150 * stress {
        let len = 10 + r.u32() as usize % 40;
        let text = program(&mut r, len);
        let m = module(&text);
        let block = 1 + r.u32() % 96;
        let mk = || {
            let mem = Mem::new(4096);
            let buf = BASE;
            let init: Vec<u32> = (0..256).map(|i| i * 3 + 1).collect();
            assert!(mem.mem.write_u32s(buf, &init));
            mem
        };
        // Straight run, bounded.
        let mem1 = mk();
        let c = cfg([1, 1, 1], [block, 1, 1], 0, Params::default().u64(BASE));
        let mut l = Launch::new(m.clone(), "k", c.clone(), &Limits::default()).unwrap();
        let mut ctl = RunControl::new(1);
        ctl.step_limit = Some(3000);
        let o1 = l.run(&mem1.mem, &ctl);
        let steps = l.stats().warp_instructions;
        kinds[outcome_kind(&o1) as usize] += 1;
        // Same budget in random slices with save/restore in between.
        let mem2 = mk();
        let mut l2 = Launch::new(m.clone(), "k", c, &Limits::default()).unwrap();
        let mut left = steps;
        let mut o2 = None;
        while left > 0 {
            let mut ctl = RunControl::new(1);
            let slice = (1 + r.next() % 50).min(left);
            ctl.step_limit = Some(slice);
            let o = l2.run(&mem2.mem, &ctl);
            left -= slice.min(left);
            let done = !matches!(o, RunOutcome::Preempted(_));
            o2 = Some(o);
            if done {
                break;
            }
            l2 = Launch::restore(m.clone(), &l2.save(), &Limits::default()).unwrap();
        }
        let o2 = o2.unwrap_or(RunOutcome::Preempted(Default::default()));
        assert_eq!(outcome_kind(&o1), outcome_kind(&o2), "case {case}\n{text}");
        if let (RunOutcome::Faulted(f1), RunOutcome::Faulted(f2)) = (&o1, &o2) {
            assert_eq!(f1, f2, "case {case}");
        }
        assert_eq!(
            mem1.mem.read(BASE, 4096),
            mem2.mem.read(BASE, 4096),
            "case {case}\n{text}"
        );
        if matches!(o1, RunOutcome::Preempted(_)) {
            assert_eq!(
                l.save(),
                l2.save(),
                "case {case}: identical state after same steps"
            );
        }
    }
    // The generator must exercise every outcome.
    assert!(kinds.iter().all(|&k| k > 0), "{kinds:?}");
}
