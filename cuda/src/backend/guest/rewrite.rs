//! Module variables in the process's own memory: the virtual GPU keeps a module's
//! `.global`/`.const` variables where only the module's kernels reach them (and per text,
//! shared by every process of the VM that hands over the same text), while CUDA programs read
//! and write them (`cudaMemcpyToSymbol`, `cuModuleGetGlobal`). So the text is rewritten before
//! it goes to the device: the module-scope variable declarations are removed, every use of a
//! variable's name becomes its address in a VRAM block of the process (`[name+8]` →
//! `[0x…]`), and the `.const` state space of instructions becomes `.global` (the variables now
//! live in global memory). The caller places the initial values there and checks that the
//! rewritten text still parses and declares no variables.

use std::collections::HashMap;

/// Why a text could not be rewritten (the caller falls back to the text as it is).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unsupported(pub &'static str);

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b'$' || c == b'%'
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

/// One piece of the text at module scope.
enum Piece<'a> {
    /// Kept as it is (directives, functions, `.shared` declarations).
    Keep(&'a str),
    /// A `.global`/`.const` variable declaration: dropped.
    Var,
}

/// Splits the text into module-scope statements: up to a `;` at brace depth 0, or through the
/// matching `}` of a function body. Comments are kept inside their piece.
fn pieces(text: &str) -> Result<Vec<Piece<'_>>, Unsupported> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut start, mut depth) = (0, 0, 0u32);
    let mut body = false;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..]
                    .find("*/")
                    .ok_or(Unsupported("unterminated comment"))?;
                i += end + 4;
                continue;
            }
            b'"' => return Err(Unsupported("a string in the module")),
            b'{' => {
                if depth == 0 && !is_var(&text[start..i]) {
                    body = true;
                }
                depth += 1;
            }
            b'}' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or(Unsupported("unbalanced braces"))?;
                if depth == 0 && body {
                    out.push(Piece::Keep(&text[start..=i]));
                    start = i + 1;
                    body = false;
                }
            }
            b'\n'
                if depth == 0
                    && matches!(
                        code_words(&text[start..i]).next(),
                        Some(".version" | ".target" | ".address_size")
                    ) =>
            {
                // Directives that end with their line, not with a `;`.
                out.push(Piece::Keep(&text[start..=i]));
                start = i + 1;
            }
            b';' if depth == 0 => {
                let stmt = &text[start..=i];
                out.push(if is_var(stmt) {
                    Piece::Var
                } else {
                    Piece::Keep(stmt)
                });
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if depth != 0 {
        return Err(Unsupported("unbalanced braces"));
    }
    out.push(Piece::Keep(&text[start..]));
    Ok(out)
}

/// Whether a module-scope statement declares a `.global` or `.const` variable.
fn is_var(stmt: &str) -> bool {
    let mut words = code_words(stmt);
    loop {
        match words.next() {
            Some(".visible" | ".weak" | ".common") => continue,
            Some(".global" | ".const") => return true,
            _ => return false,
        }
    }
}

/// The whitespace-separated words of `s` outside comments.
fn code_words(s: &str) -> impl Iterator<Item = &str> {
    s.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .flat_map(str::split_whitespace)
}

/// Parses an integer literal as PTX writes offsets (decimal or 0x hex).
fn int(s: &str) -> Option<i64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Rewrites one kept piece: names in `addr` become addresses (with a following `+N`/`-N`
/// folded in), `.const` becomes `.global`. Comments are copied unchanged.
fn relocate_piece(s: &str, addr: &HashMap<&str, u64>, out: &mut String) {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = s[i..].find('\n').map_or(b.len(), |e| i + e);
            out.push_str(&s[i..end]);
            i = end;
            continue;
        }
        if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = s[i + 2..].find("*/").map_or(b.len(), |e| i + e + 4);
            out.push_str(&s[i..end]);
            i = end;
            continue;
        }
        if s[i..].starts_with(".const") && !b.get(i + 6).is_some_and(|&c| is_ident(c)) {
            out.push_str(".global");
            i += 6;
            continue;
        }
        if is_ident_start(b[i]) && (i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b'.')) {
            let mut j = i + 1;
            while j < b.len() && is_ident(b[j]) {
                j += 1;
            }
            let name = &s[i..j];
            if let Some(&a) = addr.get(name) {
                // A constant offset after the name is folded into the address.
                let rest = &s[j..];
                let trimmed = rest.trim_start();
                let mut value = a as i64;
                let mut k = j;
                if let Some(sign @ ('+' | '-')) = trimmed.chars().next() {
                    let num = trimmed[1..].trim_start();
                    let len = num
                        .bytes()
                        .take_while(|c| c.is_ascii_alphanumeric())
                        .count();
                    if let Some(v) = int(&num[..len]) {
                        value = if sign == '+' { value + v } else { value - v };
                        k = s.len() - num.len() + len;
                    }
                }
                out.push_str(&format!("{:#x}", value as u64));
                i = k;
                continue;
            }
            out.push_str(name);
            i = j;
            continue;
        }
        let c = s[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
}

