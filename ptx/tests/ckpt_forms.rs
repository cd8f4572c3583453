//! Hand-written kernels for what the suite does not cover: 3-D grids and blocks, predicates,
//! f64 and 16-bit registers live across points, non-aligned `barrier.sync` with shared
//! memory in a loop; each transformed, preempted at seeded random instructions and resumed,
//! gives the bytes of the original.

mod ckpt_support;

use ckpt_support::{Rng, run_ckpt, run_plain};
use ptx::ckpt::{Class, Options, transform};
use suite::{Buffer, Instance, Launch, Param, Size};

fn instance(ptx: &str, grid: [u32; 3], block: [u32; 3], out_words: usize) -> Instance {
    let threads: u64 = grid.iter().chain(&block).map(|&x| u64::from(x)).product();
    Instance {
        workload: "custom",
        size: Size::Small,
        ptx: Box::leak(ptx.to_string().into_boxed_str()),
        buffers: vec![Buffer::input("out", vec![0; out_words * 4])],
        launches: vec![Launch {
            entry: "k",
            grid,
            block,
            shared_bytes: 0,
            params: vec![Param::Buffer(0)],
        }],
        approx_thread_instrs: threads * 200,
    }
}

fn preempted_matches(inst: &Instance, gap: u32, class: Class) {
    for poll_interval in [1, 2] {
        preempted_matches_polling(inst, gap, class, poll_interval);
    }
}

