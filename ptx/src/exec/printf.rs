//! Device `printf` (`vprintf(format, args)`): C conversions over the argument buffer nvcc
//! builds (each argument at its size's alignment: `int`-sized conversions 4 bytes; `l`/`ll`/`z`/
//! `j`/`t` integers, `%p`, `%s` and floating point (promoted to double) 8 bytes). The format
//! string and `%s` strings are read through the lane's memory (generic addresses), at most
//! [`MAX_STRING`] bytes each; output is bounded by the launch's buffer ([`PRINTF_BUFFER`]).

use crate::exec::mem::{LaneFault, MemCtx};
use crate::ir::Space;

/// The most `printf` output a launch keeps (CUDA's default printf FIFO is 1 MiB).
pub const PRINTF_BUFFER: usize = 1 << 20;
/// The longest format or `%s` string read.
const MAX_STRING: usize = 4096;
/// The most conversions one call formats.
const MAX_ARGS: u32 = 64;

/// Reads a NUL-terminated string at generic address `a` (at most [`MAX_STRING`] bytes).
fn read_string(mc: &mut MemCtx, a: u64) -> Result<Vec<u8>, LaneFault> {
    let mut out = Vec::new();
    for k in 0..MAX_STRING as u64 {
        let b = mc.load(Space::Generic, a.wrapping_add(k), 1)? as u8;
        if b == 0 {
            break;
        }
        out.push(b);
    }
    Ok(out)
}

struct Spec {
    left: bool,
    plus: bool,
    space: bool,
    alt: bool,
    zero: bool,
    width: usize,
    prec: Option<usize>,
}

/// Formats one call: the text, and the number of arguments consumed (`printf`'s return value).
pub(crate) fn format(mc: &mut MemCtx, fmt: u64, args: u64) -> Result<(Vec<u8>, u32), LaneFault> {
    let f = read_string(mc, fmt)?;
    let mut out = Vec::new();
    let mut off = 0u64;
    let mut nargs = 0u32;
    let mut i = 0;
    while i < f.len() {
        if f[i] != b'%' {
            out.push(f[i]);
            i += 1;
            continue;
        }
        i += 1;
        let mut s = Spec {
            left: false,
            plus: false,
            space: false,
            alt: false,
            zero: false,
            width: 0,
            prec: None,
        };
        while let Some(&c) = f.get(i) {
            match c {
                b'-' => s.left = true,
                b'+' => s.plus = true,
                b' ' => s.space = true,
                b'#' => s.alt = true,
                b'0' => s.zero = true,
                _ => break,
            }
            i += 1;
        }
        let number = |i: &mut usize| {
            let mut v = 0usize;
            while let Some(d) = f.get(*i).filter(|c| c.is_ascii_digit()) {
                v = (v * 10 + usize::from(d - b'0')).min(MAX_STRING);
                *i += 1;
            }
            v
        };
        s.width = number(&mut i);
        if f.get(i) == Some(&b'.') {
            i += 1;
            s.prec = Some(number(&mut i));
        }
        let mut long = false;
        while let Some(&c) = f.get(i) {
            match c {
                b'l' | b'z' | b'j' | b't' | b'L' | b'q' => long = true,
                b'h' => {}
                _ => break,
            }
            i += 1;
        }
        let Some(&conv) = f.get(i) else { break };
        i += 1;
        if conv == b'%' {
            out.push(b'%');
            continue;
        }
        if nargs == MAX_ARGS {
            break;
        }
        let size = match conv {
            b'd' | b'i' | b'u' | b'x' | b'X' | b'o' | b'c' if !long => 4,
            b'd' | b'i' | b'u' | b'x' | b'X' | b'o' | b'c' | b'p' | b's' => 8,
            b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A' => 8,
            // An unknown conversion ends the formatting, as the runtime does.
            _ => break,
        };
        off = off.div_ceil(size) * size;
        let raw = mc.load(Space::Generic, args.wrapping_add(off), size)?;
        off += size;
        nargs += 1;
        let (sign, body, numeric) = match conv {
            b'd' | b'i' => {
                let v = if size == 4 {
                    i64::from(raw as u32 as i32)
                } else {
                    raw as i64
                };
                let digits = v.unsigned_abs().to_string();
                (neg_sign(v < 0, &s), int_prec(digits, &s), true)
            }
            b'u' => (String::new(), int_prec(raw.to_string(), &s), true),
            b'x' | b'p' => {
                let p = if (s.alt && raw != 0) || conv == b'p' {
                    "0x"
                } else {
                    ""
                };
                (
                    p.to_string(),
                    int_prec(format!("{raw:x}"), &s),
                    conv == b'x',
                )
            }
            b'X' => (
                if s.alt && raw != 0 { "0X" } else { "" }.to_string(),
                int_prec(format!("{raw:X}"), &s),
                true,
            ),
            b'o' => (
                String::new(),
                int_prec(format!("{}{raw:o}", if s.alt { "0" } else { "" }), &s),
                true,
            ),
            b'c' => (String::new(), char::from(raw as u8).to_string(), false),
            b's' => {
                let text = if raw == 0 {
                    b"(null)".to_vec()
                } else {
                    read_string(mc, raw)?
                };
                let n = s.prec.unwrap_or(text.len()).min(text.len());
                (
                    String::new(),
                    String::from_utf8_lossy(&text[..n]).into_owned(),
                    false,
                )
            }
            _ => {
                let v = f64::from_bits(raw);
                let body = float(v.abs(), conv, &s);
                (
                    neg_sign(v.is_sign_negative() && !v.is_nan(), &s),
                    body,
                    v.is_finite(),
                )
            }
        };
        // `0` pads numbers, but not integers with a precision.
        let zero_ok = numeric && (s.prec.is_none() || b"fFeEgGaA".contains(&conv));
        pad(&mut out, &sign, &body, &s, zero_ok);
    }
    Ok((out, nargs))
}

