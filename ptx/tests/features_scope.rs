//! nvcc-style PTX exercising calls and scoping: device functions inlined, recursive and
//! external calls rejected, registers declared in nested blocks shadowing outer ones.

mod common;
use common::*;

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
    // vprintf and __assertfail are built in (nvcc_probes_misc.rs); other externals are not.
    let ext = FUNCS.replace("vprintf", "ext_fn").replace(
        "call.uni (retval0), _Z4halfi, (param0);",
        "call.uni (retval0), ext_fn, (param0, param0);",
    );
    match ptx::parse(&ext) {
        Err(ptx::PtxError::UnsupportedInstruction { name, .. }) => {
            assert!(name.contains("ext_fn"), "{name}")
        }
        other => panic!("{other:?}"),
    }
    let undef = FUNCS.replace("_Z4halfi, (param0);", "nope, (param0);");
    assert!(matches!(
        ptx::parse(&undef),
        Err(ptx::PtxError::Undefined { .. })
    ));
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
