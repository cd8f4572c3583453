//! nvcc-style PTX exercising control flow and memory features: nested divergence with
//! loops/break/early exit and barriers, local memory through the stack depot, generic
//! addressing, vector accesses, shuffles with segments, shared/global atomics, packing, and
//! 3-D special registers.

mod common;
use common::*;

const HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

fn kern(params: &str, regs: &str, body: &str) -> String {
    format!(
        "{HEAD}\n.visible .entry k(\n{params}\n)\n.maxntid 1024, 1, 1\n{{\n{regs}\n{body}\n}}\n"
    )
}

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
fn local_depot_generic_shared_vectors_and_packing() {
    let text = kern(
        ".param .u64 k_param_0,\n.param .u64 k_param_1",
        ".local .align 16 .b8 __local_depot0[64];\n.reg .b64 %SP;\n.reg .b64 %SPL;\n.reg .pred %p<3>;\n.reg .b32 %r<30>;\n.reg .f32 %f<10>;\n.reg .b64 %rd<20>;\n.shared .align 16 .b8 tile[512];",
        r#"
	mov.u64 	%SPL, __local_depot0;
	cvta.local.u64 	%SP, %SPL;
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	mov.u32 	%r1, %tid.x;
	// local array a[i] = tid * i for i < 16, via generic stores
	mov.u32 	%r2, 0;
$L_fill:
	mul.lo.s32 	%r3, %r1, %r2;
	mul.wide.u32 	%rd3, %r2, 4;
	add.s64 	%rd4, %SP, %rd3;
	st.u32 	[%rd4], %r3;
	add.s32 	%r2, %r2, 1;
	setp.lt.u32 	%p1, %r2, 16;
	@%p1 bra 	$L_fill;
	// read back a[tid % 16] through the local window and a v4 from the depot
	rem.u32 	%r4, %r1, 16;
	mul.wide.u32 	%rd5, %r4, 4;
	add.s64 	%rd6, %SPL, %rd5;
	ld.local.u32 	%r5, [%rd6];
	ld.local.v4.u32 	{%r6, %r7, %r8, %r9}, [%SPL+16];
	add.s32 	%r10, %r6, %r9;
	// generic shared: tile[tid] = tid as f32 via cvta.shared, v2 store of (x, 2x)
	mov.u64 	%rd7, tile;
	cvta.shared.u64 	%rd8, %rd7;
	mul.wide.u32 	%rd9, %r1, 8;
	add.s64 	%rd10, %rd8, %rd9;
	cvt.rn.f32.u32 	%f1, %r1;
	add.f32 	%f2, %f1, %f1;
	st.v2.f32 	[%rd10], {%f1, %f2};
	bar.sync 	0;
	cvta.to.shared.u64 	%rd11, %rd10;
	ld.shared.v2.f32 	{%f3, %f4}, [%rd11];
	add.f32 	%f5, %f3, %f4;
	cvt.rzi.u32.f32 	%r11, %f5;
	// pack/unpack
	mov.b64 	%rd12, {%r5, %r10};
	mov.b64 	{%r12, %r13}, %rd12;
	add.s32 	%r14, %r12, %r11;
	// outputs: out[tid] = {a[tid%16] + 3*tid, a[4]+a[7], hi, ld.global.nc.v4 of input sum}
	mul.wide.u32 	%rd13, %r1, 16;
	add.s64 	%rd14, %rd1, %rd13;
	ld.global.nc.v4.u32 	{%r20, %r21, %r22, %r23}, [%rd14];
	add.s32 	%r24, %r20, %r21;
	add.s32 	%r24, %r24, %r22;
	add.s32 	%r24, %r24, %r23;
	add.s64 	%rd15, %rd2, %rd13;
	st.global.v4.u32 	[%rd15], {%r14, %r13, %r10, %r24};
	ret;
"#,
    );
    let n = 64usize;
    let mut mem = Mem::new(1 << 16);
    let input: Vec<u32> = (0..n as u32 * 4).collect();
    let vin = mem.put_u32(&input);
    let out = mem.alloc(n * 16);
    let m = module(&text);
    assert_eq!(m.entry("k").unwrap().local_bytes_per_thread, 64);
    run(
        &m,
        "k",
        cfg(
            [1, 1, 1],
            [n as u32, 1, 1],
            0,
            Params::default().u64(vin).u64(out),
        ),
        &mem,
        1,
    );
    let got = mem.u32s(out, n * 4);
    for t in 0..n as u32 {
        let a = |i: u32| t * i;
        let row = &got[t as usize * 4..t as usize * 4 + 4];
        assert_eq!(row[0], a(t % 16) + 3 * t, "t={t}");
        assert_eq!(row[1], a(4) + a(7));
        assert_eq!(row[2], a(4) + a(7));
        assert_eq!(row[3], (0..4).map(|k| 4 * t + k).sum::<u32>());
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
fn shared_and_global_atomics() {
    let text = kern(
        ".param .u64 k_param_0",
        ".reg .pred %p<3>;\n.reg .b32 %r<30>;\n.reg .f32 %f<4>;\n.reg .b64 %rd<8>;\n.shared .align 8 .b8 s[64];",
        r#"
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, s;
	setp.ne.s32 	%p1, %r1, 0;
	@%p1 bra 	$L_init_done;
	st.shared.u32 	[%r2], 0;
	st.shared.u32 	[%r2+4], 1000;
	st.shared.u32 	[%r2+8], 0;
	st.shared.u32 	[%r2+12], -1;
	st.shared.u32 	[%r2+16], 0;
	st.shared.u32 	[%r2+20], 0;
	st.shared.u32 	[%r2+24], 50;
	st.shared.u32 	[%r2+28], 0;
$L_init_done:
	bar.sync 	0;
	atom.shared.add.u32 	%r3, [%r2], %r1;
	atom.shared.min.s32 	%r4, [%r2+4], %r1;
	atom.shared.max.u32 	%r5, [%r2+8], %r1;
	atom.shared.and.b32 	%r6, [%r2+12], %r1;
	atom.shared.or.b32 	%r7, [%r2+16], %r1;
	atom.shared.inc.u32 	%r8, [%r2+20], 9;
	atom.shared.dec.u32 	%r9, [%r2+24], 100;
	atom.shared.cas.b32 	%r10, [%r2+28], %r1, 77;
	atom.shared.exch.b32 	%r11, [%r2+32], %r1;
	cvt.rn.f32.u32 	%f1, %r1;
	red.global.add.f32 	[%rd1+64], %f1;
	atom.global.add.f32 	%f2, [%rd1+68], 1.0;
	red.global.add.u64 	[%rd1+72], 3;
	atom.global.exch.b64 	%rd4, [%rd1+80], 5;
	red.global.max.s32 	[%rd1+88], %r1;
	bar.sync 	0;
	@%p1 bra 	$L_end;
	ld.shared.v4.u32 	{%r12, %r13, %r14, %r15}, [%r2];
	ld.shared.v4.u32 	{%r16, %r17, %r18, %r19}, [%r2+16];
	ld.shared.u32 	%r20, [%r2+32];
	st.global.v4.u32 	[%rd1], {%r12, %r13, %r14, %r15};
	st.global.v4.u32 	[%rd1+16], {%r16, %r17, %r18, %r19};
	st.global.u32 	[%rd1+32], %r20;
$L_end:
	ret;
"#,
    );
    let n = 96u32;
    let mut mem = Mem::new(1 << 16);
    let out = mem.put_u32(&[0; 32]);
    let m = module(&text);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [n, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    let g = mem.u32s(out, 32);
    assert_eq!(g[0], (0..n).sum::<u32>());
    assert_eq!(g[1], 0);
    assert_eq!(g[2], n - 1);
    assert_eq!(g[3], 0);
    assert_eq!(g[4], (0..n).fold(0, |a, x| a | x));
    // inc wraps to 0 after reaching 9: 96 increments from 0 -> 96 % 10
    assert_eq!(g[5], n % 10);
    // dec from 50, 96 times with bound 100: 50 -> 0 after 50, then 100, ... -> 100 - 45
    assert_eq!(g[6], 100 - (n - 51));
    assert_eq!(g[7], 77, "only the lane that saw 0 swaps");
    assert!(g[8] < n);
    assert_eq!(f32::from_bits(g[16]), (0..n).sum::<u32>() as f32);
    assert_eq!(f32::from_bits(g[17]), n as f32);
    assert_eq!(mem.u64s(out + 72, 2), vec![3 * u64::from(n), 5]);
    assert_eq!(g[22], n - 1);
}

#[test]
fn special_registers_3d_and_extern_shared_layout() {
    let text = format!(
        "{HEAD}.extern .shared .align 16 .b8 dyn[];\n.shared .align 4 .b8 stat[20];\n{}",
        r#".visible .entry k(.param .u64 k_param_0)
{
	.reg .b32 %r<20>;
	.reg .b64 %rd<6>;
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %tid.y;
	mov.u32 	%r3, %tid.z;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %ntid.y;
	mov.u32 	%r6, %ctaid.x;
	mov.u32 	%r7, %ctaid.y;
	mov.u32 	%r8, %ctaid.z;
	mov.u32 	%r9, %nctaid.x;
	mov.u32 	%r10, %nctaid.y;
	mad.lo.s32 	%r11, %r3, %r5, %r2;
	mad.lo.s32 	%r11, %r11, %r4, %r1;
	mad.lo.s32 	%r12, %r8, %r10, %r7;
	mad.lo.s32 	%r12, %r12, %r9, %r6;
	mov.u32 	%r13, dyn;
	mov.u32 	%r14, stat;
	mul.lo.s32 	%r15, %r12, 24;
	mad.lo.s32 	%r15, %r11, 1000, %r15;
	mul.wide.u32 	%rd2, %r15, 1;
	mul.wide.u32 	%rd3, %r12, 24;
	add.s64 	%rd3, %rd3, %rd1;
	mul.wide.u32 	%rd4, %r11, 4;
	add.s64 	%rd4, %rd4, %rd3;
	shl.b32 	%r16, %r13, 16;
	or.b32 	%r16, %r16, %r14;
	add.s32 	%r17, %r15, %r16;
	st.global.u32 	[%rd4+0], %r17;
	ret;
}
"#
    );
    let m = module(&text);
    let e = m.entry("k").unwrap();
    assert_eq!(e.static_shared_bytes, 20);
    assert_eq!(e.dynamic_shared_align, 16);
    let mut mem = Mem::new(1 << 16);
    let grid = [2u32, 3, 2];
    let block = [2u32, 3, 1];
    let out = mem.put_u32(&vec![0; 12 * 6]);
    run(
        &m,
        "k",
        cfg(grid, block, 64, Params::default().u64(out)),
        &mem,
        2,
    );
    let g = mem.u32s(out, 72);
    for cta in 0..12u32 {
        for t in 0..6u32 {
            let want = t * 1000 + cta * 24 + (32u32 << 16); // dyn at 32 (20 aligned to 16), stat at 0
            assert_eq!(g[(cta * 6 + t) as usize], want, "cta {cta} t {t}");
        }
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

const FUNCS: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func  (.param .b32 func_retval0) _Z6clampfi(
	.param .b32 _Z6clampfi_param_0
)
;
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;

.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<12>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	{ // callseq 0, 0
	.reg .b32 temp_param_reg;
	.param .b32 param0;
	st.param.b32 	[param0+0], %r1;
	.param .b32 retval0;
	call.uni (retval0),
	_Z6clampfi,
	(
	param0
	);
	ld.param.b32 	%r2, [retval0+0];
	} // callseq 0
	and.b32 	%r3, %r1, 1;
	setp.eq.s32 	%p1, %r3, 0;
	mov.u32 	%r4, 1000;
	{ // callseq 1, 0
	.reg .b32 temp_param_reg;
	.param .b32 param0;
	add.s32 	%r5, %r1, 100;
	st.param.b32 	[param0+0], %r5;
	.param .b32 retval0;
	@%p1 call.uni (retval0),
	_Z6clampfi,
	(
	param0
	);
	@%p1 ld.param.b32 	%r4, [retval0+0];
	} // callseq 1
	mul.wide.u32 	%rd2, %r1, 8;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.u32 	[%rd3], %r2;
	st.global.u32 	[%rd3+4], %r4;
	ret;
}

.func  (.param .b32 func_retval0) _Z6clampfi(
	.param .b32 _Z6clampfi_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;

	ld.param.u32 	%r1, [_Z6clampfi_param_0];
	setp.lt.s32 	%p1, %r1, 40;
	@%p1 bra 	$L__BB1_2;
	{ // callseq 2, 0
	.param .b32 param0;
	st.param.b32 	[param0+0], %r1;
	.param .b32 retval0;
	call.uni (retval0), _Z4halfi, (param0);
	ld.param.b32 	%r2, [retval0+0];
	}
	st.param.b32 	[func_retval0+0], %r2;
	ret;
$L__BB1_2:
	mul.lo.s32 	%r3, %r1, 3;
	st.param.b32 	[func_retval0+0], %r3;
	ret;
}

.func  (.param .b32 func_retval0) _Z4halfi(
	.param .b32 _Z4halfi_param_0
)
{
	.reg .b32 	%r<3>;
	ld.param.u32 	%r1, [_Z4halfi_param_0];
	shr.s32 	%r2, %r1, 1;
	st.param.b32 	[func_retval0+0], %r2;
	ret;
}
"#;

#[test]
fn device_functions_are_inlined() {
    let m = module(FUNCS);
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(64 * 8);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [64, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    let f = |x: u32| if x < 40 { x * 3 } else { x >> 1 };
    let g = mem.u32s(out, 128);
    for t in 0..64u32 {
        assert_eq!(g[t as usize * 2], f(t), "t={t}");
        let want = if t % 2 == 0 { f(t + 100) } else { 1000 };
        assert_eq!(g[t as usize * 2 + 1], want, "t={t}");
    }
}

#[test]
fn recursive_and_external_calls_are_rejected() {
    let rec = FUNCS.replace(
        "call.uni (retval0), _Z4halfi, (param0);",
        "call.uni (retval0), _Z6clampfi, (param0);",
    );
    assert!(matches!(
        ptx::parse(&rec),
        Err(ptx::PtxError::TooLarge { .. })
    ));
    let ext = FUNCS.replace(
        "call.uni (retval0), _Z4halfi, (param0);",
        "call.uni (retval0), vprintf, (param0, param0);",
    );
    match ptx::parse(&ext) {
        Err(ptx::PtxError::UnsupportedInstruction { name, .. }) => {
            assert!(name.contains("vprintf"), "{name}")
        }
        other => panic!("{other:?}"),
    }
    let undef = FUNCS.replace("_Z4halfi, (param0);", "nope, (param0);");
    assert!(matches!(
        ptx::parse(&undef),
        Err(ptx::PtxError::Undefined { .. })
    ));
}

const MODVARS: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.const .align 4 .b8 coeffs[16] = {0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64};
.const .align 8 .f64 dtab[2] = {0d3FF8000000000000, -2.5};
.global .align 4 .u32 counter;
.visible .global .align 4 .f32 scale = 0f40000000;

.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .b32 	%r<8>;
	.reg .f32 	%f<6>;
	.reg .f64 	%fd<3>;
	.reg .b64 	%rd<10>;

	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	and.b32 	%r2, %r1, 3;
	mov.u64 	%rd2, coeffs;
	mul.wide.u32 	%rd3, %r2, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.const.f32 	%f1, [%rd4];
	ld.global.f32 	%f2, [scale];
	mul.f32 	%f3, %f1, %f2;
	atom.global.add.u32 	%r3, [counter], 1;
	ld.const.f64 	%fd1, [dtab+8];
	cvt.rzi.s32.f64 	%r4, %fd1;
	mov.u64 	%rd5, scale;
	cvta.global.u64 	%rd6, %rd5;
	ld.f32 	%f4, [%rd6];
	mul.wide.u32 	%rd7, %r1, 16;
	add.s64 	%rd8, %rd1, %rd7;
	st.global.v4.f32 	[%rd8], {%f3, %f4, %f1, %f2};
	ret;
}

.visible .entry bad(
	.param .u64 bad_param_0
)
{
	.reg .b64 	%rd<3>;
	mov.u64 	%rd1, coeffs;
	cvta.const.u64 	%rd2, %rd1;
	st.u32 	[%rd2], 7;
	ret;
}
"#;

#[test]
fn module_variables_with_initializers() {
    let m = module(MODVARS);
    assert_eq!(m.variable("counter").map(|v| v.1), Some(4));
    assert_eq!(m.read_variable("scale"), Some(2f32.to_le_bytes().to_vec()));
    assert_eq!(
        m.read_variable("dtab").unwrap()[8..],
        (-2.5f64).to_le_bytes()
    );
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(64 * 16);
    for launch in 1..=2u32 {
        run(
            &m,
            "k",
            cfg([2, 1, 1], [32, 1, 1], 0, Params::default().u64(out)),
            &mem,
            2,
        );
        assert_eq!(
            m.read_variable("counter"),
            Some((64 * launch).to_le_bytes().to_vec())
        );
    }
    // Both CTAs write slots 0..32 (indexed by %tid.x) with the same values.
    let g = mem.f32s(out, 32 * 4);
    for t in 0..32usize {
        let c = [1.0f32, 2.0, 3.0, 4.0][t % 4];
        assert_eq!(&g[t * 4..t * 4 + 4], &[c * 2.0, 2.0, c, 2.0], "t={t}");
    }
    // Host writes (like cuMemcpyHtoD to a symbol), .const included.
    assert!(m.write_variable("scale", &3f32.to_le_bytes()));
    assert!(m.write_variable("coeffs", &10f32.to_le_bytes()));
    assert!(!m.write_variable("coeffs", &[0; 17]));
    assert!(!m.write_variable("nope", &[0]));
    run(
        &m,
        "k",
        cfg([1, 1, 1], [4, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    assert_eq!(mem.f32s(out, 4), vec![30.0, 3.0, 10.0, 3.0]);
    // A fresh instance has its own variables with the initial values.
    assert!(m.has_variables());
    let inst = std::sync::Arc::new(m.instantiate());
    assert_eq!(inst.hash(), m.hash());
    assert_eq!(inst.read_variable("counter"), Some(vec![0; 4]));
    assert_eq!(
        inst.read_variable("scale"),
        Some(2f32.to_le_bytes().to_vec())
    );
    run(
        &inst,
        "k",
        cfg([1, 1, 1], [4, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    assert_eq!(
        inst.read_variable("counter"),
        Some(4u32.to_le_bytes().to_vec())
    );
    assert_eq!(
        m.read_variable("counter"),
        Some(132u32.to_le_bytes().to_vec())
    );
    assert!(!module(include_str!("../../suite/kernels/vecadd.ptx")).has_variables());
    // Kernels cannot write .const variables.
    let mut l = ptx::Launch::new(
        m.clone(),
        "bad",
        cfg([1, 1, 1], [1, 1, 1], 0, Params::default().u64(0)),
        &ptx::Limits::default(),
    )
    .unwrap();
    match l.run(&mem.mem, &ptx::RunControl::new(1)) {
        ptx::RunOutcome::Faulted(f) => {
            assert_eq!(f.reason, ptx::FaultReason::ReadOnly);
            assert_eq!(f.va, ptx::MODULE_WINDOW);
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn registers_declared_in_nested_blocks_shadow_outer_ones() {
    // nvcc wraps inline-asm style sequences in `{ .reg .pred %p1; ... }`: the inner %p1 must
    // not clobber the outer one.
    let text = kern(
        ".param .u64 k_param_0",
        ".reg .pred %p<3>;\n.reg .b32 %r<4>;\n.reg .b64 %rd<3>;",
        r#"
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	setp.lt.u32 	%p1, %r1, 4;
	{
	.reg .pred 	%p1;
	setp.ge.u32 	%p1, %r1, 4;
	selp.u32 	%r2, 10, 20, %p1;
	}
	selp.u32 	%r3, 1, 2, %p1;
	add.s32 	%r3, %r3, %r2;
	mul.wide.u32 	%rd2, %r1, 4;
	add.s64 	%rd2, %rd1, %rd2;
	st.global.u32 	[%rd2], %r3;
	ret;
"#,
    );
    let m = module(&text);
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(8 * 4);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [8, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    assert_eq!(mem.u32s(out, 8), vec![21, 21, 21, 21, 12, 12, 12, 12]);
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
