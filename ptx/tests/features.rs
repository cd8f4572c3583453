//! nvcc-style PTX exercising control flow and warp-level features: nested divergence with
//! loops/break/early exit and barriers, shuffles with segments, votes and lane registers, barrier
//! reductions, `redux.sync` and `match.sync` over the active lanes (memory features are in
//! `features_memory.rs`, calls and scoping in `features_scope.rs`).

mod common;
use common::*;

#[test]
fn nested_divergence_loops_break_exit_and_barrier() {
    // out[tid] = sum over i < tid%37 of (i odd ? 3*i : i), breaking once the sum exceeds 200;
    // threads with tid%5 == 4 exit early; the rest meet at a barrier, then add
    // shared[tid^1] (written before the barrier; 0 for exited neighbours).
    let text = kern(
        ".param .u64 k_param_0",
        ".reg .pred %p<6>;\n.reg .b32 %r<20>;\n.reg .b64 %rd<6>;\n.shared .align 4 .b8 sh[4096];",
        r#"
	ld.param.u64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r19, sh;
	shl.b32 	%r15, %r1, 2;
	add.s32 	%r16, %r19, %r15;
	st.shared.u32 	[%r16], 0;
	rem.u32 	%r2, %r1, 37;
	mov.u32 	%r3, 0;
	mov.u32 	%r4, 0;
$L__BB0_1:
	setp.ge.u32 	%p1, %r4, %r2;
	@%p1 bra 	$L__BB0_5;
	and.b32 	%r5, %r4, 1;
	setp.eq.s32 	%p2, %r5, 0;
	@%p2 bra 	$L__BB0_3;
	mul.lo.s32 	%r6, %r4, 3;
	add.s32 	%r3, %r3, %r6;
	bra.uni 	$L__BB0_4;
$L__BB0_3:
	add.s32 	%r3, %r3, %r4;
$L__BB0_4:
	add.s32 	%r4, %r4, 1;
	setp.gt.u32 	%p3, %r3, 200;
	@%p3 bra 	$L__BB0_5;
	bra.uni 	$L__BB0_1;
$L__BB0_5:
	rem.u32 	%r7, %r1, 5;
	setp.eq.s32 	%p4, %r7, 4;
	@%p4 exit;
	st.shared.u32 	[%r16], %r3;
	bar.sync 	0;
	xor.b32 	%r8, %r1, 1;
	shl.b32 	%r9, %r8, 2;
	add.s32 	%r10, %r19, %r9;
	ld.shared.u32 	%r11, [%r10];
	add.s32 	%r12, %r3, %r11;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r12;
	ret;
"#,
    );
    let n = 200u32;
    let mut mem = Mem::new(1 << 16);
    let out = mem.put_u32(&vec![0xdead; n as usize]);
    let m = module(&text);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [n, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    let f = |t: u32| {
        let mut s = 0u32;
        for i in 0..t % 37 {
            s += if i % 2 == 1 { 3 * i } else { i };
            if s > 200 {
                break;
            }
        }
        s
    };
    let got = mem.u32s(out, n as usize);
    for t in 0..n {
        let want = if t % 5 == 4 {
            0xdead
        } else {
            let nb = t ^ 1;
            f(t) + if nb % 5 == 4 || nb >= n { 0 } else { f(nb) }
        };
        assert_eq!(got[t as usize], want, "t={t}");
    }
}

#[test]
fn shuffles_votes_and_lane_registers() {
    let text = kern(
        ".param .u64 k_param_0",
        ".reg .pred %p<4>;\n.reg .b32 %r<30>;\n.reg .b64 %rd<6>;",
        r#"
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %laneid;
	mul.lo.s32 	%r3, %r1, 10;
	// idx within segments of 8: read lane (seg base + 3)
	shfl.sync.idx.b32 	%r4, %r3, 3, 6175, -1;
	// up by 2 with predicate
	shfl.sync.up.b32 	%r5|%p1, %r3, 2, 0, -1;
	selp.u32 	%r6, 1, 0, %p1;
	// down by 5 clamped at 31
	shfl.sync.down.b32 	%r7, %r3, 5, 31, -1;
	// divergent: only odd lanes take ballot/activemask
	and.b32 	%r8, %r2, 1;
	setp.eq.s32 	%p2, %r8, 1;
	mov.u32 	%r9, 0;
	mov.u32 	%r10, 0;
	@!%p2 bra 	$L_even;
	setp.gt.u32 	%p3, %r2, 20;
	vote.sync.ballot.b32 	%r9, %p3, -1;
	activemask.b32 	%r10;
$L_even:
	mov.u32 	%r11, %warpid;
	mov.u32 	%r12, %lanemask_lt;
	popc.b32 	%r13, %r12;
	mul.wide.u32 	%rd2, %r1, 32;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.v4.u32 	[%rd3], {%r4, %r5, %r6, %r7};
	st.global.v4.u32 	[%rd3+16], {%r9, %r10, %r11, %r13};
	ret;
"#,
    );
    let n = 64usize;
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(n * 32);
    let m = module(&text);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [n as u32, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    let got = mem.u32s(out, n * 8);
    for t in 0..n as u32 {
        let lane = t % 32;
        let base = t - lane;
        let r = &got[t as usize * 8..t as usize * 8 + 8];
        assert_eq!(r[0], (base + (lane & !7) + 3) * 10, "idx t={t}");
        let (up, ok) = if lane >= 2 {
            ((t - 2) * 10, 1)
        } else {
            (t * 10, 0)
        };
        assert_eq!((r[1], r[2]), (up, ok), "up t={t}");
        let dn = if lane + 5 <= 31 { t + 5 } else { t };
        assert_eq!(r[3], dn * 10, "down t={t}");
        let odd = lane % 2 == 1;
        let ballot: u32 = (0..32)
            .filter(|l| l % 2 == 1 && *l > 20)
            .map(|l| 1u32 << l)
            .sum();
        assert_eq!(r[4], if odd { ballot } else { 0 }, "ballot t={t}");
        assert_eq!(r[5], if odd { 0xAAAA_AAAA } else { 0 }, "activemask t={t}");
        assert_eq!(r[6], t / 32);
        assert_eq!(r[7], lane);
    }
}

#[test]
fn barrier_reductions() {
    let text = kern(
        ".param .u64 k_param_0,\n.param .u32 k_param_1",
        ".reg .pred %p<5>;\n.reg .b32 %r<10>;\n.reg .b64 %rd<4>;",
        r#"
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u32 	%r5, [k_param_1];
	mov.u32 	%r1, %tid.x;
	rem.u32 	%r2, %r1, %r5;
	setp.eq.s32 	%p1, %r2, 0;
	bar.red.popc.u32 	%r3, 0, %p1;
	bar.red.and.pred 	%p2, 0, %p1;
	barrier.sync.aligned 	0;
	bar.red.or.pred 	%p3, 0, %p1;
	selp.u32 	%r6, 1, 0, %p2;
	selp.u32 	%r7, 1, 0, %p3;
	mul.wide.u32 	%rd2, %r1, 12;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.u32 	[%rd3], %r3;
	st.global.u32 	[%rd3+4], %r6;
	st.global.u32 	[%rd3+8], %r7;
	ret;
"#,
    );
    let m = module(&text);
    for (n, k) in [(100u32, 3u32), (64, 1), (70, 1000)] {
        let mut mem = Mem::new(1 << 16);
        let out = mem.alloc(n as usize * 12);
        run(
            &m,
            "k",
            cfg([2, 1, 1], [n, 1, 1], 0, Params::default().u64(out).u32(k)),
            &mem,
            1,
        );
        let count = (0..n).filter(|t| t % k == 0).count() as u32;
        let g = mem.u32s(out, n as usize * 3);
        for t in 0..n as usize {
            assert_eq!(g[t * 3], count, "n={n} k={k} t={t}");
            assert_eq!(g[t * 3 + 1], u32::from(count == n));
            assert_eq!(g[t * 3 + 2], u32::from(count > 0));
        }
    }
}

#[test]
fn redux_sync_over_active_lanes() {
    let text = kern(
        ".param .u64 k_param_0",
        ".reg .pred %p<3>;\n.reg .b32 %r<12>;\n.reg .b64 %rd<4>;",
        r#"
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	mul.lo.s32 	%r2, %r1, 7;
	sub.s32 	%r2, 100, %r2;
	mov.u32 	%r3, 0;
	mov.u32 	%r4, 0;
	mov.u32 	%r5, 0;
	mov.u32 	%r6, 0;
	rem.u32 	%r7, %r1, 3;
	setp.eq.s32 	%p1, %r7, 0;
	@%p1 bra 	$L_skip;
	redux.sync.add.s32 	%r3, %r2, -1;
	redux.sync.min.s32 	%r4, %r2, -1;
	redux.sync.max.u32 	%r5, %r2, -1;
	redux.sync.xor.b32 	%r6, %r2, -1;
$L_skip:
	mul.wide.u32 	%rd2, %r1, 16;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.v4.u32 	[%rd3], {%r3, %r4, %r5, %r6};
	ret;
"#,
    );
    let m = module(&text);
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(64 * 16);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [64, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    let g = mem.u32s(out, 64 * 4);
    for t in 0..64u32 {
        let warp = t / 32 * 32..t / 32 * 32 + 32;
        let vals: Vec<i32> = warp
            .filter(|l| l % 3 != 0)
            .map(|l| 100 - 7 * l as i32)
            .collect();
        let row = &g[t as usize * 4..t as usize * 4 + 4];
        if t % 3 == 0 {
            assert_eq!(row, [0, 0, 0, 0]);
            continue;
        }
        assert_eq!(row[0] as i32, vals.iter().sum::<i32>(), "t={t}");
        assert_eq!(row[1] as i32, *vals.iter().min().unwrap());
        assert_eq!(row[2], vals.iter().map(|&v| v as u32).max().unwrap());
        assert_eq!(row[3], vals.iter().fold(0u32, |a, &v| a ^ v as u32));
    }
}

#[test]
fn match_sync_any_and_all() {
    let text = kern(
        ".param .u64 k_param_0",
        ".reg .pred %p<3>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<3>;",
        r#"
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %laneid;
	rem.u32 	%r2, %r1, 3;
	match.any.sync.b32 	%r3, %r2, -1;
	match.all.sync.b32 	%r4|%p1, %r2, -1;
	selp.u32 	%r5, 1, 0, %p1;
	mov.u32 	%r6, 7;
	match.all.sync.b32 	%r7|%p2, %r6, -1;
	mul.wide.u32 	%rd2, %r1, 16;
	add.s64 	%rd2, %rd1, %rd2;
	st.global.v4.u32 	[%rd2], {%r3, %r4, %r5, %r7};
	ret;
"#,
    );
    let m = module(&text);
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(32 * 16);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [32, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    let g = mem.u32s(out, 32 * 4);
    for l in 0..32u32 {
        let same: u32 = (0..32).filter(|k| k % 3 == l % 3).map(|k| 1u32 << k).sum();
        assert_eq!(
            &g[l as usize * 4..l as usize * 4 + 4],
            &[same, 0, 0, u32::MAX],
            "lane {l}"
        );
    }
}
