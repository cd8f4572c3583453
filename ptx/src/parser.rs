//! Module-level PTX parser: the token cursor, module directives, entry headers with their
//! parameters and performance directives, and variable declarations. Entry bodies are parsed
//! in `parse_body`; decoding into the IR is in `decode`.

use std::collections::HashMap;

use crate::decode::{self, EntryDecls, ModuleSyms, Stmt, VarDecl};
use crate::error::{Pos, PtxError};
use crate::inline::FuncDef;
use crate::ir::Space;
use crate::ir::Ty;
use crate::lexer::{Tok, Token, lex, token_bytes};
use crate::load::{LoadOptions, Meter, elems, map_entry, str_bytes};
use crate::module::{Module, ParamInfo, fnv1a};
use crate::modvars::{ModMem, RawModVar, parse_mod_var};

/// Largest array/variable the parser accepts (bytes).
const MAX_VAR_BYTES: u64 = 1 << 30;

pub(crate) struct Parser {
    pub(crate) toks: Vec<Token>,
    pub(crate) i: usize,
    pub(crate) end: Pos,
    /// Registers declared so far in the whole module (bounded against hostile ranges).
    pub(crate) declared_regs: u64,
    /// Budgets, cancellation and deadline of this load.
    pub(crate) meter: Meter,
}

type R<T> = Result<T, PtxError>;

impl Parser {
    pub(crate) fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i).map(|t| &t.tok)
    }

    pub(crate) fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.i + k).map(|t| &t.tok)
    }

    pub(crate) fn pos(&self) -> Pos {
        self.toks.get(self.i).map_or(self.end, |t| t.pos)
    }

    pub(crate) fn err<T>(&self, msg: impl Into<String>) -> R<T> {
        Err(PtxError::Syntax {
            pos: self.pos(),
            msg: msg.into(),
        })
    }

    pub(crate) fn next(&mut self) -> R<Tok> {
        match self.toks.get(self.i) {
            Some(t) => {
                self.i += 1;
                Ok(t.tok.clone())
            }
            None => self.err("unexpected end of input"),
        }
    }

    pub(crate) fn is_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }

    pub(crate) fn eat_punct(&mut self, c: char) -> bool {
        if self.is_punct(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    pub(crate) fn expect_punct(&mut self, c: char) -> R<()> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            self.err(format!("expected `{c}`"))
        }
    }

    pub(crate) fn is_ident(&self, s: &str) -> bool {
        matches!(self.peek(), Some(Tok::Ident(x)) if x == s)
    }

    pub(crate) fn eat_ident(&mut self, s: &str) -> bool {
        if self.is_ident(s) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    pub(crate) fn ident(&mut self) -> R<String> {
        match self.peek() {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.i += 1;
                Ok(s)
            }
            _ => self.err("expected identifier"),
        }
    }

    pub(crate) fn int(&mut self) -> R<u64> {
        match self.peek() {
            Some(Tok::Int(v)) => {
                let v = *v;
                self.i += 1;
                Ok(v)
            }
            _ => self.err("expected integer"),
        }
    }

    /// Skip the rest of the current source line (for `.file`, `.loc`).
    pub(crate) fn skip_line(&mut self) {
        let line = self
            .toks
            .get(self.i.saturating_sub(1))
            .map_or(0, |t| t.pos.line);
        while let Some(t) = self.toks.get(self.i) {
            if t.pos.line != line || t.tok == Tok::Punct(';') {
                break;
            }
            self.i += 1;
        }
    }

    /// Skip `{ ... }` with nesting (for `.section`).
    pub(crate) fn skip_braces(&mut self) -> R<()> {
        self.expect_punct('{')?;
        let mut depth = 1u32;
        while depth > 0 {
            self.meter.tick()?;
            match self.next()? {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth -= 1,
                _ => {}
            }
        }
        Ok(())
    }

    pub(crate) fn unsupported_directive<T>(&self, name: &str) -> R<T> {
        Err(PtxError::UnsupportedDirective {
            pos: self.pos(),
            name: name.chars().take(64).collect(),
        })
    }
}

