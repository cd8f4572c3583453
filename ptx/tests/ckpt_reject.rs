//! Kernels `ptx::ckpt::transform` refuses, each with its typed reason.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ptx::LoadOptions;
use ptx::ckpt::{Options, Unsupported, transform};

fn kernel(decls: &str, body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 buf)\n{{\n\
         .reg .b32 %r<8>;\n.reg .b64 %rd<4>;\n.reg .pred %p<3>;\n{decls}\n\
         ld.param.u64 %rd1, [buf];\nmov.u32 %r1, %tid.x;\n{body}\n\
         mul.wide.u32 %rd2, %r1, 4;\nadd.s64 %rd2, %rd1, %rd2;\nst.global.u32 [%rd2], %r2;\nret;\n}}\n"
    )
}

const LOOP: &str = "mov.u32 %r2, 0;\n$L:\nadd.u32 %r2, %r2, %r1;\nadd.u32 %r3, %r3, 1;\n\
                    setp.lt.u32 %p1, %r3, 10;\n@%p1 bra $L;";

fn err(text: &str, opts: &Options) -> Unsupported {
    match transform(text, opts) {
        Ok(t) => panic!("accepted:\n{}", t.ptx),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

#[test]
fn a_plain_loop_is_accepted() {
    let t = transform(&kernel("", LOOP), &Options::default()).expect("accepted");
    assert_eq!(t.entries[0].points.len(), 1);
}

#[test]
fn shared_memory_without_barrier() {
    let text = kernel(
        ".shared .align 4 .b8 sh[64];",
        "mov.u32 %r4, sh;\nst.shared.u32 [%r4], %r1;\nld.shared.u32 %r2, [%r4];",
    );
    let e = err(&text, &Options::default());
    assert!(
        matches!(e, Unsupported::SharedWithoutBarrier { ref entry } if entry == "k"),
        "{e}"
    );
}

#[test]
fn partial_guarded_or_named_barriers() {
    for (b, line) in [
        ("bar.sync 0, 64;", 13),
        ("@%p1 bar.sync 0;", 13),
        ("barrier.sync 1, 32;", 13),
    ] {
        let text = kernel(
            "",
            &format!("setp.eq.u32 %p1, %r1, 0;\n{b}\nmov.u32 %r2, 1;"),
        );
        let e = err(&text, &Options::default());
        match e {
            Unsupported::Barrier { entry, line: l, .. } => {
                assert_eq!((entry.as_str(), l), ("k", line), "{b}");
            }
            other => panic!("{b}: {other}"),
        }
    }
}

#[test]
fn local_memory_over_the_limit() {
    let text = kernel(
        ".local .align 4 .b8 scratch[4096];",
        "st.local.u32 [scratch], %r1;\nld.local.u32 %r2, [scratch];",
    );
    let e = err(&text, &Options::default());
    assert!(
        matches!(e, Unsupported::LocalMemory { ref name, bytes: 4096, limit: 1024, .. } if name == "scratch"),
        "{e}"
    );
    let opts = Options {
        max_local_bytes: 4096,
        max_record_bytes: 8192,
        ..Options::default()
    };
    transform(&text, &opts).expect("accepted under a larger limit");
}

#[test]
fn reserved_names() {
    let text = kernel(
        ".reg .b32 %__ck_mine;",
        "mov.u32 %__ck_mine, 1;\nmov.u32 %r2, %__ck_mine;",
    );
    let e = err(&text, &Options::default());
    assert!(
        matches!(e, Unsupported::ReservedName { ref name, .. } if name == "%__ck_mine"),
        "{e}"
    );
}

#[test]
fn too_many_live_bytes_and_points() {
    let opts = Options {
        max_record_bytes: 8,
        ..Options::default()
    };
    let e = err(&kernel("", LOOP), &opts);
    assert!(
        matches!(e, Unsupported::TooManyLiveBytes { limit: 8, .. }),
        "{e}"
    );
    let opts = Options {
        max_points: 0,
        ..Options::default()
    };
    let e = err(&kernel("", LOOP), &opts);
    assert!(
        matches!(
            e,
            Unsupported::TooManyPoints {
                points: 1,
                limit: 0,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn analysis_budgets() {
    let opts = Options {
        max_work: 10,
        ..Options::default()
    };
    let e = err(&kernel("", LOOP), &opts);
    assert!(
        matches!(
            e,
            Unsupported::Budget {
                what: "analysis work units",
                ..
            }
        ),
        "{e}"
    );
    let opts = Options {
        max_analysis_bytes: 16,
        ..Options::default()
    };
    let e = err(&kernel("", LOOP), &opts);
    assert!(
        matches!(
            e,
            Unsupported::Budget {
                what: "analysis bytes",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn unloadable_text_cancel_and_indirect_branches() {
    let e = err("this is not ptx", &Options::default());
    assert!(matches!(e, Unsupported::Parse(_)), "{e}");
    let e = err(&kernel("", "bra %r1;"), &Options::default());
    assert!(
        matches!(
            e,
            Unsupported::Parse(_) | Unsupported::IndirectBranch { .. }
        ),
        "{e}"
    );
    let opts = Options {
        load: LoadOptions {
            cancel: Some(Arc::new(AtomicBool::new(true))),
            ..LoadOptions::default()
        },
        ..Options::default()
    };
    let e = err(&kernel("", LOOP), &opts);
    assert!(
        matches!(e, Unsupported::Parse(ptx::PtxError::Cancelled)),
        "{e}"
    );
}
