//! `.func` support by inlining: every `call` of a function defined in the module is replaced
//! at decode time by the function's body, with its registers, labels and local variables
//! renamed per call site, its formal `.param`s bound to the call site's `.param` variables
//! (which live in per-thread local memory) and `ret` turned into a branch to the call's end.
//! Recursion is rejected through a depth limit; indirect calls and calls of bodiless
//! (`.extern`) functions are unsupported.

use std::collections::{HashMap, HashSet};

use crate::decode::{EntryDecls, ROp, RawInst, Stmt, VarDecl};
use crate::error::PtxError;

/// Deepest call nesting accepted (also bounds recursion).
const MAX_DEPTH: u32 = 8;
/// Most statements after inlining.
const MAX_STMTS: usize = 1 << 18;
/// Most registers an entry may hold after inlining (renamed copies included).
const MAX_REGS: usize = 1 << 20;

type R<T> = Result<T, PtxError>;

/// A parsed `.func`.
#[derive(Debug)]
pub(crate) struct FuncDef {
    pub name: String,
    /// Formal return `.param` names.
    pub rets: Vec<String>,
    /// Formal argument `.param` names.
    pub params: Vec<String>,
    /// Registers, locals and call-site params of the body.
    pub decls: EntryDecls,
    /// `None` for a prototype or `.extern` declaration.
    pub body: Option<Vec<Stmt>>,
}

/// Replace every `call` in `body` by the callee's renamed body.
pub(crate) fn expand_calls(
    decls: &mut EntryDecls,
    body: Vec<Stmt>,
    funcs: &HashMap<String, FuncDef>,
) -> R<Vec<Stmt>> {
    if funcs.is_empty() && !has_call(&body) {
        return Ok(body);
    }
    let mut counter = 0u32;
    let mut out = Vec::with_capacity(body.len());
    expand(decls, body, funcs, 0, &mut counter, &mut out)?;
    Ok(out)
}

fn has_call(body: &[Stmt]) -> bool {
    body.iter()
        .any(|s| matches!(s, Stmt::Inst(i) if i.opcode.split('.').next() == Some("call")))
}

fn expand(
    decls: &mut EntryDecls,
    body: Vec<Stmt>,
    funcs: &HashMap<String, FuncDef>,
    depth: u32,
    counter: &mut u32,
    out: &mut Vec<Stmt>,
) -> R<()> {
    for stmt in body {
        if out.len() > MAX_STMTS {
            return Err(PtxError::TooLarge {
                pos: decls.pos,
                what: "instructions after inlining calls".into(),
            });
        }
        match stmt {
            Stmt::Inst(ri) if ri.opcode.split('.').next() == Some("call") => {
                inline_call(decls, ri, funcs, depth, counter, out)?;
            }
            s => out.push(s),
        }
    }
    Ok(())
}

fn unsupported(ri: &RawInst, what: &str) -> PtxError {
    PtxError::UnsupportedInstruction {
        pos: ri.pos,
        name: format!("{} ({what})", ri.opcode)
            .chars()
            .take(120)
            .collect(),
    }
}

fn operr(ri: &RawInst, msg: &str) -> PtxError {
    PtxError::Operand {
        pos: ri.pos,
        inst: ri.opcode.clone(),
        msg: msg.to_string(),
    }
}

/// Names of a call's return/argument list: each must be a call-site `.param` variable.
fn param_names(ri: &RawInst, list: &[ROp], decls: &EntryDecls) -> R<Vec<String>> {
    list.iter()
        .map(|o| match o {
            ROp::Name(n, _) if decls.call_param_index.contains_key(n) => Ok(n.clone()),
            _ => Err(operr(ri, "call arguments must be .param variables")),
        })
        .collect()
}

