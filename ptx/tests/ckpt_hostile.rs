//! Hostile input to `ptx::ckpt::transform`: mutated suite kernels never panic, and whatever
//! is accepted prints PTX that loads again (and, naming the reserved `__ck` prefix, is
//! refused a second transformation); adversarial shapes stop at the analysis budget.

use proptest::prelude::*;
use ptx::ckpt::{Options, Unsupported, transform};

fn opts() -> Options {
    Options {
        max_work: 1 << 22,
        ..Options::default()
    }
}

fn check(text: &str) {
    match transform(text, &opts()) {
        Ok(t) => {
            ptx::parse(&t.ptx).expect("accepted output loads");
            let again = transform(&t.ptx, &opts());
            assert!(
                t.entries.is_empty() || matches!(again, Err(Unsupported::ReservedName { .. })),
                "{again:?}"
            );
            assert_eq!(
                t.entries.len(),
                ptx::parse(text).expect("input loads").entries().count()
            );
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn mutate(text: &str, ops: &[(u8, usize, usize)]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for &(op, a, b) in ops {
        if lines.is_empty() {
            break;
        }
        let (a, b) = (a % lines.len(), b % lines.len());
        match op % 6 {
            0 => {
                lines.remove(a);
            }
            1 => {
                let l = lines[a].clone();
                lines.insert(b, l);
            }
            2 => lines.swap(a, b),
            3 => {
                // Replace a token of line a by a token of line b.
                let ta: Vec<&str> = lines[a].split_whitespace().collect();
                let tb: Vec<&str> = lines[b].split_whitespace().collect();
                if !ta.is_empty() && !tb.is_empty() {
                    let k = b % ta.len();
                    let mut t: Vec<String> = ta.iter().map(|s| s.to_string()).collect();
                    t[k] = tb[a % tb.len()].to_string();
                    lines[a] = t.join(" ");
                }
            }
            4 => lines.truncate(a.max(1)),
            _ => {
                let len = lines[a].len();
                let keep = len - len.min(b % 17);
                let cut: String = lines[a].chars().take(keep).collect();
                lines[a] = cut;
            }
        }
    }
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn mutated_suite_kernels_never_panic(
        k in 0usize..64,
        ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 1..6),
    ) {
        let all: Vec<_> = suite::all().collect();
        let w = all[k % all.len()];
        check(&mutate(w.ptx, &ops));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        check(&String::from_utf8_lossy(&bytes));
    }
}

/// Every unmutated suite kernel passes the same checks.
#[test]
fn suite_kernels_pass_the_checks() {
    for w in suite::all() {
        check(w.ptx);
    }
}

/// Many loops with many live registers: the incremental analysis (points x instructions x
/// registers) stops at the work budget instead of running long.
#[test]
fn adversarial_shapes_stop_at_the_budget() {
    let loops = 600;
    let mut body = String::new();
    for k in 0..loops {
        body.push_str(&format!(
            "$L{k}:\nadd.u32 %v{k}, %v{k}, 1;\nsetp.lt.u32 %p1, %v{k}, 3;\n@%p1 bra $L{k};\n"
        ));
    }
    for k in 0..loops {
        body.push_str(&format!("add.u32 %v0, %v0, %v{k};\n"));
    }
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{{\n\
         .reg .b32 %v<{loops}>;\n.reg .pred %p<2>;\n{body}ret;\n}}\n"
    );
    let opts = Options {
        max_points: 100_000,
        max_record_bytes: 1 << 20,
        max_work: 1 << 24,
        ..Options::default()
    };
    let e = transform(&text, &opts).expect_err("over budget");
    assert!(matches!(e, Unsupported::Budget { .. }), "{e}");
}

/// Many points with many registers live at each: the incremental store variants are pruned,
/// so the output stays within a small multiple of the full saves, and a module that would
/// not load again is refused with a budget reason, never an internal error.
#[test]
fn many_points_with_many_live_registers_stay_bounded() {
    let (loops, regs) = (120, 120);
    let mut body = String::new();
    for k in 0..regs {
        body.push_str(&format!("mov.u32 %v{k}, {k};\n"));
    }
    for k in 0..loops {
        body.push_str(&format!(
            "mov.u32 %c, 0;\n$L{k}:\nadd.u32 %v{}, %v{}, 1;\nadd.u32 %c, %c, 1;\nsetp.lt.u32 %p1, %c, 3;\n@%p1 bra $L{k};\n",
            k % regs,
            k % regs
        ));
    }
    body.push_str("mov.u32 %s, 0;\n");
    for k in 0..regs {
        body.push_str(&format!("add.u32 %s, %s, %v{k};\n"));
    }
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 o)\n{{\n\
         .reg .b32 %v<{regs}>, %c, %s;\n.reg .b64 %rd1;\n.reg .pred %p<2>;\n{body}\
         ld.param.u64 %rd1, [o];\nst.global.u32 [%rd1], %s;\nret;\n}}\n"
    );
    let opts = Options {
        max_points: 1000,
        ..Options::default()
    };
    let t = transform(&text, &opts).expect("transforms");
    let lines = t.ptx.lines().count();
    let full = (loops * (regs + 1)) as usize;
    assert!(
        lines < 6 * full,
        "{lines} lines for {full} full-save stores"
    );
    let small = Options {
        load: ptx::LoadOptions {
            max_instructions: 2000,
            ..ptx::LoadOptions::default()
        },
        ..opts
    };
    let e = transform(&text, &small).expect_err("output over the load budget");
    assert!(matches!(e, Unsupported::Budget { .. }), "{e}");
}
