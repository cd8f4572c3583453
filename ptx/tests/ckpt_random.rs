//! Random structured programs (nested counted loops, forward branches, guarded and predicated
//! code, carry chains, 32/64-bit and float registers, early exits) transformed with small
//! gaps, preempted at seeded random instructions and resumed: the memory they write is
//! byte-identical to the untransformed program's. Finds liveness and incremental-save bugs.

mod ckpt_support;

use ckpt_support::{Rng, run_ckpt, run_plain};
use ptx::ckpt::{Options, transform};
use suite::{Buffer, Instance, Launch, Param, Size};

struct Gen {
    rng: Rng,
    labels: u32,
    out: String,
}

impl Gen {
    fn reg(&mut self) -> String {
        format!("%r{}", self.rng.below(6))
    }

    fn straight(&mut self, n: u64) {
        let skip = if self.rng.below(3) == 0 {
            self.labels += 1;
            Some(format!("$S{}", self.labels))
        } else {
            None
        };
        let at = self.rng.below(n.max(1));
        for k in 0..n {
            let (d, a, b) = (self.reg(), self.reg(), self.reg());
            let line = match self.rng.below(14) {
                0 => format!("add.u32 {d}, {a}, {b};"),
                1 => format!("mad.lo.u32 {d}, {a}, {}, {b};", self.rng.below(9) + 1),
                2 => format!("xor.b32 {d}, {a}, %tid.x;"),
                3 => format!("setp.lt.u32 %p1, {a}, {b};"),
                4 => format!("@%p1 add.u32 {d}, {d}, 7;"),
                5 => format!("selp.b32 {d}, {a}, {b}, %p1;"),
                6 => format!("add.cc.u32 {d}, {a}, {b};\naddc.u32 {a}, {a}, {b};"),
                7 => format!("cvt.u64.u32 %rd3, {a};\nadd.u64 %rd2, %rd2, %rd3;"),
                8 => format!("cvt.rn.f32.u32 %f2, {a};\nadd.f32 %f1, %f1, %f2;"),
                9 => format!("shr.u32 {d}, {a}, {};", self.rng.below(5)),
                10 => format!("setp.ne.u32 %p2, {a}, 0;"),
                11 => format!("@!%p2 sub.u32 {d}, {a}, 1;"),
                12 => format!("min.u32 {d}, {a}, {b};"),
                _ => format!("mul.lo.u32 {d}, {a}, 3;"),
            };
            self.out.push_str(&line);
            self.out.push('\n');
            if let Some(l) = &skip
                && k == at
            {
                self.out.push_str(&format!("@%p2 bra {l};\n"));
            }
        }
        if let Some(l) = skip {
            self.out.push_str(&format!("{l}:\n"));
        }
    }

    fn block(&mut self, depth: u32) {
        let parts = 1 + self.rng.below(3);
        for _ in 0..parts {
            let n = 1 + self.rng.below(6);
            self.straight(n);
            if depth < 2 && self.rng.below(2) == 0 {
                self.labels += 1;
                let l = self.labels;
                let trips = 1 + self.rng.below(4);
                self.out
                    .push_str(&format!("mov.u32 %c{depth}, 0;\n$L{l}:\n"));
                self.block(depth + 1);
                self.out.push_str(&format!(
                    "add.u32 %c{depth}, %c{depth}, 1;\nsetp.lt.u32 %p3, %c{depth}, {trips};\n@%p3 bra $L{l};\n"
                ));
            }
        }
    }
}

fn program(seed: u64) -> String {
    let mut g = Gen {
        rng: Rng(seed),
        labels: 0,
        out: String::new(),
    };
    g.block(0);
    let early = if g.rng.below(4) == 0 {
        "setp.eq.u32 %p3, %r5, 3;\n@%p3 bra $Out;\n"
    } else {
        ""
    };
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 out)\n{{\n\
         .reg .b32 %r<6>;\n.reg .b32 %c<3>;\n.reg .b64 %rd<6>;\n.reg .f32 %f<3>;\n.reg .pred %p<4>;\n\
         ld.param.u64 %rd1, [out];\nmov.u32 %r0, %tid.x;\nmov.u32 %r1, %ctaid.x;\nmov.u32 %r2, 5;\n\
         mov.u32 %r3, 11;\nmov.u32 %r4, %ntid.x;\nmov.u32 %r5, 0;\nmov.u64 %rd2, 0;\nmov.f32 %f1, 0f00000000;\n\
         setp.eq.u32 %p1, %r0, 1;\nsetp.ne.u32 %p2, %r0, 2;\n{early}{}\
         $Out:\n\
         mov.u32 %c2, %tid.x;\nmov.u32 %c1, %ctaid.x;\nmad.lo.u32 %c2, %c1, 64, %c2;\n\
         mul.wide.u32 %rd4, %c2, 40;\nadd.s64 %rd4, %rd1, %rd4;\n\
         st.global.u32 [%rd4], %r0;\nst.global.u32 [%rd4+4], %r1;\nst.global.u32 [%rd4+8], %r2;\n\
         st.global.u32 [%rd4+12], %r3;\nst.global.u32 [%rd4+16], %r4;\nst.global.u32 [%rd4+20], %r5;\n\
         st.global.u64 [%rd4+24], %rd2;\nst.global.f32 [%rd4+32], %f1;\n\
         selp.u32 %c0, 1, 0, %p1;\nst.global.u32 [%rd4+36], %c0;\nret;\n}}\n",
        g.out
    )
}

#[test]
fn random_programs_resume_identically() {
    let mut rng = Rng(0xfeed);
    let mut saved = 0;
    for case in 0..36u64 {
        let text = program(0x1234_5678 + case * 7919);
        let inst = Instance {
            workload: "random",
            size: Size::Small,
            ptx: Box::leak(text.clone().into_boxed_str()),
            buffers: vec![Buffer::input("out", vec![0; 2 * 64 * 40])],
            launches: vec![Launch {
                entry: "k",
                grid: [2, 1, 1],
                block: [64, 1, 1],
                shared_bytes: 0,
                params: vec![Param::Buffer(0)],
            }],
            approx_thread_instrs: 128 * 60,
        };
        let (orig, _) = run_plain(&inst, &text, 1);
        // chunk_instructions: 0 counts every loop's crossings down; small chunks end the
        // strip-mined inner loops every iteration or two.
        for (gap, poll_interval, chunk) in [(2, 1, 512), (5, 3, 8), (64, 1, 0), (3, 2, 20)] {
            let t = transform(
                &text,
                &Options {
                    max_gap: gap,
                    poll_interval,
                    chunk_instructions: chunk,
                    ..Options::default()
                },
            )
            .unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
            for workers in [1, 2] {
                let r = run_ckpt(&inst, &t, workers, Some(&mut rng), 3)
                    .unwrap_or_else(|e| panic!("case {case}: {e}"));
                saved += r.saved_threads;
                assert!(
                    r.outs == orig,
                    "case {case} gap {gap} workers {workers} differs\n{text}"
                );
            }
        }
    }
    assert!(saved > 100, "only {saved} saves");
}
