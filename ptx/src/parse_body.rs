//! Parsing of entry bodies: register declarations, `.shared`/`.local` variables, labels,
//! guarded instructions and their raw operands (registers, immediates, addresses, vectors,
//! predicate pairs).

use std::collections::HashMap;

use crate::decode::{EntryDecls, ROp, RawInst, Stmt};
use crate::error::{Pos, PtxError};
use crate::ir::Ty;
use crate::lexer::Tok;
use crate::parser::{Parser, parse_var};

/// Most registers a `%r<N>` range may declare.
const MAX_RANGE: u64 = 1 << 16;
/// Most registers a whole module may declare.
const MAX_DECLARED: u64 = 1 << 20;

type R<T> = Result<T, PtxError>;

/// Lexical scopes of `{ }` blocks: names re-declared in an inner block get a unique internal
/// name (`name{k}` cannot be written in PTX) for the statements of that block.
struct Scopes {
    stack: Vec<HashMap<String, String>>,
    next: u64,
}

impl Scopes {
    fn resolve(&self, name: &str) -> Option<&String> {
        self.stack.iter().rev().find_map(|m| m.get(name))
    }

    fn rename_op(&self, o: &mut ROp) {
        let fix = |n: &mut String, s: &Scopes| {
            if let Some(r) = s.resolve(n) {
                *n = r.clone();
            }
        };
        match o {
            ROp::Name(n, _) | ROp::Not(n, _) | ROp::SymOff(n, _, _) => fix(n, self),
            ROp::Addr { base: Some(n), .. } => fix(n, self),
            ROp::Pair(a, b, _) => {
                fix(a, self);
                fix(b, self);
            }
            ROp::Vec(v) | ROp::List(v) => v.iter_mut().for_each(|x| self.rename_op(x)),
            _ => {}
        }
    }
}

/// Declare one register, shadowing an outer declaration when inside a nested block.
fn declare(decls: &mut EntryDecls, scopes: &mut Scopes, name: String, ty: Ty) {
    let nested = scopes.stack.len() > 1;
    if nested && (decls.regs.contains_key(&name) || scopes.resolve(&name).is_some()) {
        let unique = format!("{name}{{{}}}", scopes.next);
        scopes.next += 1;
        decls.regs.insert(unique.clone(), ty);
        if let Some(top) = scopes.stack.last_mut() {
            top.insert(name, unique);
        }
    } else if decls.regs.insert(name.clone(), ty).is_some() {
        log::debug!("register {name} redeclared");
    }
}

fn parse_reg_decl(p: &mut Parser, decls: &mut EntryDecls, scopes: &mut Scopes) -> R<()> {
    let pos = p.pos();
    let t = p.ident()?;
    let ty = match t.strip_prefix('.').and_then(Ty::from_name) {
        Some(ty) => ty,
        None => return Err(PtxError::UnsupportedDirective { pos, name: t }),
    };
    loop {
        let npos = p.pos();
        let name = p.ident()?;
        if p.eat_punct('<') {
            let n = p.int()?;
            p.expect_punct('>')?;
            p.declared_regs = p.declared_regs.saturating_add(n);
            if n > MAX_RANGE || p.declared_regs > MAX_DECLARED {
                return Err(PtxError::TooLarge {
                    pos: npos,
                    what: "register declarations".into(),
                });
            }
            for k in 0..n {
                declare(decls, scopes, format!("{name}{k}"), ty);
            }
        } else {
            declare(decls, scopes, name, ty);
        }
        if p.eat_punct(';') {
            return Ok(());
        }
        p.expect_punct(',')?;
    }
}