/// The module-level items of a parsed text, before decoding: what [`parse_module`] decodes and
/// what the checkpoint transformation (`crate::ckpt`) rewrites and prints.
pub(crate) struct Items {
    /// `.version` as written (e.g. "8.0").
    pub version: String,
    /// `.target` names.
    pub targets: Vec<String>,
    /// Module-level `.shared` declarations.
    pub module_shared: Vec<VarDecl>,
    /// Entries with their statement bodies (calls not yet inlined).
    pub parsed: Vec<(EntryDecls, Vec<Stmt>)>,
    /// Functions by name.
    pub funcs: HashMap<String, FuncDef>,
    /// Module `.global`/`.const` variables.
    pub raw_vars: Vec<RawModVar>,
    /// The load's meter (tokens already freed).
    pub meter: Meter,
}

/// Lex and parse the module-level items of `text` within the budgets of `opts`.
pub(crate) fn parse_items(text: &str, opts: &LoadOptions) -> R<Items> {
    let mut meter = Meter::new(opts);
    meter.check()?;
    let toks = lex(text, &mut meter)?;
    let token_bytes: u64 = toks.iter().map(token_bytes).sum();
    let end = toks.last().map_or(Pos { line: 1, col: 1 }, |t| t.pos);
    let mut p = Parser {
        toks,
        i: 0,
        end,
        declared_regs: 0,
        meter,
    };
    let mut module_shared: Vec<VarDecl> = Vec::new();
    let mut parsed: Vec<(EntryDecls, Vec<Stmt>)> = Vec::new();
    let mut funcs: HashMap<String, FuncDef> = HashMap::new();
    let mut raw_vars: Vec<RawModVar> = Vec::new();
    let mut names: HashMap<String, ()> = HashMap::new();
    let mut version = String::from("8.0");
    let mut targets = Vec::new();
    while p.peek().is_some() {
        p.meter.tick()?;
        let pos = p.pos();
        let d = p.ident()?;
        match d.as_str() {
            ".version" => match p.next()? {
                Tok::F64(v) => version = format!("{:.1}", f64::from_bits(v)),
                Tok::Int(v) => version = format!("{v}.0"),
                _ => return p.err("expected version number"),
            },
            ".target" => {
                targets.push(p.ident()?);
                while p.eat_punct(',') {
                    targets.push(p.ident()?);
                }
            }
            ".address_size" => {
                let pos = p.pos();
                if p.int()? != 64 {
                    return Err(PtxError::UnsupportedDirective {
                        pos,
                        name: ".address_size (only 64)".into(),
                    });
                }
            }
            ".file" | ".loc" => p.skip_line(),
            ".pragma" => {
                p.next()?;
                p.expect_punct(';')?;
            }
            ".section" => {
                p.ident()?;
                p.skip_braces()?;
            }
            ".visible" | ".weak" | ".extern" | ".entry" | ".func" | ".shared" | ".common"
            | ".global" | ".const" => {
                let mut is_extern = d == ".extern";
                let mut cur = d.clone();
                while matches!(cur.as_str(), ".visible" | ".weak" | ".extern" | ".common") {
                    cur = p.ident()?;
                    is_extern |= cur == ".extern";
                }
                match cur.as_str() {
                    ".entry" => {
                        let (decls, body) = parse_entry(&mut p, pos)?;
                        p.meter
                            .alloc(map_entry::<String, ()>() + str_bytes(&decls.name))?;
                        if names.insert(decls.name.clone(), ()).is_some() {
                            return Err(PtxError::Duplicate {
                                pos,
                                name: decls.name.clone(),
                            });
                        }
                        parsed.push((decls, body));
                    }
                    ".func" => {
                        let f = parse_func(&mut p, pos)?;
                        match funcs.get(&f.name) {
                            Some(old) if old.body.is_some() && f.body.is_some() => {
                                return Err(PtxError::Duplicate { pos, name: f.name });
                            }
                            Some(old) if old.body.is_some() => {}
                            _ => {
                                funcs.insert(f.name.clone(), f);
                            }
                        }
                    }
                    ".shared" => {
                        let v = parse_var(&mut p, is_extern, pos)?;
                        p.meter.alloc(crate::parse_body::var_bytes(&v))?;
                        module_shared.push(v);
                    }
                    ".global" | ".const" if !is_extern => {
                        let space = if cur == ".const" {
                            Space::Const
                        } else {
                            Space::Global
                        };
                        raw_vars.push(parse_mod_var(&mut p, space, pos)?);
                    }
                    other => return p.unsupported_directive(other),
                }
            }
            other => {
                p.i = p.i.saturating_sub(1);
                return p.unsupported_directive(other);
            }
        }
    }
    // The tokens are done with.
    let Parser {
        toks, mut meter, ..
    } = p;
    drop(toks);
    meter.free(token_bytes);
    Ok(Items {
        version,
        targets,
        module_shared,
        parsed,
        funcs,
        raw_vars,
        meter,
    })
}

