//! Tokenizer for PTX text: identifiers (with dots, `%`, `$`), numbers (decimal, hex, octal,
//! `0f`/`0d` hex floats, decimal floats), strings and punctuation, with `line:col` positions.
//! Comments (`//`, `/* */`) are skipped.

use crate::error::{Pos, PtxError};
use crate::load::{Meter, elems, str_bytes};

/// A token kind.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// Identifier, opcode with modifiers, directive (leading `.`), register (`%r1`) or label.
    Ident(String),
    /// Integer literal (value, had `U` suffix or was written in hex).
    Int(u64),
    /// `0f` literal (f32 bits).
    F32(u32),
    /// `0d` literal or decimal float (f64 bits).
    F64(u64),
    /// String literal.
    Str(String),
    /// One punctuation character.
    Punct(char),
}

/// A token with its position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub pos: Pos,
}

const MAX_TOKENS: usize = 4_000_000;

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || matches!(c, '_' | '$' | '%' | '.')
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%' | '.')
}

/// Estimated host bytes of a token (the vector slot and its string).
pub(crate) fn token_bytes(t: &Token) -> u64 {
    elems::<Token>(1)
        + match &t.tok {
            Tok::Ident(s) | Tok::Str(s) => str_bytes(s),
            _ => 0,
        }
}

/// Split `text` into tokens, charging `meter` for the tokens (they stay charged: the caller
/// frees them with [`token_bytes`] when it drops them).
pub(crate) fn lex(text: &str, meter: &mut Meter) -> Result<Vec<Token>, PtxError> {
    // The character array lives while lexing.
    let char_bytes = elems::<char>(text.len());
    meter.alloc(char_bytes)?;
    let r = lex_chars(text, meter);
    meter.free(char_bytes);
    r
}

fn lex_chars(text: &str, meter: &mut Meter) -> Result<Vec<Token>, PtxError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0usize, 1u32, 1u32);
    let err = |pos: Pos, msg: &str| PtxError::Syntax {
        pos,
        msg: msg.to_string(),
    };
    while i < chars.len() {
        meter.tick()?;
        let c = chars[i];
        let pos = Pos { line, col };
        let start = i;
        if c == '\n' {
            i += 1;
            line = line.saturating_add(1);
            col = 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            col = col.saturating_add(1);
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            meter.ticks((i - start) as u64)?;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'*') {
            i += 2;
            col = col.saturating_add(2);
            loop {
                if i >= chars.len() {
                    return Err(err(pos, "unterminated comment"));
                }
                if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    i += 2;
                    col = col.saturating_add(2);
                    break;
                }
                if chars[i] == '\n' {
                    line = line.saturating_add(1);
                    col = 1;
                } else {
                    col = col.saturating_add(1);
                }
                i += 1;
            }
            meter.ticks((i - start) as u64)?;
            continue;
        }
        let tok = if c == '"' {
            i += 1;
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None | Some('\n') => return Err(err(pos, "unterminated string")),
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some('\\') => {
                        if let Some(n) = chars.get(i + 1) {
                            s.push(*n);
                        }
                        i += 2;
                    }
                    Some(ch) => {
                        s.push(*ch);
                        i += 1;
                    }
                }
            }
            meter.ticks((i - start) as u64)?;
            Tok::Str(s)
        } else if c.is_ascii_digit() {
            // Whether the literal so far has an `x` (hex: `e` is a digit, not an exponent);
            // tracked as it grows so that a long literal costs linear time.
            let mut hex = false;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                hex |= matches!(chars[i], 'x' | 'X');
                // exponent sign of a decimal float
                if !hex
                    && matches!(chars[i], 'e' | 'E')
                    && matches!(chars.get(i + 1), Some('+' | '-'))
                {
                    i += 1;
                }
                i += 1;
            }
            meter.ticks((i - start) as u64)?;
            let s: String = chars[start..i].iter().collect();
            number(&s).ok_or_else(|| {
                let shown: String = s.chars().take(64).collect();
                let more = if s.len() > shown.len() { "…" } else { "" };
                err(pos, &format!("bad number `{shown}{more}`"))
            })?
        } else if is_ident_start(c) {
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            meter.ticks((i - start) as u64)?;
            Tok::Ident(chars[start..i].iter().collect())
        } else if "{}()[];:,<>+-@!|=".contains(c) {
            i += 1;
            Tok::Punct(c)
        } else {
            return Err(err(pos, &format!("unexpected character {c:?}")));
        };
        col = col.saturating_add((i - start) as u32);
        let t = Token { tok, pos };
        meter.alloc(token_bytes(&t))?;
        out.push(t);
        if out.len() > MAX_TOKENS {
            return Err(PtxError::TooLarge {
                pos,
                what: "token count".into(),
            });
        }
    }
    Ok(out)
}

/// Parse a numeric literal.
fn number(s: &str) -> Option<Tok> {
    let lower = s.to_ascii_lowercase();
    if let Some(h) = lower.strip_prefix("0f") {
        if h.len() == 8 {
            return u32::from_str_radix(h, 16).ok().map(Tok::F32);
        }
        return None;
    }
    if let Some(h) = lower.strip_prefix("0d") {
        if h.len() == 16 {
            return u64::from_str_radix(h, 16).ok().map(Tok::F64);
        }
        return None;
    }
    let body = lower.strip_suffix('u').unwrap_or(&lower);
    if let Some(h) = body.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok().map(Tok::Int);
    }
    if let Some(b) = body.strip_prefix("0b") {
        return u64::from_str_radix(b, 2).ok().map(Tok::Int);
    }
    if body.contains('.') || (body.contains('e') && !body.starts_with("0x")) {
        return body.parse::<f64>().ok().map(|f| Tok::F64(f.to_bits()));
    }
    if body.len() > 1 && body.starts_with('0') {
        return u64::from_str_radix(&body[1..], 8).ok().map(Tok::Int);
    }
    body.parse::<u64>().ok().map(Tok::Int)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lex(s: &str) -> Result<Vec<Token>, PtxError> {
        super::lex(s, &mut Meter::new(&crate::LoadOptions::default()))
    }

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn literals() {
        assert_eq!(
            toks("0f3F800000 0d3FF0000000000000 0x10 42U 010 1.5 2e3"),
            vec![
                Tok::F32(0x3F80_0000),
                Tok::F64(1f64.to_bits()),
                Tok::Int(16),
                Tok::Int(42),
                Tok::Int(8),
                Tok::F64(1.5f64.to_bits()),
                Tok::F64(2000f64.to_bits())
            ]
        );
    }

    #[test]
    fn idents_and_positions() {
        let t = lex("// c\n  ld.global.u32 %r1, [%rd2+-4]; /* x\n */ $L__BB0_2:").unwrap();
        assert_eq!(t[0].tok, Tok::Ident("ld.global.u32".into()));
        assert_eq!(t[0].pos, Pos { line: 2, col: 3 });
        assert_eq!(t[1].tok, Tok::Ident("%r1".into()));
        assert!(t.iter().any(|x| x.tok == Tok::Ident("$L__BB0_2".into())));
        assert_eq!(t.last().unwrap().pos.line, 3);
    }

    #[test]
    fn bad_input() {
        assert!(lex("/* open").is_err());
        assert!(lex("\"open").is_err());
        assert!(lex("0fZZ").is_err());
        assert!(lex("#").is_err());
    }
}