pub(crate) fn parse_body(p: &mut Parser, decls: &mut EntryDecls) -> R<Vec<Stmt>> {
    p.expect_punct('{')?;
    let mut scopes = Scopes {
        stack: vec![HashMap::new()],
        next: 0,
    };
    let mut depth = 1u32;
    let mut out = Vec::new();
    loop {
        let pos = p.pos();
        match p.next()? {
            Tok::Punct('{') => {
                depth += 1;
                scopes.stack.push(HashMap::new());
            }
            Tok::Punct('}') => {
                depth -= 1;
                scopes.stack.pop();
                if depth == 0 {
                    return Ok(out);
                }
            }
            Tok::Punct('@') => {
                let neg = p.eat_punct('!');
                let gpos = p.pos();
                let g = p.ident()?;
                let g = scopes.resolve(&g).cloned().unwrap_or(g);
                let opcode = p.ident()?;
                known_opcode(&opcode, pos)?;
                let mut ops = parse_operands(p)?;
                ops.iter_mut().for_each(|o| scopes.rename_op(o));
                out.push(Stmt::Inst(RawInst {
                    pos,
                    guard: Some((g, neg, gpos)),
                    opcode,
                    ops,
                }));
            }
            Tok::Ident(s) => match s.as_str() {
                ".reg" => parse_reg_decl(p, decls, &mut scopes)?,
                ".shared" => {
                    let v = parse_var(p, false, pos)?;
                    decls.shared.push(v);
                }
                ".local" => {
                    let v = parse_var(p, false, pos)?;
                    decls.local.push(v);
                }
                ".param" => {
                    // Call-site parameter buffer; scopes of different calls reuse names.
                    let v = parse_var(p, false, pos)?;
                    match decls.call_param_index.get(&v.name) {
                        Some(&k) => {
                            let x = &mut decls.call_params[k];
                            x.size = x.size.max(v.size);
                            x.align = x.align.max(v.align);
                        }
                        None => {
                            decls
                                .call_param_index
                                .insert(v.name.clone(), decls.call_params.len());
                            decls.call_params.push(v);
                        }
                    }
                }
                ".loc" | ".file" => p.skip_line(),
                ".pragma" => {
                    p.next()?;
                    p.expect_punct(';')?;
                }
                _ if s.starts_with('.') => {
                    return Err(PtxError::UnsupportedDirective { pos, name: s });
                }
                _ if p.is_punct(':') => {
                    p.i += 1;
                    out.push(Stmt::Label(s, pos));
                }
                _ => {
                    known_opcode(&s, pos)?;
                    let mut ops = parse_operands(p)?;
                    ops.iter_mut().for_each(|o| scopes.rename_op(o));
                    out.push(Stmt::Inst(RawInst {
                        pos,
                        guard: None,
                        opcode: s,
                        ops,
                    }));
                }
            },
            _ => {
                p.i = p.i.saturating_sub(1);
                return p.err("expected instruction, declaration or label");
            }
        }
    }
}

/// Opcode bases the decoder knows; anything else is reported before its operands are parsed.
const KNOWN: &[&str] = &[
    "mov",
    "add",
    "sub",
    "mul",
    "div",
    "rem",
    "min",
    "max",
    "and",
    "or",
    "xor",
    "shl",
    "shr",
    "copysign",
    "mad",
    "fma",
    "neg",
    "abs",
    "not",
    "cnot",
    "popc",
    "clz",
    "brev",
    "sqrt",
    "rsqrt",
    "rcp",
    "ex2",
    "lg2",
    "sin",
    "cos",
    "bfe",
    "bfi",
    "setp",
    "selp",
    "cvt",
    "cvta",
    "ld",
    "ldu",
    "st",
    "atom",
    "red",
    "bra",
    "bar",
    "barrier",
    "membar",
    "fence",
    "ret",
    "exit",
    "trap",
    "prmt",
    "match",
    "set",
    "addc",
    "subc",
    "madc",
    "testp",
    "bfind",
    "shf",
    "lop3",
    "call",
    "redux",
    "slct",
    "tanh",
    "nanosleep",
    "prefetch",
    "prefetchu",
    "nop",
    "shfl",
    "vote",
    "activemask",
];

fn known_opcode(opcode: &str, pos: Pos) -> R<()> {
    let base = opcode.split('.').next().unwrap_or("");
    if KNOWN.contains(&base) {
        Ok(())
    } else {
        Err(PtxError::UnsupportedInstruction {
            pos,
            name: opcode.chars().take(80).collect(),
        })
    }
}