/// Parse a whole module within the budgets of `opts`.
pub(crate) fn parse_module(text: &str, opts: &LoadOptions) -> R<Module> {
    let Items {
        module_shared,
        parsed,
        funcs,
        raw_vars,
        mut meter,
        ..
    } = parse_items(text, opts)?;
    let mut entries = Vec::new();
    // Entries are decoded once every function and variable of the module is known.
    let vars = ModMem::build(&raw_vars, &mut meter)?;
    let raw_bytes: u64 = raw_vars.iter().map(|v| v.bytes()).sum();
    drop(raw_vars);
    meter.free(raw_bytes);
    let msyms = ModuleSyms::build(&module_shared, &vars.vars)?;
    meter.alloc(elems::<crate::ir::Entry>(parsed.len()))?;
    entries.reserve_exact(parsed.len());
    for (decls, body) in parsed {
        entries.push(decode::decode_entry(
            decls, body, &funcs, &msyms, &mut meter,
        )?);
    }
    let module = Module {
        entries: std::sync::Arc::new(entries),
        hash: fnv1a(text.as_bytes()),
        vars,
    };
    // Every retained structure was charged while it was built; this holds by construction.
    let held = module.host_bytes();
    if held > opts.max_host_bytes {
        return Err(PtxError::Budget {
            what: "host bytes",
            used: held,
            limit: opts.max_host_bytes,
        });
    }
    log::debug!(
        "module loaded: {} entries, {held} host bytes, load peak {} bytes",
        module.entries.len(),
        meter.peak()
    );
    Ok(module)
}

/// Parse `[.align N] .type name[dims]... [= init]` after `.shared`/`.local` (which is consumed).
pub(crate) fn parse_var(p: &mut Parser, is_extern: bool, pos: Pos) -> R<VarDecl> {
    let mut align = 0u64;
    let mut ty = None;
    loop {
        let t = p.ident()?;
        if t == ".align" {
            align = p.int()?;
            continue;
        }
        if let Some(x) = t.strip_prefix('.').and_then(Ty::from_name) {
            ty = Some(x);
            continue;
        }
        if t == ".v2" || t == ".v4" || t.starts_with('.') {
            return Err(PtxError::UnsupportedDirective { pos, name: t });
        }
        let ty = ty.ok_or(PtxError::Syntax {
            pos,
            msg: "variable without type".into(),
        })?;
        let mut size = u64::from(ty.bytes());
        let mut unsized_ = false;
        while p.eat_punct('[') {
            if p.eat_punct(']') {
                unsized_ = true;
                continue;
            }
            let n = p.int()?;
            p.expect_punct(']')?;
            size = size.saturating_mul(n);
        }
        if p.is_punct('=') {
            return Err(PtxError::UnsupportedDirective {
                pos,
                name: "initialized shared/local variable".into(),
            });
        }
        p.expect_punct(';')?;
        if size > MAX_VAR_BYTES {
            return Err(PtxError::TooLarge {
                pos,
                what: format!("variable `{t}`"),
            });
        }
        if is_extern != unsized_ {
            return p.err("only `.extern` variables may be unsized arrays");
        }
        let align = if align == 0 {
            u64::from(ty.bytes())
        } else {
            align
        };
        if !align.is_power_of_two() || align > 4096 {
            return Err(PtxError::Syntax {
                pos,
                msg: format!("bad alignment {align}"),
            });
        }
        return Ok(VarDecl {
            name: t,
            size: if unsized_ { 0 } else { size },
            align: align as u32,
            is_extern,
            pos,
        });
    }
}

