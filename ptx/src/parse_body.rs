//! Parsing of entry bodies: register declarations, `.shared`/`.local` variables, labels,
//! guarded instructions and their raw operands (registers, immediates, addresses, vectors,
//! predicate pairs).

use std::collections::HashMap;

use crate::decode::{EntryDecls, ROp, RawInst, Stmt, VarDecl};
use crate::error::{Pos, PtxError};
use crate::ir::Ty;
use crate::lexer::Tok;
use crate::load::{elems, map_entry, str_bytes};
use crate::parser::{Parser, parse_var};

/// Most registers a `%r<N>` range may declare.
const MAX_RANGE: u64 = 1 << 16;
/// Most registers a whole module may declare.
const MAX_DECLARED: u64 = 1 << 20;

type R<T> = Result<T, PtxError>;

/// Lexical scopes of `{ }` blocks: names re-declared in an inner block get a unique internal
/// name (`name{k}` cannot be written in PTX) for the statements of that block.
///
/// Resolution is one hash lookup whatever the nesting depth: each re-declared name maps to the
/// stack of its bindings (innermost last), and each open block lists the names it bound, which
/// are popped when it closes. Every declaration and every closing block costs O(1) per name,
/// so a text of N tokens costs O(N), however deep it nests.
struct Scopes {
    /// Current bindings of each name re-declared in an open inner block (innermost last).
    bindings: HashMap<String, Vec<String>>,
    /// Names bound in each open block, innermost last; the outermost is the body's own.
    frames: Vec<Vec<String>>,
    next: u64,
}

#[cfg(test)]
thread_local! {
    /// Scope tables probed by name resolution on this thread (for the structural test of the
    /// linear cost).
    static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Host bytes charged for one binding of `name` to `unique`.
fn binding_bytes(name: &str, unique: &str) -> u64 {
    map_entry::<String, Vec<String>>()
        + 2 * str_bytes(name)
        + str_bytes(unique)
        + elems::<String>(2)
}

impl Scopes {
    fn new() -> Scopes {
        Scopes {
            bindings: HashMap::new(),
            frames: vec![Vec::new()],
            next: 0,
        }
    }

    fn nested(&self) -> bool {
        self.frames.len() > 1
    }

    fn resolve(&self, name: &str) -> Option<&String> {
        #[cfg(test)]
        PROBES.with(|c| c.set(c.get() + 1));
        self.bindings.get(name).and_then(|v| v.last())
    }

    fn open(&mut self, p: &mut Parser) -> R<()> {
        p.meter.alloc(elems::<Vec<String>>(1))?;
        self.frames.push(Vec::new());
        Ok(())
    }

    /// Close the innermost block: its bindings end.
    fn close(&mut self, p: &mut Parser) {
        let Some(names) = self.frames.pop() else {
            return;
        };
        p.meter.free(elems::<Vec<String>>(1));
        for name in names {
            if let Some(v) = self.bindings.get_mut(&name) {
                if let Some(u) = v.pop() {
                    p.meter.free(binding_bytes(&name, &u));
                }
                if v.is_empty() {
                    self.bindings.remove(&name);
                }
            }
        }
    }

    /// Bind `name` to `unique` in the innermost block.
    fn bind(&mut self, p: &mut Parser, name: String, unique: String) -> R<()> {
        p.meter.alloc(binding_bytes(&name, &unique))?;
        if let Some(top) = self.frames.last_mut() {
            top.push(name.clone());
        }
        self.bindings.entry(name).or_default().push(unique);
        Ok(())
    }

    /// Close every block still open (error paths and the end of the body).
    fn close_all(&mut self, p: &mut Parser) {
        while !self.frames.is_empty() {
            self.close(p);
        }
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

/// Charge `bytes` held by the declarations or body of `decls` (freed when they are dropped).
pub(crate) fn charge(p: &mut Parser, decls: &mut EntryDecls, bytes: u64) -> R<()> {
    p.meter.alloc(bytes)?;
    decls.bytes += bytes;
    Ok(())
}

/// Declare one register, shadowing an outer declaration when inside a nested block.
fn declare(
    p: &mut Parser,
    decls: &mut EntryDecls,
    scopes: &mut Scopes,
    name: String,
    ty: Ty,
) -> R<()> {
    p.meter.tick()?;
    p.meter.registers(1)?;
    if scopes.nested() && (decls.regs.contains_key(&name) || scopes.resolve(&name).is_some()) {
        let unique = format!("{name}{{{}}}", scopes.next);
        scopes.next += 1;
        charge(p, decls, reg_bytes(&unique))?;
        decls.regs.insert(unique.clone(), ty);
        scopes.bind(p, name, unique)?;
    } else {
        if !decls.regs.contains_key(&name) {
            charge(p, decls, reg_bytes(&name))?;
        }
        if decls.regs.insert(name.clone(), ty).is_some() {
            log::debug!("register {name} redeclared");
        }
    }
    Ok(())
}

/// Host bytes of one entry of a register table.
pub(crate) fn reg_bytes(name: &str) -> u64 {
    map_entry::<String, Ty>() + str_bytes(name)
}

/// `.reg .type names;` (`joined`: the `.type` already read as part of a `.reg.type` token).
fn parse_reg_decl(
    p: &mut Parser,
    decls: &mut EntryDecls,
    scopes: &mut Scopes,
    joined: Option<String>,
) -> R<()> {
    let pos = p.pos();
    let t = match joined {
        Some(t) => t,
        None => p.ident()?,
    };
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
                declare(p, decls, scopes, format!("{name}{k}"), ty)?;
            }
        } else {
            declare(p, decls, scopes, name, ty)?;
        }
        if p.eat_punct(';') {
            return Ok(());
        }
        p.expect_punct(',')?;
    }
}