fn neg_sign(neg: bool, s: &Spec) -> String {
    match (neg, s.plus, s.space) {
        (true, _, _) => "-",
        (false, true, _) => "+",
        (false, false, true) => " ",
        _ => "",
    }
    .to_string()
}

/// An integer's digits with the precision's minimum digit count.
fn int_prec(digits: String, s: &Spec) -> String {
    match s.prec {
        Some(0) if digits == "0" => String::new(),
        Some(p) if digits.len() < p => format!("{}{digits}", "0".repeat(p - digits.len())),
        _ => digits,
    }
}

/// `%f %e %g %a` of a non-negative value (the sign is added by the caller).
fn float(v: f64, conv: u8, s: &Spec) -> String {
    let upper = conv.is_ascii_uppercase();
    let text = if v.is_nan() {
        "nan".to_string()
    } else if v.is_infinite() {
        "inf".to_string()
    } else {
        let p = s.prec.unwrap_or(6).min(MAX_STRING);
        match conv.to_ascii_lowercase() {
            b'f' => format!("{v:.p$}"),
            b'e' => c_exp(v, p),
            b'a' => format!("{v:e}"),
            _ => {
                let p = p.max(1);
                let exp = exponent(v, p - 1);
                let mut t = if exp < -4 || exp >= p as i32 {
                    c_exp(v, p - 1)
                } else {
                    format!("{v:.*}", (p as i32 - 1 - exp).max(0) as usize)
                };
                if !s.alt {
                    t = strip_zeros(&t);
                }
                t
            }
        }
    };
    if upper {
        text.to_ascii_uppercase()
    } else {
        text
    }
}

/// The decimal exponent of `v` once rounded to `p` digits after the point.
fn exponent(v: f64, p: usize) -> i32 {
    let e = format!("{v:.p$e}");
    e.rsplit('e')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

/// C's `%e`: mantissa, `e`, sign and at least two exponent digits.
fn c_exp(v: f64, p: usize) -> String {
    let e = format!("{v:.p$e}");
    let (m, x) = e.split_once('e').unwrap_or((&e, "0"));
    let x: i32 = x.parse().unwrap_or(0);
    format!(
        "{m}e{}{:02}",
        if x < 0 { '-' } else { '+' },
        x.unsigned_abs()
    )
}

/// `%g` without `#`: trailing zeros of the fraction (and a bare point) removed.
fn strip_zeros(t: &str) -> String {
    let (m, e) = match t.find('e') {
        Some(k) => (&t[..k], &t[k..]),
        None => (t, ""),
    };
    let m = if m.contains('.') {
        m.trim_end_matches('0').trim_end_matches('.')
    } else {
        m
    };
    format!("{m}{e}")
}

fn pad(out: &mut Vec<u8>, sign: &str, body: &str, s: &Spec, zero_ok: bool) {
    let len = sign.len() + body.len();
    let fill = s.width.saturating_sub(len);
    if s.left {
        out.extend_from_slice(sign.as_bytes());
        out.extend_from_slice(body.as_bytes());
        out.extend(std::iter::repeat_n(b' ', fill));
    } else if s.zero && zero_ok {
        out.extend_from_slice(sign.as_bytes());
        out.extend(std::iter::repeat_n(b'0', fill));
        out.extend_from_slice(body.as_bytes());
    } else {
        out.extend(std::iter::repeat_n(b' ', fill));
        out.extend_from_slice(sign.as_bytes());
        out.extend_from_slice(body.as_bytes());
    }
}
