//! Load limits: hostile PTX texts (deep scopes, inlining fan-out, huge variables) are refused
//! with typed errors after bounded work; budgets are module-wide; loading can be cancelled or
//! given a deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ptx::{LoadOptions, PtxError};

const HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// An entry `depth` blocks deep, each block re-declaring `%r0..%r(regs-1)`, with an
/// instruction in the innermost block.
fn deep_scopes(depth: usize, regs: usize) -> String {
    let mut s = format!("{HEAD}.visible .entry k()\n{{\n.reg .b32 %r<{regs}>;\n");
    for _ in 0..depth {
        s.push_str(&format!("{{ .reg .b32 %r<{regs}>;\n"));
    }
    s.push_str("add.u32 %r1, %r1, 1;\n");
    s.push_str(&"}".repeat(depth));
    s.push_str("\nret;\n}\n");
    s
}

/// Functions `f0..f(levels-1)`: each calls the next `fan` times, the last runs `leaf`
/// instructions; `entries` entries each call `f0`.
fn fan_out(fan: usize, levels: usize, leaf: usize, entries: usize) -> String {
    let mut s = HEAD.to_string();
    for k in (0..levels).rev() {
        s.push_str(&format!(".func f{k}\n{{\n"));
        if k == levels - 1 {
            s.push_str(".reg .b32 %r<2>;\n");
            s.push_str(&"add.u32 %r1, %r1, 1;\n".repeat(leaf));
        } else {
            s.push_str(&format!("call f{};\n", k + 1).repeat(fan));
        }
        s.push_str("ret;\n}\n");
    }
    for e in 0..entries {
        s.push_str(&format!(".visible .entry k{e}()\n{{\ncall f0;\nret;\n}}\n"));
    }
    s
}

/// An entry of `n` instructions (plus its `ret`).
fn entry(name: &str, n: usize) -> String {
    format!(
        ".visible .entry {name}()\n{{\n.reg .b32 %r<2>;\n{}ret;\n}}\n",
        "add.u32 %r1, %r1, 1;\n".repeat(n)
    )
}

fn with_instructions(n: usize) -> LoadOptions {
    LoadOptions {
        max_instructions: n,
        ..LoadOptions::default()
    }
}