/// Parse `{ body }`: statements with names resolved through the body's block scopes. The
/// statements and tables are charged to `decls.bytes`.
pub(crate) fn parse_body(p: &mut Parser, decls: &mut EntryDecls) -> R<Vec<Stmt>> {
    p.expect_punct('{')?;
    let mut scopes = Scopes::new();
    let mut out = Vec::new();
    let r = parse_stmts(p, decls, &mut scopes, &mut out);
    scopes.close_all(p);
    r.map(|()| out)
}

fn push_stmt(p: &mut Parser, decls: &mut EntryDecls, out: &mut Vec<Stmt>, s: Stmt) -> R<()> {
    charge(p, decls, stmt_bytes(&s))?;
    out.push(s);
    Ok(())
}

fn parse_stmts(
    p: &mut Parser,
    decls: &mut EntryDecls,
    scopes: &mut Scopes,
    out: &mut Vec<Stmt>,
) -> R<()> {
    loop {
        p.meter.tick()?;
        let pos = p.pos();
        match p.next()? {
            Tok::Punct('{') => scopes.open(p)?,
            Tok::Punct('}') => {
                scopes.close(p);
                if scopes.frames.is_empty() {
                    return Ok(());
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
                let s = Stmt::Inst(RawInst {
                    pos,
                    guard: Some((g, neg, gpos)),
                    opcode,
                    ops,
                });
                push_stmt(p, decls, out, s)?;
            }
            Tok::Ident(s) => match s.as_str() {
                ".reg" => parse_reg_decl(p, decls, scopes, None)?,
                // `.reg.b32 f;` without a blank, as the inline PTX of cuda_fp16.hpp and
                // cuda_bf16.hpp writes it.
                joined if joined.starts_with(".reg.") => {
                    let ty = joined[".reg".len()..].to_string();
                    parse_reg_decl(p, decls, scopes, Some(ty))?
                }
                ".shared" => {
                    let v = parse_var(p, false, pos)?;
                    charge(p, decls, var_bytes(&v))?;
                    decls.shared.push(v);
                }
                ".local" => {
                    let v = parse_var(p, false, pos)?;
                    charge(p, decls, var_bytes(&v))?;
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
                            charge(p, decls, var_bytes(&v) + map_entry::<String, usize>())?;
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
                    push_stmt(p, decls, out, Stmt::Label(s, pos))?;
                }
                _ => {
                    known_opcode(&s, pos)?;
                    let mut ops = parse_operands(p)?;
                    ops.iter_mut().for_each(|o| scopes.rename_op(o));
                    let s = Stmt::Inst(RawInst {
                        pos,
                        guard: None,
                        opcode: s,
                        ops,
                    });
                    push_stmt(p, decls, out, s)?;
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
    "sad",
    "bmsk",
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

/// Host bytes of a variable declaration.
pub(crate) fn var_bytes(v: &VarDecl) -> u64 {
    elems::<VarDecl>(1) + str_bytes(&v.name)
}

/// Host bytes of an operand's strings and sub-operands (not the operand itself).
fn op_heap_bytes(o: &ROp) -> u64 {
    match o {
        ROp::Name(n, _) | ROp::Not(n, _) | ROp::SymOff(n, _, _) => str_bytes(n),
        ROp::Addr { base, .. } => base.as_deref().map_or(0, str_bytes),
        ROp::Pair(a, b, _) => str_bytes(a) + str_bytes(b),
        ROp::Vec(v) | ROp::List(v) => {
            elems::<ROp>(v.len()) + v.iter().map(op_heap_bytes).sum::<u64>()
        }
        ROp::Int(_) | ROp::F32(_) | ROp::F64(_) => 0,
    }
}

/// Host bytes of a parsed statement (its slot in the body and everything it owns).
pub(crate) fn stmt_bytes(s: &Stmt) -> u64 {
    elems::<Stmt>(1)
        + match s {
            Stmt::Label(l, _) => str_bytes(l),
            Stmt::Inst(i) => {
                str_bytes(&i.opcode)
                    + i.guard.as_ref().map_or(0, |(g, _, _)| str_bytes(g))
                    + elems::<ROp>(i.ops.len())
                    + i.ops.iter().map(op_heap_bytes).sum::<u64>()
            }
        }
}

#[cfg(test)]
mod tests {
    use super::PROBES;

    /// A body `depth` blocks deep, each declaring `regs` new registers, with `insts`
    /// instructions in the innermost block using registers of the body's own scope (the
    /// costly cases for a resolution that scans the open scopes: a name bound in none).
    fn nested(depth: usize, regs: usize, insts: usize) -> String {
        let mut s = String::from(".version 8.0\n.target sm_80\n.address_size 64\n");
        s.push_str(".visible .entry k()\n{\n.reg .b32 %r<4>;\n");
        for k in 0..depth {
            s.push_str(&format!("{{ .reg .b32 %q{k}_<{regs}>;\n"));
        }
        for _ in 0..insts {
            s.push_str("add.u32 %r1, %r2, %r3;\n");
        }
        s.push_str(&"}".repeat(depth));
        s.push_str("\nret;\n}\n");
        s
    }

    fn probes(text: &str) -> u64 {
        PROBES.with(|c| c.set(0));
        let m = crate::parse(text).expect("nested scopes parse");
        assert_eq!(
            m.entry("k").map(|e| e.instructions),
            Some(text.matches("add.u32").count() + 2)
        );
        PROBES.with(|c| c.get())
    }

    /// Name resolution costs O(1) scope-table probes per name whatever the nesting depth: the
    /// probes for a text do not grow with its depth (a scan of every open scope, as before,
    /// costs depth x names).
    #[test]
    fn scope_resolution_does_not_scan_open_scopes() {
        let (regs, insts) = (50, 200);
        let names = (regs + 3 * insts) as u64;
        let shallow = probes(&nested(10, regs, insts));
        let deep = probes(&nested(1000, regs, insts));
        // One probe per declaration and per operand name.
        assert!(shallow <= 10 * names, "{shallow} probes for depth 10");
        assert!(
            deep <= 1000 * regs as u64 + 3 * insts as u64,
            "{deep} probes for depth 1000"
        );
        assert!(
            deep > 1000 * regs as u64,
            "declarations were not resolved ({deep} probes)"
        );
    }
}
