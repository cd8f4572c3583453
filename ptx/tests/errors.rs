//! Hostile inputs: malformed or unsupported PTX, bad launch configurations and faulting
//! kernels give typed errors (with positions) and never panic or hang.

mod common;
use common::*;

use ptx::{Access, FaultReason, Launch, LaunchError, Limits, PtxError, RunControl, RunOutcome};

const HEAD: &str = ".version 7.8\n.target sm_80\n.address_size 64\n";

fn body(b: &str) -> String {
    format!(
        "{HEAD}.visible .entry k(.param .u64 p0, .param .u32 p1)\n{{\n.reg .b32 %r<8>;\n.reg .b64 %rd<8>;\n.reg .pred %p<4>;\n.reg .f32 %f<4>;\n{b}\nret;\n}}\n"
    )
}

/// Iteration multiplier for the randomized tests (`PTX_STRESS=N`, default 1).
fn stress() -> usize {
    std::env::var("PTX_STRESS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn err(text: &str) -> PtxError {
    ptx::parse(text).expect_err("must fail")
}

#[test]
fn unsupported_instruction_names_it_with_position() {
    match err(&body("dp4a.u32.u32 %r1, %r2, %r3, %r4;")) {
        PtxError::UnsupportedInstruction { pos, name } => {
            assert_eq!(name, "dp4a.u32.u32");
            assert_eq!((pos.line, pos.col), (10, 1));
        }
        e => panic!("{e}"),
    }
    for bad in [
        "tex.2d.v4.f32.f32 {%f1,%f2,%f3,%f4}, [%rd1, {%f1,%f2}];",
        "div.rz.f32 %f1, %f2, %f3;",
        "mul.u32 %r1, %r2, %r3;",
        "cvt.rni.f32.s32 %f1, %r1;",
        "cvt.s32.f32 %r1, %f1;",
        "atom.global.add.s64 %rd1, [%rd2], %rd3;",
        "setp.ltu.s32 %p1, %r1, %r2;",
        "shfl.sync.up.b64 %rd1, %rd2, 1, 0, -1;",
        "frobnicate.u32 %r1;",
    ] {
        assert!(
            matches!(err(&body(bad)), PtxError::UnsupportedInstruction { .. }),
            "{bad}"
        );
    }
}

#[test]
fn malformed_text() {
    let cases = [
        body("add.s32 %r1, %r2;"),
        body("add.s32 %r1, %r2, %nope;"),
        body("bra $L_missing;"),
        body("ld.global.u32 %r1, [%rd1;"),
        body("$L: $L: ret;"),
        body("add.s32 %r1, %r2, %p1;"),
        format!("{HEAD}.visible .entry k() {{ ret; "),
        format!("{HEAD}.visible .func f() {{ ret; }} .func f() {{ ret; }}"),
        format!("{HEAD}.visible .entry k() {{ call.uni %rd1, (); }}"),
        format!("{HEAD}.global .u32 g = {{ a }};"),
        format!("{HEAD}.global .u32 g[2] = {{1, 2, 3}};"),
        format!("{HEAD}.extern .global .u32 g;"),
        format!("{HEAD}.const .u32 g; .global .u32 g;"),
        format!("{HEAD}.visible .entry k() {{ .reg .b32 %r<99999999>; }}"),
        format!("{HEAD}.address_size 32"),
        "/* unterminated".to_string(),
        "\u{0}\u{1}".to_string(),
        format!("{HEAD}.visible .entry k() {{}}\n.visible .entry k() {{}}"),
    ];
    for c in &cases {
        let _ = err(c);
    }
}

#[test]
fn garbage_never_panics() {
    let seed = body(
        "ld.param.u64 %rd1, [p0];\nsetp.lt.s32 %p1, %r1, 4;\n@%p1 bra $L1;\nst.global.u32 [%rd1+4], %r1;\n$L1:\nshfl.sync.bfly.b32 %r2|%p2, %r1, 1, 31, -1;",
    );
    assert!(ptx::parse(&seed).is_ok());
    let bytes = seed.as_bytes();
    let mut r = Rng(1234);
    for _ in 0..3000 * stress() {
        let mut b = bytes.to_vec();
        match r.next() % 3 {
            0 => {
                let i = (r.next() % b.len() as u64) as usize;
                b[i] = (r.next() % 128) as u8;
            }
            1 => {
                let i = (r.next() % b.len() as u64) as usize;
                b.truncate(i);
            }
            _ => {
                let i = (r.next() % b.len() as u64) as usize;
                let j = (r.next() % b.len() as u64) as usize;
                let chunk = b[i.min(j)..i.max(j)].to_vec();
                b.splice(i..i, chunk);
            }
        }
        if let Ok(s) = String::from_utf8(b) {
            let _ = ptx::parse(&s);
        }
    }
}

#[test]
fn launch_validation() {
    let m = module(&body(""));
    let lim = Limits::default();
    let good = || cfg([1, 1, 1], [32, 1, 1], 0, Params::default().u64(0).u32(0));
    assert!(Launch::new(m.clone(), "k", good(), &lim).is_ok());
    assert_eq!(
        Launch::new(m.clone(), "nope", good(), &lim).unwrap_err(),
        LaunchError::UnknownEntry("nope".into())
    );
    let mut c = good();
    c.params.pop();
    assert!(matches!(
        Launch::new(m.clone(), "k", c, &lim),
        Err(LaunchError::ParamSize {
            expected: 12,
            got: 11
        })
    ));
    for grid in [[0, 1, 1], [1, 0, 1], [1, 1, 70_000]] {
        let mut c = good();
        c.grid = grid;
        assert_eq!(
            Launch::new(m.clone(), "k", c, &lim).unwrap_err(),
            LaunchError::BadGrid(grid)
        );
    }
    for block in [[0, 1, 1], [1025, 1, 1], [64, 32, 1], [1, 1, 65]] {
        let mut c = good();
        c.block = block;
        assert_eq!(
            Launch::new(m.clone(), "k", c, &lim).unwrap_err(),
            LaunchError::BadBlock(block)
        );
    }
    let mut c = good();
    c.dynamic_shared = u32::MAX;
    assert!(matches!(
        Launch::new(m.clone(), "k", c, &lim),
        Err(LaunchError::SharedTooLarge { .. })
    ));
    let req = module(&format!(
        "{HEAD}.visible .entry r() .reqntid 64, 1, 1 {{ ret; }}"
    ));
    let c = cfg([1, 1, 1], [32, 1, 1], 0, Params::default());
    assert!(matches!(
        Launch::new(req, "r", c, &lim),
        Err(LaunchError::BadBlock(_))
    ));
}

fn fault_of(b: &str, mem: &Mem, p0: u64) -> ptx::KernelFault {
    let m = module(&body(b));
    let c = cfg([2, 1, 1], [64, 1, 1], 0, Params::default().u64(p0).u32(0));
    let mut l = Launch::new(m, "k", c, &Limits::default()).unwrap();
    let f = match l.run(&mem.mem, &RunControl::new(2)) {
        RunOutcome::Faulted(f) => f,
        o => panic!("expected fault: {o:?}"),
    };
    // The launch stays faulted; running again reports the same fault.
    assert_eq!(l.run(&mem.mem, &RunControl::new(1)), RunOutcome::Faulted(f));
    f
}

#[test]
fn faults_are_reported_with_location() {
    let mut mem = Mem::new(1 << 16);
    let buf = mem.alloc(1024);
    let load = "ld.param.u64 %rd1, [p0];\nmov.u32 %r1, %tid.x;\nsetp.eq.s32 %p1, %r1, 37;\n@%p1 ld.global.u32 %r2, [%rd1+4];";
    let f = fault_of(load, &mem, 0x10);
    assert_eq!(f.reason, FaultReason::Unmapped);
    assert_eq!(f.access, Access::Read);
    assert_eq!(f.va, 0x14);
    assert_eq!(f.thread, [37, 0, 0]);
    assert_eq!(f.pos.line, 13);
    assert_eq!(f.pc, 3);
    let f = fault_of(load, &mem, buf + 2);
    assert_eq!(f.reason, FaultReason::Misaligned);
    let f = fault_of(
        "ld.param.u64 %rd1, [p0];\nst.global.u32 [%rd1], %r1;",
        &mem,
        BASE + (1 << 16),
    );
    assert_eq!((f.reason, f.access), (FaultReason::Unmapped, Access::Write));
    let f = fault_of(
        ".shared .b8 s[16];\nmov.u32 %r1, s;\nst.shared.u32 [%r1+16], %r1;",
        &mem,
        0,
    );
    assert_eq!(f.reason, FaultReason::SharedOutOfBounds);
    let f = fault_of("ld.param.u32 %r1, [p1+4];", &mem, 0);
    assert_eq!(f.reason, FaultReason::ParamOutOfBounds);
    let f = fault_of("trap;", &mem, 0);
    assert_eq!(f.reason, FaultReason::Trap);
    let f = fault_of(
        ".local .align 4 .b8 d[8];\nmov.u64 %rd1, d;\nst.local.u32 [%rd1+8], %r1;",
        &mem,
        0,
    );
    assert_eq!(f.reason, FaultReason::LocalOutOfBounds);
    // Read-only mapping.
    let mut ro = Mem::new(1 << 16);
    ro.mem.set_read_only_below(BASE + 4096);
    let f = fault_of(
        "ld.param.u64 %rd1, [p0];\natom.global.add.u32 %r1, [%rd1], 1;",
        &ro,
        BASE + 64,
    );
    assert_eq!(
        (f.reason, f.access),
        (FaultReason::ReadOnly, Access::Atomic)
    );
    // Memory stays usable after faults.
    let m = module(&body("ld.param.u64 %rd1, [p0];\nst.global.u32 [%rd1], 7;"));
    let c = cfg([1, 1, 1], [1, 1, 1], 0, Params::default().u64(buf).u32(0));
    run(&m, "k", c, &mem, 1);
    assert_eq!(mem.u32s(buf, 1), vec![7]);
}

#[test]
fn deep_nesting_and_huge_inputs_are_bounded() {
    let deep = body(&format!(
        "mov.b64 %rd1, {}%r1{};",
        "{".repeat(100_000),
        "}".repeat(100_000)
    ));
    let _ = err(&deep);
    let braces = format!("{HEAD}.visible .entry k() {}", "{".repeat(200_000));
    let _ = err(&braces);
    let many_labels: String = (0..20_000)
        .map(|i| format!("$L{i}: bra $L{i};\n"))
        .collect();
    assert!(ptx::parse(&body(&many_labels)).is_ok());
}

#[test]
fn public_types_are_thread_safe() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ptx::Module>();
    send_sync::<ptx::Launch>();
    send_sync::<ptx::RunControl>();
    send_sync::<ptx::FlatMemory>();
    send_sync::<ptx::PtxError>();
    send_sync::<ptx::KernelFault>();
}