#[test]
fn deep_scopes_with_many_registers_are_linear_and_bounded() {
    // 2000 blocks x 100 registers: 200k declarations, accepted (the shadowing copy in the
    // innermost block is the one used).
    let m = ptx::parse(&deep_scopes(2000, 100)).expect("200k nested declarations load");
    assert_eq!(m.entry("k").map(|e| e.instructions), Some(3));
    // 2000 x 200: over the module's register budget, refused as soon as it is reached.
    match ptx::parse(&deep_scopes(2000, 200)) {
        Err(PtxError::Budget {
            what: "registers",
            used,
            limit,
        }) => assert_eq!(used, limit + 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn inlining_fan_out_is_refused_by_the_module_instruction_budget() {
    // 4^7 leaf calls of 8 instructions: ~150k instructions per entry, 20 entries.
    let text = fan_out(4, 8, 8, 20);
    assert!(text.len() < 2048, "{} bytes", text.len());
    let limit = LoadOptions::default().max_instructions as u64;
    match ptx::parse(&text) {
        Err(PtxError::Budget {
            what: "instructions",
            used,
            limit: l,
        }) => assert_eq!((used, l), (limit + 1, limit)),
        other => panic!("{other:?}"),
    }
    // Each entry alone is under a larger budget, but the module is not: budgets count all
    // entries together.
    let one = fan_out(4, 8, 8, 1);
    let per_entry = ptx::parse_with(&one, &with_instructions(1 << 20))
        .expect("one entry loads")
        .entry("k0")
        .map(|e| e.instructions)
        .expect("entry k0");
    assert!(per_entry > 100_000, "{per_entry}");
    let two = fan_out(4, 8, 8, 2);
    if let Err(e) = ptx::parse_with(&two, &with_instructions(2 * per_entry)) {
        panic!("two entries under a budget of both: {e}");
    }
    match ptx::parse_with(&two, &with_instructions(2 * per_entry - 1)) {
        Err(PtxError::Budget {
            what: "instructions",
            ..
        }) => {}
        other => panic!("{:?}", other.map(|m| m.host_bytes())),
    }
}

#[test]
fn instruction_budget_is_module_wide() {
    let a = format!("{HEAD}{}", entry("a", 59));
    let b = format!("{HEAD}{}", entry("b", 59));
    let both = format!("{HEAD}{}{}", entry("a", 59), entry("b", 59));
    // 59 + ret + implicit exit = 61 decoded instructions per entry.
    let opts = with_instructions(100);
    for text in [&a, &b] {
        let m = ptx::parse_with(text, &opts).expect("one entry is under the budget");
        assert_eq!(m.entries().map(|e| e.instructions).sum::<usize>(), 61);
    }
    match ptx::parse_with(&both, &opts) {
        Err(PtxError::Budget {
            what: "instructions",
            used: 101,
            limit: 100,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(ptx::parse_with(&both, &with_instructions(122)).is_ok());
}

#[test]
fn inlined_labels_are_bounded_too() {
    // Empty functions called fan-out style add a return label per call and no instruction.
    let mut s = HEAD.to_string();
    for k in (0..8).rev() {
        let body = if k == 7 {
            String::new()
        } else {
            format!("call g{};\n", k + 1).repeat(8)
        };
        s.push_str(&format!(".func g{k}\n{{\n{body}}}\n"));
    }
    s.push_str(".visible .entry k()\n{\ncall g0;\nret;\n}\n");
    match ptx::parse(&s) {
        Err(PtxError::Budget { what: "labels", .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn module_variables_are_charged_as_host_bytes() {
    let text = format!(
        "{HEAD}.global .align 8 .b8 big[16777216];\n.const .u32 c[4] = {{1, 2, 3, 4}};\n{}",
        entry("k", 1)
    );
    let m = ptx::parse(&text).expect("16 MiB of variables load by default");
    // Storage plus initial image.
    assert!(
        m.variable_bytes() >= 2 * (16 << 20),
        "{}",
        m.variable_bytes()
    );
    assert!(m.host_bytes() > m.variable_bytes());
    assert!(m.host_bytes() <= LoadOptions::default().max_host_bytes);
    let copy = m.instantiate();
    assert_eq!(copy.variable_bytes(), m.variable_bytes());
    assert_eq!(copy.host_bytes(), m.host_bytes());
    assert_eq!(
        copy.read_variable("c"),
        Some(vec![1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0])
    );
    // Under a smaller budget the storage is refused before it is allocated.
    let small = LoadOptions {
        max_host_bytes: 8 << 20,
        ..LoadOptions::default()
    };
    match ptx::parse_with(&text, &small) {
        Err(PtxError::Budget {
            what: "host bytes",
            used,
            limit,
        }) => {
            assert_eq!(limit, 8 << 20);
            assert!(used > 32 << 20, "{used}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn host_bytes_grow_with_the_code() {
    let small = ptx::parse(&format!("{HEAD}{}", entry("k", 10))).unwrap();
    let large = ptx::parse(&format!("{HEAD}{}", entry("k", 10_010))).unwrap();
    assert_eq!(small.variable_bytes(), large.variable_bytes());
    // At least an instruction, a source position and a reconvergence point each.
    let per_inst = (large.host_bytes() - small.host_bytes()) / 10_000;
    assert!(
        (16..1024).contains(&per_inst),
        "{per_inst} bytes per instruction"
    );
    // The text's transient structures are bounded by the same budget: a budget a little above
    // what the module keeps is too small to load it.
    let tight = LoadOptions {
        max_host_bytes: large.host_bytes(),
        ..LoadOptions::default()
    };
    assert!(matches!(
        ptx::parse_with(&format!("{HEAD}{}", entry("k", 10_010)), &tight),
        Err(PtxError::Budget {
            what: "host bytes",
            ..
        })
    ));
}

#[test]
fn a_passed_deadline_stops_loading() {
    let past = Instant::now()
        .checked_sub(Duration::from_millis(1))
        .unwrap_or_else(Instant::now);
    let opts = LoadOptions {
        deadline: Some(past),
        ..LoadOptions::default()
    };
    assert_eq!(
        ptx::parse_with(&format!("{HEAD}{}", entry("k", 1)), &opts).err(),
        Some(PtxError::DeadlineExceeded)
    );
    let later = LoadOptions {
        deadline: Some(Instant::now() + Duration::from_secs(3600)),
        ..LoadOptions::default()
    };
    assert!(ptx::parse_with(&format!("{HEAD}{}", entry("k", 1)), &later).is_ok());
}

#[test]
fn a_set_cancel_flag_stops_loading() {
    let flag = Arc::new(AtomicBool::new(true));
    let opts = LoadOptions {
        cancel: Some(flag.clone()),
        ..LoadOptions::default()
    };
    assert_eq!(
        ptx::parse_with(&format!("{HEAD}{}", entry("k", 1)), &opts).err(),
        Some(PtxError::Cancelled)
    );
    flag.store(false, Ordering::Relaxed);
    assert!(ptx::parse_with(&format!("{HEAD}{}", entry("k", 1)), &opts).is_ok());
}

#[test]
fn a_cancel_flag_set_from_another_thread_stops_a_large_parse() {
    // ~3.5M tokens of comment-free text: seconds of lexing, far longer than it takes the
    // other thread to set the flag. Retried a few times so that a scheduler stall of the
    // setter cannot make the test flaky; a load that ignored the flag would never return
    // Cancelled.
    let body = "add.u32 %r1, %r1, 1;\n".repeat(500_000);
    let text = format!("{HEAD}.visible .entry k()\n{{\n.reg .b32 %r<2>;\n{body}ret;\n}}\n");
    let opts_for = |flag: &Arc<AtomicBool>| LoadOptions {
        cancel: Some(flag.clone()),
        max_instructions: 1 << 20,
        max_host_bytes: 1 << 30,
        ..LoadOptions::default()
    };
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let flag = Arc::new(AtomicBool::new(false));
        let opts = opts_for(&flag);
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let setter = {
            let (flag, barrier) = (flag.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                flag.store(true, Ordering::Relaxed);
            })
        };
        barrier.wait();
        let r = ptx::parse_with(&text, &opts);
        setter.join().unwrap();
        match r {
            Err(PtxError::Cancelled) => return,
            other => outcomes.push(other.map(|m| m.host_bytes())),
        }
    }
    panic!("never cancelled: {outcomes:?}");
}

#[test]
fn a_long_malformed_number_is_reported_briefly() {
    // "1e+e+e+…" once cost quadratic time to scan (and its error quoted all of it).
    let text = format!("{HEAD}1{}\n", "e+".repeat(200_000));
    match ptx::parse(&text) {
        Err(e @ PtxError::Syntax { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("bad number `1e+e+"), "{msg}");
            assert!(msg.len() < 200, "{} bytes of message", msg.len());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_suite_kernel_loads_well_within_the_defaults() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../suite/kernels");
    let d = LoadOptions::default();
    let mut n = 0;
    for f in std::fs::read_dir(dir).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_some_and(|e| e == "ptx") {
            let text = std::fs::read_to_string(&path).unwrap();
            let m = ptx::parse(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            let insts: usize = m.entries().map(|e| e.instructions).sum();
            assert!(insts * 10 < d.max_instructions, "{path:?}: {insts}");
            assert!(m.host_bytes() * 10 < d.max_host_bytes, "{path:?}");
            n += 1;
        }
    }
    assert!(n >= 5, "{n} kernels");
}
