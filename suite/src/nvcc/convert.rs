//! convert: float<->int conversions in every rounding mode, saturation, division, mul.hi, wide multiply.

use alloc::vec;
use alloc::vec::Vec;

use crate::{
    Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, f32_bytes, i32_bytes, u32_bytes,
};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "convert",
    include_str!("../../cuda/convert.ptx"),
    "convert",
    "cvt.{rni,rzi,rmi,rpi}.s32.f32, cvt.{rn,rz,rm,rp}.f32.s32, cvt.sat, div, rem, mul.hi, 64-bit multiply",
    build,
);

/// 32-bit words each thread writes.
pub const OUTS: usize = 20;
/// CTA size.
pub const BLOCK: u32 = 64;
/// The NaN NVIDIA GPUs produce from arithmetic (canonical, whatever the operands' NaN).
pub const CANONICAL_NAN: u32 = 0x7fff_ffff;

const SPECIAL_F: [f32; 34] = [
    0.5,
    1.5,
    2.5,
    -0.5,
    -1.5,
    -2.5,
    0.0,
    -0.0,
    1e10,
    -1e10,
    3e9,
    4.5e9,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1.0,
    0.999_999_94,
    1.000_000_1,
    2_147_483_520.0,
    -2_147_483_648.0,
    2_147_483_648.0,
    1e-40,
    -1e-40,
    4_194_304.5,
    0.499_999_97,
    -0.499_999_97,
    4_294_967_040.0,
    4_294_967_296.0,
    -1.0,
    3.5,
    -3.5,
    1e-30,
    9.2e18,
    -9.3e18,
];
const SPECIAL_P: [i32; 16] = [
    0,
    1,
    -1,
    i32::MAX,
    i32::MIN,
    16_777_217,
    -16_777_217,
    16_777_219,
    (1 << 30) + 1,
    -(1 << 30) - 65,
    123_456_789,
    -987_654_321,
    2_147_483_584,
    33_554_435,
    7,
    -7,
];
const SPECIAL_Q: [i32; 12] = [1, -1, 2, -2, 3, 7, -7, 65_536, i32::MAX, i32::MIN, -3, 1000];

/// Integer-to-float rounding direction.
#[derive(Clone, Copy)]
enum Dir {
    Zero,
    Down,
    Up,
}

/// f32 next to `r` (finite, non-zero) in direction `up` of the number line.
fn step(r: f32, up: bool) -> f32 {
    let b = r.to_bits();
    f32::from_bits(if (r > 0.0) == up { b + 1 } else { b - 1 })
}

/// `cvt.r{z,m,p}.f32.s32`: round to nearest first, then step once if it went the wrong way.
fn i2f(p: i32, dir: Dir) -> f32 {
    let r = p as f32;
    let (back, p) = (r as i64, i64::from(p)); // exact: r is an integer within 2^31
    match dir {
        Dir::Zero if back.abs() > p.abs() => step(r, r < 0.0),
        Dir::Down if back > p => step(r, false),
        Dir::Up if back < p => step(r, true),
        _ => r,
    }
}

/// `cvt.sat.f32.f32`: clamp to [+0, 1], NaN and -0 give +0.
fn saturate(x: f32) -> f32 {
    if x.is_nan() || x <= 0.0 {
        0.0
    } else if x >= 1.0 {
        1.0
    } else {
        x
    }
}

/// `cvt.rzi.s64.f32`: saturating like Rust's `as`, except that NaN gives i64::MIN
/// (0x8000000000000000), as measured on an H200 (`cvt.rzi.s32.f32` gives 0 for NaN).
fn f32_to_i64_rz(x: f32) -> i64 {
    if x.is_nan() { i64::MIN } else { x as i64 }
}

fn canon(x: f32) -> u32 {
    if x.is_nan() {
        CANONICAL_NAN
    } else {
        x.to_bits()
    }
}