fn inline_call(
    decls: &mut EntryDecls,
    ri: RawInst,
    funcs: &HashMap<String, FuncDef>,
    depth: u32,
    counter: &mut u32,
    out: &mut Vec<Stmt>,
) -> R<()> {
    if !matches!(ri.opcode.as_str(), "call" | "call.uni") {
        return Err(unsupported(&ri, "call modifiers"));
    }
    let (rets, fname, args): (&[ROp], &ROp, &[ROp]) = match ri.ops.as_slice() {
        [ROp::List(r), f, ROp::List(a)] => (r, f, a),
        [ROp::List(r), f] => (r, f, &[]),
        [f, ROp::List(a)] => (&[], f, a),
        [f] => (&[], f, &[]),
        _ => return Err(unsupported(&ri, "indirect or prototype call")),
    };
    let ROp::Name(fname, fpos) = fname else {
        return Err(unsupported(&ri, "indirect call"));
    };
    let f = funcs.get(fname).ok_or_else(|| PtxError::Undefined {
        pos: *fpos,
        name: fname.chars().take(80).collect(),
    })?;
    let Some(fbody) = &f.body else {
        return Err(unsupported(
            &ri,
            &format!("call of external function `{}`", f.name),
        ));
    };
    if depth >= MAX_DEPTH {
        return Err(PtxError::TooLarge {
            pos: ri.pos,
            what: format!("call depth (recursion?) at `{}`", f.name),
        });
    }
    if rets.len() != f.rets.len() || args.len() != f.params.len() {
        return Err(operr(&ri, "argument count does not match the function"));
    }
    let actual_rets = param_names(&ri, rets, decls)?;
    let actual_args = param_names(&ri, args, decls)?;
    let n = *counter;
    *counter += 1;
    let tag = |name: &str| format!("{name}@{n}");
    // Formal parameters → the call site's variables.
    let mut bind: HashMap<String, String> = HashMap::new();
    for (formal, actual) in f
        .rets
        .iter()
        .zip(actual_rets)
        .chain(f.params.iter().zip(actual_args))
    {
        bind.insert(formal.clone(), actual);
    }
    // Everything else the callee declares is renamed per call site.
    let mut renamed: HashSet<String> = f.decls.regs.keys().cloned().collect();
    if decls.regs.len() + f.decls.regs.len() > MAX_REGS {
        return Err(PtxError::TooLarge {
            pos: ri.pos,
            what: "registers after inlining calls".into(),
        });
    }
    for (name, ty) in &f.decls.regs {
        decls.regs.insert(tag(name), *ty);
    }
    // Static shared variables of a function are one per CTA, whatever the call site.
    for v in &f.decls.shared {
        if !decls.shared.iter().any(|x| x.name == v.name) {
            decls.shared.push(v.clone());
        }
    }
    for v in &f.decls.local {
        renamed.insert(v.name.clone());
        decls.local.push(VarDecl {
            name: tag(&v.name),
            ..v.clone()
        });
    }
    for v in &f.decls.call_params {
        renamed.insert(v.name.clone());
        decls
            .call_param_index
            .insert(tag(&v.name), decls.call_params.len());
        decls.call_params.push(VarDecl {
            name: tag(&v.name),
            ..v.clone()
        });
    }
    for s in fbody {
        if let Stmt::Label(l, _) = s {
            renamed.insert(l.clone());
        }
    }
    let ret_label = format!("$__ret@{n}");
    let rename = |name: &str| -> String {
        if let Some(a) = bind.get(name) {
            a.clone()
        } else if renamed.contains(name) {
            tag(name)
        } else {
            name.to_string()
        }
    };
    if let Some((g, neg, gpos)) = &ri.guard {
        // `@p call f` → skip the inlined body when the guard is false.
        out.push(Stmt::Inst(RawInst {
            pos: ri.pos,
            guard: Some((g.clone(), !neg, *gpos)),
            opcode: "bra".into(),
            ops: vec![ROp::Name(ret_label.clone(), ri.pos)],
        }));
    }
    let mut inlined = Vec::with_capacity(fbody.len() + 1);
    for s in fbody {
        inlined.push(match s {
            Stmt::Label(l, p) => Stmt::Label(rename(l), *p),
            Stmt::Inst(i) => {
                let guard = i.guard.as_ref().map(|(g, neg, p)| (rename(g), *neg, *p));
                if i.opcode.split('.').next() == Some("ret") {
                    Stmt::Inst(RawInst {
                        pos: i.pos,
                        guard,
                        opcode: "bra".into(),
                        ops: vec![ROp::Name(ret_label.clone(), i.pos)],
                    })
                } else {
                    Stmt::Inst(RawInst {
                        pos: i.pos,
                        guard,
                        opcode: i.opcode.clone(),
                        ops: i.ops.iter().map(|o| rename_op(o, &rename)).collect(),
                    })
                }
            }
        });
    }
    expand(decls, inlined, funcs, depth + 1, counter, out)?;
    out.push(Stmt::Label(ret_label, ri.pos));
    Ok(())
}

fn rename_op(o: &ROp, rename: &impl Fn(&str) -> String) -> ROp {
    match o {
        ROp::Name(n, p) => ROp::Name(rename(n), *p),
        ROp::Not(n, p) => ROp::Not(rename(n), *p),
        ROp::Addr { base, off, pos } => ROp::Addr {
            base: base.as_deref().map(rename),
            off: *off,
            pos: *pos,
        },
        ROp::SymOff(n, off, p) => ROp::SymOff(rename(n), *off, *p),
        ROp::Pair(a, b, p) => ROp::Pair(rename(a), rename(b), *p),
        ROp::Vec(v) => ROp::Vec(v.iter().map(|x| rename_op(x, rename)).collect()),
        ROp::List(v) => ROp::List(v.iter().map(|x| rename_op(x, rename)).collect()),
        ROp::Int(_) | ROp::F32(_) | ROp::F64(_) => o.clone(),
    }
}