fn parse_param(p: &mut Parser, offset: &mut u64) -> R<ParamInfo> {
    let pos = p.pos();
    if !p.eat_ident(".param") {
        return p.err("expected `.param`");
    }
    let mut align = 0u64;
    let mut ty = None;
    loop {
        let t = p.ident()?;
        match t.as_str() {
            ".align" => align = p.int()?,
            ".ptr" | ".global" | ".shared" | ".const" | ".local" => {}
            _ if t.starts_with('.') => match t.strip_prefix('.').and_then(Ty::from_name) {
                Some(Ty::Pred) | None => {
                    return Err(PtxError::UnsupportedDirective { pos, name: t });
                }
                Some(x) => ty = Some(x),
            },
            _ => {
                let ty = ty.ok_or(PtxError::Syntax {
                    pos,
                    msg: "parameter without type".into(),
                })?;
                let mut size = u64::from(ty.bytes());
                while p.eat_punct('[') {
                    let n = p.int()?;
                    p.expect_punct(']')?;
                    size = size.saturating_mul(n);
                }
                let align = if align == 0 {
                    u64::from(ty.bytes())
                } else {
                    align
                };
                if !align.is_power_of_two() || align > 256 || size > 1 << 16 {
                    return Err(PtxError::TooLarge {
                        pos,
                        what: format!("parameter `{t}`"),
                    });
                }
                let off = offset.div_ceil(align) * align;
                *offset = off + size;
                if *offset > 1 << 16 {
                    return Err(PtxError::TooLarge {
                        pos,
                        what: "parameter list".into(),
                    });
                }
                return Ok(ParamInfo {
                    name: t,
                    offset: off as u32,
                    size: size as u32,
                    align: align as u32,
                });
            }
        }
    }
}

fn dims(p: &mut Parser) -> R<[u32; 3]> {
    let mut d = [1u32; 3];
    for (k, slot) in d.iter_mut().enumerate() {
        if k > 0 && !p.eat_punct(',') {
            break;
        }
        let v = p.int()?;
        *slot = u32::try_from(v).or_else(|_| p.err("dimension too large"))?;
    }
    Ok(d)
}

/// Parse `.func [(rets)] name [(params)] [.noreturn] (; | { body })` after `.func`.
fn parse_func(p: &mut Parser, pos: Pos) -> R<FuncDef> {
    let mut off = 0u64;
    let mut list = |p: &mut Parser| -> R<Vec<String>> {
        let mut v = Vec::new();
        if p.eat_punct('(') && !p.eat_punct(')') {
            loop {
                v.push(parse_param(p, &mut off)?.name);
                if p.eat_punct(')') {
                    break;
                }
                p.expect_punct(',')?;
            }
        }
        Ok(v)
    };
    let rets = if p.is_punct('(') {
        list(p)?
    } else {
        Vec::new()
    };
    let name = p.ident()?;
    let params = list(p)?;
    while p.eat_ident(".noreturn") {}
    let mut decls = EntryDecls {
        name: name.clone(),
        params: Vec::new(),
        param_size: 0,
        reqntid: None,
        maxntid: None,
        shared: Vec::new(),
        local: Vec::new(),
        call_params: Vec::new(),
        call_param_index: HashMap::new(),
        regs: HashMap::new(),
        pos,
        bytes: 0,
    };
    let body = if p.eat_punct(';') {
        None
    } else {
        Some(crate::parse_body::parse_body(p, &mut decls)?)
    };
    let f = FuncDef::new(name, rets, params, decls, body);
    p.meter.alloc(f.local_names_bytes())?;
    Ok(f)
}

fn parse_entry(p: &mut Parser, pos: Pos) -> R<(EntryDecls, Vec<Stmt>)> {
    let name = p.ident()?;
    let mut params = Vec::new();
    let mut offset = 0u64;
    if p.eat_punct('(') && !p.eat_punct(')') {
        loop {
            params.push(parse_param(p, &mut offset)?);
            if p.eat_punct(')') {
                break;
            }
            p.expect_punct(',')?;
        }
    }
    let mut decls = EntryDecls {
        name,
        params,
        param_size: offset as u32,
        reqntid: None,
        maxntid: None,
        shared: Vec::new(),
        local: Vec::new(),
        call_params: Vec::new(),
        call_param_index: HashMap::new(),
        regs: HashMap::new(),
        pos,
        bytes: 0,
    };
    loop {
        if p.is_punct('{') {
            break;
        }
        let dpos = p.pos();
        let d = p.ident()?;
        match d.as_str() {
            ".maxntid" => decls.maxntid = Some(dims(p)?),
            ".reqntid" => decls.reqntid = Some(dims(p)?),
            ".minnctapersm" | ".maxnreg" | ".maxnctapersm" => {
                p.int()?;
            }
            ".noreturn" => {}
            ".pragma" => {
                p.next()?;
                p.expect_punct(';')?;
            }
            _ => {
                return Err(PtxError::UnsupportedDirective { pos: dpos, name: d });
            }
        }
    }
    let body = crate::parse_body::parse_body(p, &mut decls)?;
    Ok((decls, body))
}