/// The 20 words one thread writes (see suite/cuda/convert.cu). Float-to-integer conversions
/// saturate and send NaN to 0, which is what Rust's `as` does.
pub fn reference(x: f32, p: i32, q: i32) -> [u32; OUTS] {
    let (pu, qu) = (p as u32, q as u32);
    let wide = (i64::from(p) * i64::from(q)).wrapping_add(f32_to_i64_rz(x)) as u64;
    let a = (i64::from(p) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let h = ((u128::from(a) * u128::from(i64::from(q) as u64)) >> 64) as u64;
    [
        libm::rintf(x) as i32 as u32,
        x as i32 as u32,
        libm::floorf(x) as i32 as u32,
        libm::ceilf(x) as i32 as u32,
        libm::rintf(x) as u32,
        (p as f32).to_bits(),
        i2f(p, Dir::Zero).to_bits(),
        i2f(p, Dir::Down).to_bits(),
        i2f(p, Dir::Up).to_bits(),
        (pu as f32).to_bits(),
        saturate(x).to_bits(),
        canon(x / q as f32),
        ((i64::from(p) * i64::from(q)) >> 32) as u32,
        ((u64::from(pu) * u64::from(qu)) >> 32) as u32,
        wide as u32,
        (wide >> 32) as u32,
        (h ^ (h >> 32)) as u32,
        p.wrapping_div(q) as u32,
        p.wrapping_rem(q) as u32,
        (pu / qu).wrapping_add(pu % qu),
    ]
}

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.80 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.28 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 5;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let n: u32 = size.pick(256, 4096, 1 << 18, 1 << 20);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let (mut f, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n as usize {
        let x = match SPECIAL_F.get(i) {
            Some(&s) => s,
            None => rng.scaled_f32(-20, 33),
        };
        let p = match SPECIAL_P.get(i % 64) {
            Some(&s) => s,
            None if rng.below(2) == 0 => rng.next_u32() as i32,
            None => rng.range_i32(-70_000, 70_000),
        };
        let mut q = match SPECIAL_Q.get(i % 48) {
            Some(&s) => s,
            None if rng.below(2) == 0 => rng.next_u32() as i32,
            None => rng.range_i32(-300, 300),
        };
        if q == 0 || (p == i32::MIN && q == -1) {
            q = 5;
        }
        f.push(x);
        a.push(p);
        b.push(q);
    }
    let out: Vec<u32> = (0..n as usize)
        .flat_map(|i| reference(f[i], a[i], b[i]))
        .collect();
    let grid = n.div_ceil(BLOCK);
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("f", f32_bytes(&f)),
            Buffer::input("a", i32_bytes(&a)),
            Buffer::input("b", i32_bytes(&b)),
            Buffer::exact_out("out", Elem::U32, u32_bytes(&out)),
        ],
        launches: vec![Launch::linear(
            WORKLOAD.entry,
            grid,
            BLOCK,
            vec![
                Param::Buffer(0),
                Param::Buffer(1),
                Param::Buffer(2),
                Param::Buffer(3),
                Param::U32(n),
            ],
        )],
        approx_thread_instrs: u64::from(grid * BLOCK) * 110,
    }
    .repeated(repeat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_modes_by_hand() {
        let r = reference(2.5, 16_777_217, 1);
        assert_eq!(r[0] as i32, 2); // ties to even
        assert_eq!(r[1] as i32, 2);
        assert_eq!(r[2] as i32, 2);
        assert_eq!(r[3] as i32, 3);
        assert_eq!(f32::from_bits(r[5]), 16_777_216.0); // rn: tie to even
        assert_eq!(f32::from_bits(r[6]), 16_777_216.0);
        assert_eq!(f32::from_bits(r[7]), 16_777_216.0);
        assert_eq!(f32::from_bits(r[8]), 16_777_218.0);
        let r = reference(-2.5, -16_777_217, 1);
        assert_eq!(r[0] as i32, -2);
        assert_eq!(r[2] as i32, -3);
        assert_eq!(r[3] as i32, -2);
        assert_eq!(r[4], 0); // negative to unsigned saturates to 0
        assert_eq!(f32::from_bits(r[6]), -16_777_216.0);
        assert_eq!(f32::from_bits(r[7]), -16_777_218.0);
        assert_eq!(f32::from_bits(r[8]), -16_777_216.0);
        let r = reference(f32::NAN, i32::MAX, 3);
        assert_eq!(r[0], 0);
        assert_eq!(r[10], 0);
        assert_eq!(r[11], CANONICAL_NAN);
        assert_eq!(f32::from_bits(r[5]), 2_147_483_648.0);
        assert_eq!(f32::from_bits(r[6]), 2_147_483_520.0);
        assert_eq!(reference(1e10, 0, 1)[0] as i32, i32::MAX);
        assert_eq!(reference(-0.0, 0, 1)[10], 0);
        // NaN to s64 is i64::MIN: the wide product's high word gets its top bit flipped.
        let r = reference(f32::NAN, 3, 5);
        assert_eq!((r[14], r[15]), (15, 0x8000_0000));
    }

    #[test]
    fn integer_ops_by_hand() {
        let r = reference(0.0, -7, 2);
        assert_eq!(r[17] as i32, -3); // truncating division
        assert_eq!(r[18] as i32, -1);
        assert_eq!(r[12] as i32, -1); // high word of -14
        assert_eq!(r[14] as i32, -14);
        assert_eq!(r[15], u32::MAX);
        let r = reference(0.0, i32::MIN, -2);
        assert_eq!(r[12], 1); // (-2^31 * -2) >> 32
    }
}