/// An MMU that breaks the alignment contract (host pointer one byte off).
struct SkewedMemory(ptx::FlatMemory);

impl ptx::GlobalMemory for SkewedMemory {
    fn translate(&self, va: u64, access: ptx::Access) -> Result<ptx::HostSpan, ptx::MemFault> {
        let span = self.0.translate(va, access)?;
        if span.len() < 2 {
            return Ok(span);
        }
        // SAFETY: one byte into a valid span is still inside it, for one byte less; the
        // interpreter must refuse the misaligned pointer before using it.
        Ok(unsafe { ptx::HostSpan::new(span.ptr().wrapping_add(1), span.len() - 1) })
    }
}

#[test]
fn misaligned_host_pointers_are_refused() {
    let mem = SkewedMemory(ptx::FlatMemory::new(BASE, 4096));
    let m = module(&body(
        "ld.param.u64 %rd1, [p0];\nld.global.u32 %r1, [%rd1];",
    ));
    let c = cfg([1, 1, 1], [1, 1, 1], 0, Params::default().u64(BASE).u32(0));
    let mut l = Launch::new(m, "k", c, &Limits::default()).unwrap();
    match l.run(&mem, &RunControl::new(1)) {
        RunOutcome::Faulted(f) => assert_eq!(f.reason, FaultReason::Misaligned),
        o => panic!("{o:?}"),
    }
}