/// The text with the variables named in `addr` (name → GPU VA) moved to those addresses.
pub(super) fn relocate(text: &str, addr: &HashMap<&str, u64>) -> Result<String, Unsupported> {
    let mut out = String::with_capacity(text.len());
    for p in pieces(text)? {
        match p {
            Piece::Keep(s) => relocate_piece(s, addr, &mut out),
            Piece::Var => out.push('\n'),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"
.version 7.0
.target sm_80
.address_size 64

// a table
.const .align 4 .b8 coef[16] = {1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0};
.visible .global .align 4 .u32 counter;
.global .align 8 .u64 table[4] = {7, 8, 9, 10};
.shared .align 4 .b8 tile[64];

.visible .entry k(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    ld.const.u32 %r1, [coef+4];
    ld.const.u32 %r2, [coef];
    mov.u64 %rd2, table;
    ld.global.u64 %rd3, [%rd2+8];
    atom.global.add.u32 %r3, [counter], 1;
    cvta.const.u64 %rd4, coef;
    // coef in a comment stays
    add.u32 %r4, %r1, %r2;
    st.global.u32 [%rd1], %r4;
    st.global.u64 [%rd1+8], %rd3;
    ret;
}
"#;

    #[test]
    fn variables_become_addresses_and_the_text_still_parses() {
        let before = ptx::parse(SRC).expect("the source parses");
        assert!(before.has_variables());
        let addr = HashMap::from([
            ("coef", 0x10_0040_0000u64),
            ("counter", 0x10_0040_0100),
            ("table", 0x10_0040_0200),
        ]);
        let out = relocate(SRC, &addr).unwrap();
        let after = ptx::parse(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
        assert!(!after.has_variables(), "{out}");
        assert_eq!(after.entry("k").unwrap().param_size, 8);
        assert!(out.contains("ld.global.u32 %r1, [0x1000400004];"), "{out}");
        assert!(out.contains("ld.global.u32 %r2, [0x1000400000];"), "{out}");
        assert!(out.contains("mov.u64 %rd2, 0x1000400200;"), "{out}");
        assert!(out.contains("[0x1000400100], 1;"), "{out}");
        assert!(out.contains("cvta.global.u64 %rd4, 0x1000400000;"), "{out}");
        assert!(out.contains("// coef in a comment stays"), "{out}");
        assert!(
            out.contains("[%rd2+8]") && out.contains("[%rd1+8]"),
            "{out}"
        );
        assert!(out.contains(".shared .align 4 .b8 tile[64];"), "{out}");
        assert!(!out.contains(".const"), "{out}");
    }

    /// nvcc 13.0's PTX for /tmp/va.cu-style `__constant__ float scale` (compute_80).
    #[test]
    fn nvcc_constant_memory_is_relocated() {
        let src = include_str!("testdata/va_nvcc13.ptx");
        let addr = HashMap::from([("scale", 0x10_0060_0000u64)]);
        let out = relocate(src, &addr).unwrap();
        let m = ptx::parse(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
        assert!(!m.has_variables());
        assert!(
            out.contains("ld.global.f32 \t%f4, [0x1000600000];"),
            "{out}"
        );
        assert_eq!(
            m.entries().map(|e| e.param_size).collect::<Vec<_>>(),
            ptx::parse(src)
                .unwrap()
                .entries()
                .map(|e| e.param_size)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn malformed_texts_are_refused_not_panicked_on() {
        let addr = HashMap::from([("x", 0x1000u64)]);
        for bad in ["{", "}", "/* open", ".global .u32 x = \"s\";"] {
            assert!(relocate(bad, &addr).is_err(), "{bad:?}");
        }
        assert_eq!(relocate("", &addr).unwrap(), "");
        // Offsets that are not numbers are left as they are.
        assert_eq!(
            relocate("mov.u64 %rd1, x+y;", &addr).unwrap(),
            "mov.u64 %rd1, 0x1000+y;"
        );
        assert_eq!(
            relocate("ld.u32 %r1, [x - 16];", &addr).unwrap(),
            "ld.u32 %r1, [0xff0];"
        );
    }
}
