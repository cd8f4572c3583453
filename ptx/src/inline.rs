//! `.func` support by inlining: every `call` of a function defined in the module is replaced
//! at decode time by the function's body, with its registers, labels and local variables
//! renamed per call site, its formal `.param`s bound to the call site's `.param` variables
//! (which live in per-thread local memory) and `ret` turned into a branch to the call's end.
//! Recursion is rejected through a depth limit; indirect calls and calls of bodiless
//! (`.extern`) functions are unsupported.

use std::collections::{HashMap, HashSet};

use crate::decode::{EntryDecls, ROp, RawInst, Stmt, VarDecl};
use crate::error::PtxError;
use crate::load::{Meter, map_entry, str_bytes};
use crate::parse_body::{reg_bytes, stmt_bytes, var_bytes};

/// Deepest call nesting accepted (also bounds recursion).
const MAX_DEPTH: u32 = 8;
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
    /// Names other than registers renamed per call site: locals, call-site params, labels.
    pub local_names: HashSet<String>,
}

impl FuncDef {
    /// Collect the names renamed per call site (once per function, not per call).
    pub(crate) fn new(
        name: String,
        rets: Vec<String>,
        params: Vec<String>,
        decls: EntryDecls,
        body: Option<Vec<Stmt>>,
    ) -> FuncDef {
        let mut local_names: HashSet<String> = HashSet::new();
        local_names.extend(decls.local.iter().map(|v| v.name.clone()));
        local_names.extend(decls.call_params.iter().map(|v| v.name.clone()));
        for s in body.iter().flatten() {
            if let Stmt::Label(l, _) = s {
                local_names.insert(l.clone());
            }
        }
        FuncDef {
            name,
            rets,
            params,
            decls,
            body,
            local_names,
        }
    }

    /// Host bytes of the name set built by [`FuncDef::new`].
    pub(crate) fn local_names_bytes(&self) -> u64 {
        self.local_names
            .iter()
            .map(|n| map_entry::<String, ()>() + str_bytes(n))
            .sum()
    }
}

/// State of the expansion of one entry.
struct Inliner<'a> {
    funcs: &'a HashMap<String, FuncDef>,
    meter: &'a mut Meter,
    /// Call sites inlined so far (their number tags the renamed names).
    counter: u32,
    /// Names in `decls.shared` (functions' shared variables are added once per entry).
    shared: HashSet<String>,
}

/// Replace every `call` in `body` by the callee's renamed body, charging the module-wide
/// instruction, label, register and host-byte budgets as the expansion grows.
pub(crate) fn expand_calls(
    decls: &mut EntryDecls,
    body: Vec<Stmt>,
    funcs: &HashMap<String, FuncDef>,
    meter: &mut Meter,
) -> R<Vec<Stmt>> {
    if funcs.is_empty() && !has_call(&body) {
        for s in &body {
            count(meter, s)?;
        }
        return Ok(body);
    }
    let mut inl = Inliner {
        funcs,
        meter,
        counter: 0,
        shared: decls.shared.iter().map(|v| v.name.clone()).collect(),
    };
    let shared_bytes = decls.shared.len() as u64 * map_entry::<String, ()>();
    inl.meter.alloc(shared_bytes)?;
    let mut out = Vec::with_capacity(body.len());
    let r = inl.expand(decls, body, 0, &mut out);
    inl.meter.free(shared_bytes);
    r.map(|()| out)
}

/// Charge one statement of the final body to the module's instruction or label budget.
fn count(meter: &mut Meter, s: &Stmt) -> R<()> {
    meter.tick()?;
    match s {
        Stmt::Inst(_) => meter.instructions(1),
        Stmt::Label(..) => meter.labels(1),
    }
}

fn has_call(body: &[Stmt]) -> bool {
    body.iter()
        .any(|s| matches!(s, Stmt::Inst(i) if i.opcode.split('.').next() == Some("call")))
}

impl Inliner<'_> {
    fn expand(
        &mut self,
        decls: &mut EntryDecls,
        body: Vec<Stmt>,
        depth: u32,
        out: &mut Vec<Stmt>,
    ) -> R<()> {
        for stmt in body {
            match stmt {
                Stmt::Inst(ri) if ri.opcode.split('.').next() == Some("call") => {
                    self.meter.tick()?;
                    self.inline_call(decls, ri, depth, out)?;
                }
                s => self.emit(out, s)?,
            }
        }
        Ok(())
    }

    /// Append a statement to the entry's final body.
    fn emit(&mut self, out: &mut Vec<Stmt>, s: Stmt) -> R<()> {
        count(self.meter, &s)?;
        out.push(s);
        Ok(())
    }

    /// Charge a statement created by inlining (owned by the entry's body from now on).
    fn charge_new(&mut self, decls: &mut EntryDecls, s: &Stmt) -> R<()> {
        let b = stmt_bytes(s);
        self.meter.alloc(b)?;
        decls.bytes += b;
        Ok(())
    }

    fn charge(&mut self, decls: &mut EntryDecls, bytes: u64) -> R<()> {
        self.meter.alloc(bytes)?;
        decls.bytes += bytes;
        Ok(())
    }
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