/// Shapes that make naive algorithms quadratic: each must parse (or fail) quickly.
#[test]
fn hostile_shapes_parse_in_linear_time() {
    let n = 40_000;
    let t = std::time::Instant::now();
    let ladder: String = (0..n).map(|_| "@%p1 bra $Ls;\n").collect();
    assert!(ptx::parse(&body(&format!("$Ls:\n{ladder}"))).is_ok());
    let params: String = (0..n).map(|i| format!(".param .b32 q{i};\n")).collect();
    assert!(ptx::parse(&body(&params)).is_ok());
    let vars: String = (0..n).map(|i| format!(".global .u32 g{i};\n")).collect();
    assert!(ptx::parse(&format!("{HEAD}{vars}.visible .entry k() {{ ret; }}")).is_ok());
    let shared: String = (0..n / 4)
        .map(|i| format!(".shared .u32 s{i};\n"))
        .collect();
    let entries: String = (0..n / 4)
        .map(|i| format!(".visible .entry k{i}() {{ ret; }}\n"))
        .collect();
    assert!(ptx::parse(&format!("{HEAD}{shared}{entries}")).is_ok());
    assert!(t.elapsed().as_secs() < 60, "took {:?}", t.elapsed());
}

#[test]
fn oversized_cta_state_is_refused() {
    // 40000 live registers x 1024 threads x 8 bytes = 320 MB per CTA.
    let regs: String = (0..40_000)
        .map(|i| format!("mov.u32 %x{i}, {i};\n"))
        .collect();
    let text = format!("{HEAD}.visible .entry k() {{\n.reg .b32 %x<40000>;\n{regs}ret;\n}}\n");
    let m = module(&text);
    let small = cfg([1, 1, 1], [32, 1, 1], 0, Params::default());
    assert!(Launch::new(m.clone(), "k", small, &Limits::default()).is_ok());
    let big = cfg([1, 1, 1], [1024, 1, 1], 0, Params::default());
    assert!(matches!(
        Launch::new(m, "k", big, &Limits::default()),
        Err(LaunchError::CtaStateTooLarge { .. })
    ));
}

#[test]
fn addresses_that_wrap_the_address_space_fault() {
    // The first load fills the TLB; the second one's end wraps past 2^64 and must not be
    // served from that entry.
    let mut mem = Mem::new(1 << 16);
    let buf = mem.alloc(64);
    let f = fault_of(
        "ld.param.u64 %rd1, [p0];\nld.global.u32 %r1, [%rd1];\nmov.u64 %rd2, -4;\nld.global.u32 %r2, [%rd2];",
        &mem,
        buf,
    );
    assert_eq!(f.reason, FaultReason::Unmapped);
    assert_eq!(f.va, u64::MAX - 3);
    let f = fault_of(
        "ld.param.u64 %rd1, [p0];\nst.global.u32 [%rd1], 1;\nmov.u64 %rd2, -8;\nst.global.u64 [%rd2+4], %rd1;",
        &mem,
        buf,
    );
    assert!(matches!(
        f.reason,
        FaultReason::Unmapped | FaultReason::Misaligned
    ));
}
