//! PTX printer for the statement-level module: directives, module variables, and each entry
//! (inlined) with its parameters, declarations and body, in the subset of
//! `docs/ptx-subset.md` that both this crate's parser and NVIDIA's `ptxas` accept.
//!
//! Names the parser or the inliner made up are replaced by valid identifiers ([`Names`]);
//! call-site `.param` buffers of inlined calls are printed as `.local` variables (which is
//! what they are once the calls are gone) and their `ld.param`/`st.param` accesses as
//! `ld.local`/`st.local`.

use std::fmt::Write;

use super::module::{StmtEntry, StmtModule};
use super::names::Names;
use crate::decode::{ROp, RawInst, Stmt, VarDecl};
use crate::ir::{Space, Ty};
use crate::modvars::RawModVar;

/// The PTX text of a statement-level module.
pub(crate) fn module(m: &StmtModule) -> String {
    let mut s = String::new();
    let _ = writeln!(s, ".version {}", m.version);
    if m.targets.is_empty() {
        s.push_str(".target sm_80\n");
    } else {
        let _ = writeln!(s, ".target {}", m.targets.join(", "));
    }
    s.push_str(".address_size 64\n\n");
    for v in &m.shared {
        let ext = if v.is_extern { ".extern " } else { "" };
        let _ = writeln!(s, "{ext}.shared {};", var_decl(v, None));
    }
    for v in &m.vars {
        mod_var(&mut s, v);
    }
    for e in &m.entries {
        s.push('\n');
        entry(&mut s, e);
    }
    s
}

fn ty_name(t: Ty) -> &'static str {
    match t {
        Ty::B8 => "b8",
        Ty::B16 => "b16",
        Ty::B32 => "b32",
        Ty::B64 => "b64",
        Ty::U8 => "u8",
        Ty::U16 => "u16",
        Ty::U32 => "u32",
        Ty::U64 => "u64",
        Ty::S8 => "s8",
        Ty::S16 => "s16",
        Ty::S32 => "s32",
        Ty::S64 => "s64",
        Ty::F16 => "f16",
        Ty::Bf16 => "bf16",
        Ty::F32 => "f32",
        Ty::F64 => "f64",
        Ty::Pred => "pred",
    }
}

/// `.align A .b8 name[size]` (or `name[]` for an extern).
fn var_decl(v: &VarDecl, name: Option<&str>) -> String {
    let name = name.unwrap_or(&v.name);
    if v.is_extern {
        format!(".align {} .b8 {name}[]", v.align.max(1))
    } else {
        format!(".align {} .b8 {name}[{}]", v.align.max(1), v.size)
    }
}

fn mod_var(s: &mut String, v: &RawModVar) {
    let space = if v.space == Space::Const {
        ".const"
    } else {
        ".global"
    };
    let count = v.size / u64::from(v.ty.bytes()).max(1);
    let _ = write!(
        s,
        "{space} .align {} .{} {}[{count}]",
        v.align.max(1),
        ty_name(v.ty),
        v.name
    );
    if !v.init.is_empty() {
        s.push_str(" = {");
        for (k, bits) in v.init.iter().enumerate() {
            if k > 0 {
                s.push_str(", ");
            }
            match v.ty {
                Ty::F32 => {
                    let _ = write!(s, "0f{:08X}", *bits as u32);
                }
                Ty::F64 => {
                    let _ = write!(s, "0d{bits:016X}");
                }
                _ => {
                    let _ = write!(s, "{}", *bits as i64);
                }
            }
        }
        s.push('}');
    }
    s.push_str(";\n");
}