fn preempted_matches_polling(inst: &Instance, gap: u32, class: Class, poll_interval: u32) {
    let (orig, _) = run_plain(inst, inst.ptx, 1);
    assert!(
        orig[0].iter().any(|&b| b != 0),
        "the kernel writes something"
    );
    let t = transform(
        inst.ptx,
        &Options {
            max_gap: gap,
            poll_interval,
            // Strip-mined loops end a chunk every iteration or two: points are crossed.
            chunk_instructions: 16,
            ..Options::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.entries[0].class, class);
    let mut rng = Rng(77);
    let mut saved = 0;
    for trial in 0..6 {
        for workers in [1, 2] {
            let r = run_ckpt(inst, &t, workers, Some(&mut rng), 1 + trial).expect("runs");
            assert_eq!(r.outs, orig, "trial {trial} workers {workers}\n{}", t.ptx);
            saved += r.saved_threads;
        }
    }
    assert!(saved > 0, "never saved at a point");
}

const HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

#[test]
fn three_d_launch_with_predicates_f64_and_b16_live() {
    let text = format!(
        "{HEAD}.visible .entry k(.param .u64 out)\n{{\n\
         .reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n.reg .pred %p<4>;\n.reg .f64 %fd<3>;\n.reg .b16 %h<3>;\n\
         ld.param.u64 %rd1, [out];\n\
         mov.u32 %r1, %tid.x;\nmov.u32 %r2, %tid.y;\nmov.u32 %r3, %tid.z;\n\
         mov.u32 %r4, %ctaid.x;\nmov.u32 %r5, %ctaid.y;\nmov.u32 %r6, %ctaid.z;\n\
         mad.lo.u32 %r7, %r6, 2, %r5;\nmad.lo.u32 %r7, %r7, 2, %r4;\n\
         mad.lo.u32 %r8, %r3, 2, %r2;\nmad.lo.u32 %r8, %r8, 4, %r1;\n\
         mad.lo.u32 %r9, %r7, 16, %r8;\n\
         setp.lt.u32 %p1, %r1, 2;\n\
         cvt.rn.f64.u32 %fd1, %r9;\n\
         cvt.u16.u32 %h1, %r9;\n\
         mov.u32 %r10, 0;\nmov.u32 %r11, 0;\n\
         $L:\n\
         add.f64 %fd1, %fd1, 0d3FF8000000000000;\n\
         add.u16 %h1, %h1, 3;\n\
         selp.u32 %r2, 7, 1, %p1;\n\
         add.u32 %r11, %r11, %r2;\n\
         add.u32 %r10, %r10, 1;\n\
         setp.lt.u32 %p2, %r10, 40;\n\
         @%p2 bra $L;\n\
         cvt.rzi.u32.f64 %r3, %fd1;\n\
         cvt.u32.u16 %r4, %h1;\n\
         add.u32 %r11, %r11, %r3;\n\
         add.u32 %r11, %r11, %r4;\n\
         @%p1 add.u32 %r11, %r11, 1000;\n\
         mul.wide.u32 %rd2, %r9, 4;\nadd.s64 %rd2, %rd1, %rd2;\nst.global.u32 [%rd2], %r11;\nret;\n}}\n"
    );
    preempted_matches(
        &instance(&text, [2, 2, 2], [4, 2, 2], 128),
        4,
        Class::Thread,
    );
}

#[test]
fn non_aligned_barrier_loop_with_shared_memory() {
    let text = format!(
        "{HEAD}.shared .align 4 .b8 buf[256];\n.shared .align 1 .b8 odd[7];\n\
         .visible .entry k(.param .u64 out)\n{{\n\
         .reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n.reg .pred %p<4>;\n.reg .b16 %h<2>;\n\
         ld.param.u64 %rd1, [out];\n\
         mov.u32 %r1, %tid.x;\nmov.u32 %r2, %ctaid.x;\n\
         mov.u32 %r3, buf;\nshl.b32 %r4, %r1, 2;\nadd.u32 %r3, %r3, %r4;\n\
         st.shared.u32 [%r3], %r1;\n\
         mov.u32 %r10, 0;\n\
         $L:\n\
         barrier.sync 0;\n\
         xor.b32 %r5, %r1, 1;\nshl.b32 %r5, %r5, 2;\nmov.u32 %r6, buf;\nadd.u32 %r6, %r6, %r5;\n\
         ld.shared.u32 %r7, [%r6];\n\
         barrier.sync 0;\n\
         add.u32 %r7, %r7, %r10;\n\
         mad.lo.u32 %r7, %r7, 3, %r2;\n\
         st.shared.u32 [%r3], %r7;\n\
         setp.eq.u32 %p1, %r1, 5;\n\
         cvt.u16.u32 %h1, %r7;\n\
         @%p1 st.shared.u8 [odd+3], %h1;\n\
         add.u32 %r10, %r10, 1;\n\
         setp.lt.u32 %p2, %r10, 12;\n\
         @%p2 bra $L;\n\
         barrier.sync 0;\n\
         ld.shared.u8 %h1, [odd+3];\n\
         cvt.u32.u16 %r8, %h1;\n\
         ld.shared.u32 %r7, [%r3];\n\
         add.u32 %r7, %r7, %r8;\n\
         mad.lo.u32 %r9, %r2, 64, %r1;\n\
         mul.wide.u32 %rd2, %r9, 4;\nadd.s64 %rd2, %rd1, %rd2;\nst.global.u32 [%rd2], %r7;\nret;\n}}\n"
    );
    let t = transform(&text, &Options::default()).expect("transforms");
    assert!(t.ptx.contains("barrier.red.or.pred"), "{}", t.ptx);
    assert!(
        !t.ptx
            .contains("bar.red.or.pred %__ck_p, 0, %__ck_p;\n\t@%__ck_p bra $__ck_save")
    );
    preempted_matches(&instance(&text, [3, 1, 1], [64, 1, 1], 192), 64, Class::Cta);
}

/// A local array live across loop points and an inlined `.func` with `.param` buffers (which
/// become local memory): copied whole into the record at every save.
#[test]
fn local_memory_and_inlined_calls() {
    let text = format!(
        "{HEAD}.func (.param .b32 ret) mix(.param .b32 a, .param .b32 b)\n{{\n\
         .reg .b32 %x<4>;\nld.param.b32 %x1, [a];\nld.param.b32 %x2, [b];\n\
         mov.u32 %x3, 0;\n$F:\nmad.lo.u32 %x1, %x1, 33, %x2;\nadd.u32 %x3, %x3, 1;\n\
         setp.lt.u32 %q, %x3, 5;\n@%q bra $F;\nst.param.b32 [ret], %x1;\nret;\n}}\n\
         .visible .entry k(.param .u64 out)\n{{\n\
         .reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n.reg .pred %p<4>, %q;\n\
         .local .align 4 .b8 hist[32];\n.local .align 1 .b8 tag[3];\n\
         ld.param.u64 %rd1, [out];\nmov.u32 %r1, %tid.x;\nmov.u32 %r2, %ctaid.x;\n\
         mad.lo.u32 %r9, %r2, 32, %r1;\n\
         st.local.u32 [hist], 0;\nst.local.u32 [hist+4], 0;\nst.local.u32 [hist+8], 0;\n\
         st.local.u32 [hist+12], 0;\nst.local.u8 [tag+2], %r1;\n\
         mov.u32 %r10, 0;\n\
         $L:\n\
         and.b32 %r3, %r10, 3;\nshl.b32 %r3, %r3, 2;\nmov.u32 %r4, hist;\nadd.u32 %r4, %r4, %r3;\n\
         ld.local.u32 %r5, [%r4];\n\
         {{\n.param .b32 pa;\n.param .b32 pb;\n.param .b32 pr;\n\
         st.param.b32 [pa], %r5;\nst.param.b32 [pb], %r9;\n\
         call (pr), mix, (pa, pb);\nld.param.b32 %r5, [pr];\n}}\n\
         st.local.u32 [%r4], %r5;\n\
         add.u32 %r10, %r10, 1;\nsetp.lt.u32 %p1, %r10, 10;\n@%p1 bra $L;\n\
         ld.local.u32 %r6, [hist];\nld.local.u32 %r7, [hist+4];\nadd.u32 %r6, %r6, %r7;\n\
         ld.local.u32 %r7, [hist+8];\nadd.u32 %r6, %r6, %r7;\nld.local.u8 %r7, [tag+2];\n\
         add.u32 %r6, %r6, %r7;\n\
         mul.wide.u32 %rd2, %r9, 4;\nadd.s64 %rd2, %rd1, %rd2;\nst.global.u32 [%rd2], %r6;\nret;\n}}\n"
    );
    let t = transform(&text, &Options::default()).expect("transforms");
    assert!(
        t.entries[0].local_bytes >= 32 + 3 + 12,
        "{:?}",
        t.entries[0]
    );
    preempted_matches(
        &instance(&text, [2, 1, 1], [32, 1, 1], 64),
        6,
        Class::Thread,
    );
}
