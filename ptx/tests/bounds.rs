//! Write-set validation (`ptx::ckpt::bounds`) on the interpreter: every suite kernel, checked
//! against the extents of its real buffers, computes the same bytes as the original and never
//! raises the flag; kernels that store outside their buffer on purpose (below it, past its end,
//! through an atomic, under a guard) raise it and still store.

mod ckpt_support;

use std::sync::Arc;

use ckpt_support::{buffers, check, place, run_plain};
use ptx::ckpt::bounds::{Checked, transform};
use ptx::{FlatMemory, Launch, LaunchConfig, Limits, LoadOptions, RunControl, RunOutcome};

fn flag(mem: &FlatMemory, at: u64) -> u32 {
    let b = mem.read(at, 4).expect("flag in memory");
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Runs `entry` of `checked` once with the guest `params`, extents `ranges`, flag at `at`.
fn run(
    checked: &Checked,
    entry: &str,
    mem: &FlatMemory,
    own: &[u8],
    ranges: &[(u64, u64)],
    at: u64,
    (grid, block, shared): ([u32; 3], [u32; 3], u32),
) {
    let module = Arc::new(ptx::parse(&checked.ptx).expect("checked text parses"));
    let e = checked.entry(entry).expect("entry is checked");
    let cfg = LaunchConfig {
        grid,
        block,
        dynamic_shared: shared,
        params: e.buffer(own, at, ranges),
    };
    let mut l = Launch::new(module, entry, cfg, &Limits::default()).expect("launch");
    match l.run(mem, &RunControl::new(1)) {
        RunOutcome::Completed(_) => {}
        other => panic!("{entry}: {other:?}"),
    }
}

#[test]
fn suite_kernels_checked_against_their_buffers_never_flag() {
    let mut checked_stores = 0;
    for w in suite::all() {
        let inst = w.instance(suite::Size::Small);
        let (orig, _) = run_plain(&inst, w.ptx, 1);
        let t =
            transform(w.ptx, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        let p = place(&inst, 256);
        let at = p.free;
        for l in &inst.launches {
            let e = t
                .entry(l.entry)
                .unwrap_or_else(|| panic!("{}: {} not checked (unbounded?)", w.name, l.entry));
            checked_stores += e.checked;
            let offs = suite::param_offsets(&l.params);
            let ranges: Vec<(u64, u64)> = e
                .params
                .iter()
                .map(|o| {
                    let i = offs.iter().position(|x| x == o).expect("a parameter");
                    match l.params[i] {
                        suite::Param::Buffer(b) => {
                            let a = p.addrs[b];
                            (a, a + inst.buffers[b].init.len() as u64)
                        }
                        ref other => panic!("{}: stores through {other:?}", w.name),
                    }
                })
                .collect();
            let own = suite::layout_params(&l.params, &p.addrs).expect("params");
            run(
                &t,
                l.entry,
                &p.mem,
                &own,
                &ranges,
                at,
                (l.grid, l.block, l.shared_bytes),
            );
            assert_eq!(flag(&p.mem, at), 0, "{}: {} flagged", w.name, l.entry);
        }
        let outs = buffers(&inst, &p);
        check(&inst, &outs).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        // `spin` counts iterations against a clock: its bytes differ run to run.
        if w.name != "spin" {
            assert_eq!(outs, orig, "{}: bytes differ from the original", w.name);
        }
    }
    assert!(checked_stores > 20, "{checked_stores} stores checked");
}

const PLANTED: &str = r#".version 7.0
.target sm_70
.address_size 64
.visible .entry k(.param .u64 src, .param .u64 dst, .param .u32 mode)
{
    .reg .b64 %rd<8>;
    .reg .b32 %r<8>;
    .reg .pred %p<4>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    ld.param.u32 %r1, [mode];
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r3, [%rd1];
    st.global.u32 [%rd4], %r3;
    setp.eq.u32 %p1, %r1, 1;
    @%p1 st.global.u32 [%rd2+-4], 7;
    setp.eq.u32 %p2, %r1, 2;
    @%p2 st.global.u32 [%rd4+256], 9;
    setp.eq.u32 %p3, %r1, 3;
    @%p3 atom.global.add.u32 %r4, [%rd2+-8], 1;
    @!%p3 red.global.add.u32 [%rd2+192], 1;
    ret;
}
"#;

/// The planted kernel's own parameters: `src`, `dst`, `mode`.
fn planted_params(src: u64, dst: u64, mode: u32) -> Vec<u8> {
    let mut own = Vec::new();
    own.extend_from_slice(&src.to_le_bytes());
    own.extend_from_slice(&dst.to_le_bytes());
    own.extend_from_slice(&mode.to_le_bytes());
    own
}

/// dst is 256 bytes at BASE + 4096 (32 threads store 4 bytes each); src a page below.
fn planted(mode: u32) -> (FlatMemory, u32, Vec<u8>) {
    let t = transform(PLANTED, &LoadOptions::default()).expect("transforms");
    let e = t.entry("k").expect("checked");
    assert_eq!(e.params, vec![8], "dst is the only write-set parameter");
    assert_eq!(e.checked, 5);
    let base = 0x10_0000u64;
    let mem = FlatMemory::new(base, 3 * 4096);
    let (src, dst, at) = (base, base + 4096, base + 2 * 4096);
    assert!(mem.write(src, &5u32.to_le_bytes()));
    let own = planted_params(src, dst, mode);
    run(
        &t,
        "k",
        &mem,
        &own,
        &[(dst, dst + 256)],
        at,
        ([1, 1, 1], [32, 1, 1], 0),
    );
    let f = flag(&mem, at);
    let around = mem.read(dst - 8, 8 + 264).expect("in memory");
    (mem, f, around)
}

#[test]
fn stores_inside_the_extent_do_not_flag() {
    let (_, f, b) = planted(0);
    assert_eq!(f, 0);
    // 32 words of 5, and the red.add of every thread on word 48.
    let word = |i: usize| u32::from_le_bytes(b[8 + 4 * i..12 + 4 * i].try_into().unwrap());
    assert_eq!(word(0), 5);
    assert_eq!(word(31), 5);
    assert_eq!(word(48), 32);
}

#[test]
fn a_store_below_the_buffer_flags_and_still_happens() {
    let (_, f, b) = planted(1);
    assert_eq!(f, 1);
    assert_eq!(&b[4..8], &7u32.to_le_bytes());
}

#[test]
fn a_store_past_the_end_flags_and_still_happens() {
    let (_, f, b) = planted(2);
    assert_eq!(f, 1);
    // Thread 0 stored 9 at dst + 256.
    assert_eq!(&b[8 + 256..8 + 260], &9u32.to_le_bytes());
}

#[test]
fn an_atomic_outside_flags_and_still_happens() {
    let (_, f, b) = planted(3);
    assert_eq!(f, 1);
    assert_eq!(&b[0..4], &32u32.to_le_bytes());
}

#[test]
fn a_zero_flag_address_stores_no_flag_and_the_kernel_still_stores() {
    // A suspended run resumed by an engine without this run's flag word gets 0 there (vgpu's
    // write sets): the outside stores happen, and nothing is stored at address 0 (which this
    // memory does not hold: a store there would fault the run).
    let t = transform(PLANTED, &LoadOptions::default()).expect("transforms");
    let e = t.entry("k").expect("checked");
    assert_eq!(
        ptx::ckpt::bounds::flag_offset(&t.ptx, "k"),
        Some(e.flag_off),
        "the flag parameter is found in the checked text"
    );
    assert_eq!(ptx::ckpt::bounds::flag_offset(PLANTED, "k"), None);
    let base = 0x10_0000u64;
    let mem = FlatMemory::new(base, 2 * 4096);
    let (src, dst) = (base, base + 4096);
    assert!(mem.write(src, &5u32.to_le_bytes()));
    let own = planted_params(src, dst, 1);
    run(
        &t,
        "k",
        &mem,
        &own,
        &[(dst, dst + 256)],
        0,
        ([1, 1, 1], [32, 1, 1], 0),
    );
    assert_eq!(mem.read(dst - 4, 4).unwrap(), 7u32.to_le_bytes());
    assert_eq!(mem.read(dst, 4).unwrap(), 5u32.to_le_bytes());
}

#[test]
fn unbounded_kernels_are_left_unchecked_and_reserved_names_refused() {
    let chase = r#".version 7.0
.target sm_70
.address_size 64
.visible .entry c(.param .u64 a)
{
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [a];
    ld.global.u64 %rd2, [%rd1];
    st.global.u32 [%rd2], 1;
    ret;
}
"#;
    let t = transform(chase, &LoadOptions::default()).expect("transforms");
    assert!(t.entry("c").is_none());
    let reserved = PLANTED.replace(
        ".reg .pred %p<4>;",
        ".reg .pred %p<4>;\n    .reg .b64 %__ws_a;",
    );
    assert!(transform(&reserved, &LoadOptions::default()).is_err());
    assert!(transform("not ptx", &LoadOptions::default()).is_err());
}

/// A checked twin stays preemptible where its original is, and no preemption point stands
/// where the flag's address is in a register (between its load and the flag store): a saved
/// run never carries the address of the engine that ran it.
#[test]
fn checkpointed_twins_keep_their_points_and_never_save_the_flag_address() {
    let opts = ptx::ckpt::Options {
        max_gap: 2,
        ..ptx::ckpt::Options::default()
    };
    let (mut twin_points, mut orig_points) = (0, 0);
    for w in suite::all() {
        let t =
            transform(w.ptx, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        let (Ok(orig), Ok(ck)) = (
            ptx::ckpt::transform(w.ptx, &opts),
            ptx::ckpt::transform(&t.ptx, &opts),
        ) else {
            continue;
        };
        let lines: Vec<&str> = t.ptx.lines().collect();
        for e in &ck.entries {
            for p in &e.points {
                let at = lines[p.line as usize - 1];
                // Before the flag's load is fine (the register is dead there); before a use
                // of it is not.
                let f = ptx::ckpt::bounds::FLAG_REG;
                assert!(
                    !at.contains(f) || at.trim().starts_with(&format!("ld.param.u64 {f},")),
                    "{}: point {} before `{at}`",
                    w.name,
                    p.id
                );
            }
            let o = orig.entry(&e.name).expect("same entries");
            let loops = |v: &[ptx::ckpt::Point]| {
                v.iter()
                    .filter(|p| p.kind == ptx::ckpt::PointKind::Loop)
                    .count()
            };
            twin_points += loops(&e.points);
            orig_points += loops(&o.points);
        }
    }
    assert!(orig_points > 0);
    assert!(
        twin_points >= orig_points,
        "twins {twin_points} loop points, originals {orig_points}"
    );
}

/// A twin stopped by the interpreter at any instruction — between the flag's load and its
/// store too: one warp, every warp-instruction boundary — and re-pointed at flag 0
/// (`Launch::patch_param_u64`: the parameter and the registers of started threads that hold
/// it) completes without storing at the old flag address, which this memory does not hold;
/// the outside store still happens.
#[test]
fn a_twin_stopped_anywhere_and_re_pointed_at_no_flag_completes() {
    let t = transform(PLANTED, &LoadOptions::default()).expect("transforms");
    let e = t.entry("k").expect("checked");
    let module = Arc::new(ptx::parse(&t.ptx).expect("parses"));
    let base = 0x10_0000u64;
    let (src, dst) = (base, base + 4096);
    let own = planted_params(src, dst, 1);
    // The first engine's flag word, in its memory (a third page) and not in the memory the
    // run resumes in.
    let gone = base + 2 * 4096;
    let mut stops = 0;
    for steps in 1..200u64 {
        let first = FlatMemory::new(base, 3 * 4096);
        assert!(first.write(src, &5u32.to_le_bytes()));
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dynamic_shared: 0,
            params: e.buffer(&own, gone, &[(dst, dst + 256)]),
        };
        let mut l = Launch::new(module.clone(), "k", cfg, &Limits::default()).expect("launch");
        let mut ctl = RunControl::new(1);
        ctl.step_limit = Some(steps);
        match l.run(&first, &ctl) {
            RunOutcome::Preempted(_) => stops += 1,
            RunOutcome::Completed(_) => break,
            RunOutcome::Faulted(f) => panic!("steps {steps}: {f:?}"),
        }
        let mem = FlatMemory::new(base, 2 * 4096);
        assert!(mem.write(base, &first.read(base, 2 * 4096).unwrap()));
        assert!(!l.patch_param_u64(e.param_size as usize, 0), "outside");
        assert!(l.patch_param_u64(e.flag_off as usize, 0));
        match l.run(&mem, &RunControl::new(1)) {
            RunOutcome::Completed(_) => {}
            other => panic!("stopped after {steps} steps, re-pointed: {other:?}"),
        }
        assert_eq!(
            mem.read(dst - 4, 4).unwrap(),
            7u32.to_le_bytes(),
            "steps {steps}"
        );
    }
    assert!(stops > 10, "{stops} stop points");
}