fn entry(s: &mut String, e: &StmtEntry) {
    let d = &e.decls;
    let labels = e.body.iter().filter_map(|st| match st {
        Stmt::Label(l, _) => Some(l),
        Stmt::Inst(_) => None,
    });
    let names = Names::new(
        d.regs
            .keys()
            .chain(labels)
            .chain(d.shared.iter().map(|v| &v.name))
            .chain(d.local.iter().map(|v| &v.name))
            .chain(d.call_params.iter().map(|v| &v.name))
            .chain(d.params.iter().map(|p| &p.name)),
    );
    let _ = writeln!(s, ".visible .entry {}(", d.name);
    for (k, p) in d.params.iter().enumerate() {
        let sep = if k + 1 < d.params.len() { "," } else { "" };
        if p.size == p.align && matches!(p.size, 1 | 2 | 4 | 8) {
            let _ = writeln!(s, "\t.param .b{} {}{sep}", p.size * 8, p.name);
        } else {
            let _ = writeln!(
                s,
                "\t.param .align {} .b8 {}[{}]{sep}",
                p.align, p.name, p.size
            );
        }
    }
    s.push(')');
    for (dir, v) in [(".reqntid", d.reqntid), (".maxntid", d.maxntid)] {
        if let Some([x, y, z]) = v {
            let _ = write!(s, "\n{dir} {x}, {y}, {z}");
        }
    }
    s.push_str("\n{\n");
    let mut regs: Vec<(&String, &Ty)> = d.regs.iter().collect();
    regs.sort_by(|a, b| a.0.cmp(b.0));
    for (r, t) in regs {
        let _ = writeln!(s, "\t.reg .{} {};", ty_name(*t), names.get(r));
    }
    for v in &d.shared {
        let _ = writeln!(s, "\t.shared {};", var_decl(v, Some(names.get(&v.name))));
    }
    for v in d.local.iter().chain(&d.call_params) {
        let _ = writeln!(s, "\t.local {};", var_decl(v, Some(names.get(&v.name))));
    }
    for st in &e.body {
        match st {
            Stmt::Label(l, _) => {
                let _ = writeln!(s, "{}:", names.get(l));
            }
            Stmt::Inst(i) => inst(s, i, &names, |n| d.call_param_index.contains_key(n)),
        }
    }
    s.push_str("}\n");
}

/// One instruction line.
fn inst(s: &mut String, i: &RawInst, names: &Names, is_call_param: impl Fn(&str) -> bool) {
    s.push('\t');
    if let Some((g, neg, _)) = &i.guard {
        let _ = write!(s, "@{}{} ", if *neg { "!" } else { "" }, names.get(g));
    }
    let local = i.ops.iter().any(|o| match o {
        ROp::Addr { base: Some(b), .. } => is_call_param(b),
        _ => false,
    });
    if local {
        let parts: Vec<&str> = i
            .opcode
            .split('.')
            .map(|p| if p == "param" { "local" } else { p })
            .collect();
        s.push_str(&parts.join("."));
    } else {
        s.push_str(&i.opcode);
    }
    for (k, o) in i.ops.iter().enumerate() {
        s.push_str(if k == 0 { " " } else { ", " });
        operand(s, o, names);
    }
    s.push_str(";\n");
}

fn operand(s: &mut String, o: &ROp, names: &Names) {
    match o {
        ROp::Name(n, _) => s.push_str(names.get(n)),
        ROp::Not(n, _) => {
            let _ = write!(s, "!{}", names.get(n));
        }
        ROp::Int(v) => {
            let _ = write!(s, "{}", *v as i64);
        }
        ROp::F32(b) => {
            let _ = write!(s, "0f{b:08X}");
        }
        ROp::F64(b) => {
            let _ = write!(s, "0d{b:016X}");
        }
        ROp::Addr { base, off, .. } => {
            s.push('[');
            match base {
                Some(b) => {
                    s.push_str(names.get(b));
                    if *off > 0 {
                        let _ = write!(s, "+{off}");
                    } else if *off < 0 {
                        // `[%r-4]` is a syntax error to ptxas; nvcc writes `[%r+-4]`.
                        let _ = write!(s, "+-{}", off.unsigned_abs());
                    }
                }
                None => {
                    let _ = write!(s, "{off}");
                }
            }
            s.push(']');
        }
        ROp::SymOff(n, off, _) => {
            s.push_str(names.get(n));
            if *off >= 0 {
                let _ = write!(s, "+{off}");
            } else {
                let _ = write!(s, "-{}", off.unsigned_abs());
            }
        }
        ROp::Vec(v) | ROp::List(v) => {
            let (open, close) = if matches!(o, ROp::Vec(_)) {
                ('{', '}')
            } else {
                ('(', ')')
            };
            s.push(open);
            for (k, x) in v.iter().enumerate() {
                if k > 0 {
                    s.push_str(", ");
                }
                operand(s, x, names);
            }
            s.push(close);
        }
        ROp::Pair(a, b, _) => {
            let _ = write!(s, "{}|{}", names.get(a), names.get(b));
        }
    }
}
