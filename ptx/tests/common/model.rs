//! Arithmetic models for the property tests: a kernel that runs lines of PTX over one warp on
//! inputs (a, b, c) and stores each result, and `check`, which compares them with Rust models
//! written independently of the interpreter's code; operand strategies and bit views.

use proptest::prelude::*;

use super::*;

#[derive(Clone, Copy)]
pub enum St {
    U32,
    U64,
    F32,
    F64,
    Pred,
}

pub type Model = fn(u64, u64, u64) -> u64;

/// Build a kernel: per lane load a, b, c (u64 slots; 32-bit and f32 views read the low half),
/// run each line, store slot k at out[k * 32 + lane].
pub fn kernel(slots: &[(&str, St, Model)]) -> String {
    let mut body = String::new();
    for (k, (line, st, _)) in slots.iter().enumerate() {
        let off = k * 256;
        body.push_str(line);
        body.push('\n');
        body.push_str(&match st {
            St::U32 => format!("st.global.u32 [%rd5+{off}], %d32;\n"),
            St::U64 => format!("st.global.u64 [%rd5+{off}], %d64;\n"),
            St::F32 => format!("st.global.f32 [%rd5+{off}], %fd;\n"),
            St::F64 => format!("st.global.f64 [%rd5+{off}], %dd;\n"),
            St::Pred => format!("selp.u32 %d32, 1, 0, %p;\nst.global.u32 [%rd5+{off}], %d32;\n"),
        });
    }
    format!(
        r#".version 7.8
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pout)
{{
.reg .b64 %rd<8>;
.reg .b32 %r<4>;
.reg .b32 %a32, %b32, %c32, %d32, %s32;
.reg .b64 %a64, %b64, %c64, %d64;
.reg .f32 %fa, %fb, %fc, %fd;
.reg .f64 %da, %db, %dc, %dd;
.reg .pred %p, %q, %pc;
.reg .b16 %h;
mov.u32 %r1, %tid.x;
mul.wide.u32 %rd1, %r1, 8;
ld.param.u64 %rd2, [pa];
add.s64 %rd2, %rd2, %rd1;
ld.param.u64 %rd3, [pb];
add.s64 %rd3, %rd3, %rd1;
ld.param.u64 %rd4, [pc];
add.s64 %rd4, %rd4, %rd1;
ld.param.u64 %rd5, [pout];
add.s64 %rd5, %rd5, %rd1;
ld.global.u64 %a64, [%rd2];
ld.global.u64 %b64, [%rd3];
ld.global.u64 %c64, [%rd4];
ld.global.u32 %a32, [%rd2];
ld.global.u32 %b32, [%rd3];
ld.global.u32 %c32, [%rd4];
ld.global.f32 %fa, [%rd2];
ld.global.f32 %fb, [%rd3];
ld.global.f32 %fc, [%rd4];
ld.global.f64 %da, [%rd2];
ld.global.f64 %db, [%rd3];
ld.global.f64 %dc, [%rd4];
and.b32 %s32, %c32, 1;
setp.ne.u32 %pc, %s32, 0;
{body}
ret;
}}
"#
    )
}

pub fn check(slots: &[(&str, St, Model)], inputs: &[(u64, u64, u64)]) -> Result<(), TestCaseError> {
    let m = module(&kernel(slots));
    let mut mem = Mem::new(1 << 20);
    let va = mem.put_u64(&inputs.iter().map(|x| x.0).collect::<Vec<_>>());
    let vb = mem.put_u64(&inputs.iter().map(|x| x.1).collect::<Vec<_>>());
    let vc = mem.put_u64(&inputs.iter().map(|x| x.2).collect::<Vec<_>>());
    let out = mem.put_u64(&vec![0; 32 * slots.len()]);
    let p = Params::default().u64(va).u64(vb).u64(vc).u64(out);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [inputs.len() as u32, 1, 1], 0, p),
        &mem,
        1,
    );
    let got = mem.u64s(out, 32 * slots.len());
    for (k, (line, st, model)) in slots.iter().enumerate() {
        for (l, &(a, b, c)) in inputs.iter().enumerate() {
            let want = model(a, b, c);
            let g = got[k * 32 + l];
            let nan_ok = match st {
                St::F32 => {
                    f32::from_bits(want as u32).is_nan() && f32::from_bits(g as u32).is_nan()
                }
                St::F64 => f64::from_bits(want).is_nan() && f64::from_bits(g).is_nan(),
                _ => false,
            };
            prop_assert!(
                nan_ok || g == want,
                "`{}` a={:#x} b={:#x} c={:#x}: got {:#x} want {:#x}",
                line,
                a,
                b,
                c,
                g,
                want
            );
        }
    }
    Ok(())
}

pub fn operand() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..70,
        Just(0u64),
        Just(u64::MAX),
        Just(0x8000_0000),
        Just(0xFFFF_FFFF),
        Just(0x8000_0000_0000_0000),
        (-1000i64..1000).prop_map(|x| x as u64),
        (-1000i32..1000).prop_map(|x| u64::from(x as u32)),
        (-100.0f32..100.0).prop_map(|f| u64::from(f.to_bits())),
        (-1e10f64..1e10).prop_map(f64::to_bits),
        Just(u64::from(f32::NAN.to_bits())),
        Just(u64::from(f32::INFINITY.to_bits())),
        Just(u64::from(2.5f32.to_bits())),
        Just(u64::from((-0.5f32).to_bits())),
        Just(u64::from((-0.0f32).to_bits())),
        // exact midpoints between neighbouring halves (round-to-nearest-even ties)
        (0u16..0x7bff, any::<bool>()).prop_map(|(h, neg)| {
            let mid = ((half_value(h) + half_value(h + 1)) / 2.0) as f32;
            u64::from((if neg { -mid } else { mid }).to_bits())
        }),
        Just(u64::from(1e-40f32.to_bits())),
    ]
}

pub fn warp_inputs() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    prop::collection::vec((operand(), operand(), operand()), 1..=32)
}

pub fn s32(x: u64) -> i32 {
    x as u32 as i32
}
pub fn u32_(x: u64) -> u32 {
    x as u32
}
pub fn f32_(x: u64) -> f32 {
    f32::from_bits(x as u32)
}
pub fn f64_(x: u64) -> f64 {
    f64::from_bits(x)
}
pub fn w32(v: u32) -> u64 {
    u64::from(v)
}
pub fn wf32(v: f32) -> u64 {
    u64::from(v.to_bits())
}

/// Value of a finite half, from its fields (independent of the interpreter's decoder).
pub fn half_value(h: u16) -> f64 {
    let (e, m) = (i32::from(h >> 10 & 0x1f), f64::from(h & 0x3ff));
    let mag = if e == 0 {
        m / 1024.0 * 2f64.powi(-14)
    } else {
        (1.0 + m / 1024.0) * 2f64.powi(e - 15)
    };
    if h & 0x8000 != 0 { -mag } else { mag }
}