/// Parse operands up to and including `;`.
fn parse_operands(p: &mut Parser) -> R<Vec<ROp>> {
    let mut ops = Vec::new();
    if p.eat_punct(';') {
        return Ok(ops);
    }
    loop {
        ops.push(parse_operand(p, false)?);
        if p.eat_punct(';') {
            return Ok(ops);
        }
        p.expect_punct(',')?;
        if ops.len() > 16 {
            return p.err("too many operands");
        }
    }
}

fn signed_number(p: &mut Parser) -> R<ROp> {
    let neg = p.eat_punct('-');
    let v = match p.next()? {
        Tok::Int(v) => ROp::Int(if neg { v.wrapping_neg() } else { v }),
        Tok::F32(b) => ROp::F32(if neg { b ^ 0x8000_0000 } else { b }),
        Tok::F64(b) => ROp::F64(if neg { b ^ (1 << 63) } else { b }),
        _ => {
            p.i = p.i.saturating_sub(1);
            return p.err("expected number");
        }
    };
    Ok(v)
}

fn parse_operand(p: &mut Parser, in_vector: bool) -> R<ROp> {
    let pos = p.pos();
    match p.peek() {
        Some(Tok::Punct('[')) => {
            p.i += 1;
            let mut base = None;
            let mut off: u64 = 0;
            if matches!(p.peek(), Some(Tok::Ident(_))) {
                base = Some(p.ident()?);
            } else if let ROp::Int(v) = signed_number(p)? {
                off = v;
            } else {
                return p.err("bad address");
            }
            while p.is_punct('+') || p.is_punct('-') {
                let minus = p.eat_punct('-');
                if !minus {
                    p.i += 1;
                }
                match signed_number(p)? {
                    ROp::Int(v) => {
                        off = if minus {
                            off.wrapping_sub(v)
                        } else {
                            off.wrapping_add(v)
                        }
                    }
                    _ => return p.err("bad address offset"),
                }
            }
            p.expect_punct(']')?;
            Ok(ROp::Addr {
                base,
                off: off as i64,
                pos,
            })
        }
        Some(Tok::Punct('{')) => {
            if in_vector {
                return p.err("nested vector operand");
            }
            p.i += 1;
            let mut v = Vec::new();
            loop {
                v.push(parse_operand(p, true)?);
                if p.eat_punct('}') {
                    break;
                }
                p.expect_punct(',')?;
                if v.len() > 8 {
                    return p.err("vector too long");
                }
            }
            Ok(ROp::Vec(v))
        }
        Some(Tok::Punct('(')) if !in_vector => {
            p.i += 1;
            let mut v = Vec::new();
            if p.eat_punct(')') {
                return Ok(ROp::List(v));
            }
            loop {
                v.push(parse_operand(p, true)?);
                if p.eat_punct(')') {
                    break;
                }
                p.expect_punct(',')?;
                if v.len() > 64 {
                    return p.err("argument list too long");
                }
            }
            Ok(ROp::List(v))
        }
        Some(Tok::Punct('!')) => {
            p.i += 1;
            Ok(ROp::Not(p.ident()?, pos))
        }
        Some(Tok::Ident(_)) => {
            let a = p.ident()?;
            if p.eat_punct('|') {
                let b = p.ident()?;
                return Ok(ROp::Pair(a, b, pos));
            }
            if (p.is_punct('+') || p.is_punct('-')) && matches!(p.peek_at(1), Some(Tok::Int(_))) {
                // `sym+4` used as an immediate address
                let minus = p.eat_punct('-');
                if !minus {
                    p.i += 1;
                }
                let v = p.int()?;
                let off = if minus { v.wrapping_neg() } else { v };
                return Ok(ROp::SymOff(a, off as i64, pos));
            }
            Ok(ROp::Name(a, pos))
        }
        _ => signed_number(p),
    }
}
