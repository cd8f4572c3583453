//! nvcc-style PTX exercising memory features: local memory through the stack depot, generic
//! addressing, vector accesses and packing, shared and global atomics, 3-D special registers with
//! the extern shared layout, and module variables with initializers.

mod common;
use common::*;

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
        "{NVCC_HEAD}.extern .shared .align 16 .b8 dyn[];\n.shared .align 4 .b8 stat[20];\n{}",
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