impl Inliner<'_> {
    fn inline_call(
        &mut self,
        decls: &mut EntryDecls,
        ri: RawInst,
        depth: u32,
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
        let funcs = self.funcs;
        let f = funcs.get(fname).ok_or_else(|| PtxError::Undefined {
            pos: *fpos,
            name: fname.chars().take(80).collect(),
        })?;
        if f.body.is_none() && f.name == "vprintf" {
            // Device printf: the call's own `.param` variables (format, argument buffer,
            // return value) go to the `__vprintf` instruction, which the parser never accepts
            // from the text.
            if args.len() != 2 || rets.len() > 1 {
                return Err(operr(
                    &ri,
                    "vprintf takes (format, args) and returns one value",
                ));
            }
            let mut ops = param_names(&ri, args, decls)?;
            ops.extend(param_names(&ri, rets, decls)?);
            let pf = Stmt::Inst(RawInst {
                pos: ri.pos,
                guard: ri.guard.clone(),
                opcode: "__vprintf".into(),
                ops: ops.into_iter().map(|n| ROp::Name(n, ri.pos)).collect(),
            });
            self.charge_new(decls, &pf)?;
            out.push(pf);
            return Ok(());
        }
        if f.body.is_none() && f.name == "__assertfail" {
            // A failed device `assert()`: nvcc calls the CUDA runtime's `__assertfail(message,
            // file, line, function, char size)`, which reports and aborts the kernel. Here the
            // kernel stops with the fault `Trap` (the arguments are not read).
            let trap = Stmt::Inst(RawInst {
                pos: ri.pos,
                guard: ri.guard.clone(),
                opcode: "trap".into(),
                ops: Vec::new(),
            });
            self.charge_new(decls, &trap)?;
            out.push(trap);
            return Ok(());
        }
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
        let n = self.counter;
        self.counter += 1;
        let tag = |name: &str| format!("{name}@{n}");
        // Formal parameters → the call site's variables.
        let mut bind: HashMap<&str, String> = HashMap::new();
        for (formal, actual) in f
            .rets
            .iter()
            .zip(actual_rets)
            .chain(f.params.iter().zip(actual_args))
        {
            bind.insert(formal, actual);
        }
        // Everything else the callee declares is renamed per call site: its registers get
        // copies in the entry's table, charged before they are made.
        if decls.regs.len() + f.decls.regs.len() > MAX_REGS {
            return Err(PtxError::TooLarge {
                pos: ri.pos,
                what: "registers after inlining calls".into(),
            });
        }
        self.meter.registers(f.decls.regs.len() as u64)?;
        for (name, ty) in &f.decls.regs {
            self.meter.tick()?;
            let t = tag(name);
            self.charge(decls, reg_bytes(&t))?;
            decls.regs.insert(t, *ty);
        }
        // Static shared variables of a function are one per CTA, whatever the call site.
        for v in &f.decls.shared {
            if !self.shared.contains(&v.name) {
                self.charge(decls, var_bytes(v) + map_entry::<String, ()>())?;
                self.shared.insert(v.name.clone());
                decls.shared.push(v.clone());
            }
        }
        for v in &f.decls.local {
            let v = VarDecl {
                name: tag(&v.name),
                ..v.clone()
            };
            self.charge(decls, var_bytes(&v))?;
            decls.local.push(v);
        }
        for v in &f.decls.call_params {
            let v = VarDecl {
                name: tag(&v.name),
                ..v.clone()
            };
            self.charge(decls, var_bytes(&v) + map_entry::<String, usize>())?;
            decls
                .call_param_index
                .insert(v.name.clone(), decls.call_params.len());
            decls.call_params.push(v);
        }
        let ret_label = format!("$__ret@{n}");
        let rename = |name: &str| -> String {
            if let Some(a) = bind.get(name) {
                a.clone()
            } else if f.decls.regs.contains_key(name) || f.local_names.contains(name) {
                tag(name)
            } else {
                name.to_string()
            }
        };
        if let Some((g, neg, gpos)) = &ri.guard {
            // `@p call f` → skip the inlined body when the guard is false.
            let s = Stmt::Inst(RawInst {
                pos: ri.pos,
                guard: Some((g.clone(), !neg, *gpos)),
                opcode: "bra".into(),
                ops: vec![ROp::Name(ret_label.clone(), ri.pos)],
            });
            self.charge_new(decls, &s)?;
            self.emit(out, s)?;
        }
        let mut inlined = Vec::with_capacity(fbody.len());
        for s in fbody {
            self.meter.tick()?;
            let s = match s {
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
            };
            self.charge_new(decls, &s)?;
            inlined.push(s);
        }
        self.expand(decls, inlined, depth + 1, out)?;
        let s = Stmt::Label(ret_label, ri.pos);
        self.charge_new(decls, &s)?;
        self.emit(out, s)
    }
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
