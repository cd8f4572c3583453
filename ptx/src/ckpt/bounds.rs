//! The run-time validation of write sets (PhOS-style): a PTX-to-PTX transformation that makes
//! every store, atomic and reduction of a kernel through global or generic memory check its
//! address against the extents of the launch's write-set parameters, and raise a flag word when
//! it falls outside all of them. The store itself still happens (the kernel's semantics do not
//! change); the device reads the flag after the job and, if it is set, treats that round of the
//! live copy as conservative (docs/snapshot.md, "Live snapshots and VRAM pre-copy").
//!
//! Works on the statement IR of `ckpt::module` (parsed, calls inlined) and prints PTX back with
//! `ckpt::print`, never by editing text. Per checked entry the parameter list grows by
//! `__ws_flag` (`.u64`, the flag word's address: the kernel stores `1` there, `st.global.u32`,
//! reading the address from the parameter at each such store and storing nothing when it is 0)
//! and one `__ws_lo<k>`, `__ws_hi<k>` pair (`.u64`) per write-set parameter `k` (in the order of
//! [`CheckedEntry::params`]): a store of `w` bytes at `a` is inside when `lo_k <= a` and
//! `a + w <= hi_k` for some `k`. An entry whose write set is unbounded (it counts as writing
//! everything anyway) is left as it was and not listed.

use std::collections::HashSet;

use thiserror::Error;

use super::module::{self, StmtEntry};
use crate::decode::{ROp, RawInst, Stmt};
use crate::error::{Pos, PtxError};
use crate::ir::Ty;
use crate::load::LoadOptions;
use crate::module::ParamInfo;

/// Name of the flag parameter appended to a checked entry.
pub const FLAG_PARAM: &str = "__ws_flag";
/// The register that holds the flag's address between its load and the flag store (never
/// live at a preemption point: `ckpt::points`).
pub const FLAG_REG: &str = "%__ws_f";
/// The reserved prefix of the names this transformation adds.
const PREFIX: &str = "__ws_";

/// Why a module cannot be checked.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BoundsError {
    /// The text is not in the subset (or over a loading budget).
    #[error("not loadable: {0}")]
    Parse(#[from] PtxError),
    /// A name of the module uses the transformation's reserved prefix.
    #[error("entry `{entry}`: name `{name}` uses the reserved prefix `__ws_`")]
    ReservedName { entry: String, name: String },
    /// A checked store's address is not a 64-bit register plus an offset (which the write-set
    /// analysis would have called unbounded: a disagreement, refused rather than guessed).
    #[error("entry `{entry}` line {line}: store address `{what}` is not a 64-bit register")]
    Address {
        entry: String,
        line: u32,
        what: String,
    },
    /// The printed module did not load again (a bug of the transformation).
    #[error("internal: the checked module does not load: {0}")]
    Internal(String),
}

/// One checked entry and its extra parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedEntry {
    /// Entry name.
    pub name: String,
    /// Byte offsets (in the guest's parameter buffer) of the write-set parameters, the order of
    /// the `lo`/`hi` pairs.
    pub params: Vec<u32>,
    /// Size of the entry's own parameters (the guest's buffer is zero-padded up to
    /// `flag_off`).
    pub own_size: u32,
    /// Offset of `__ws_flag`; pair `k` follows at `flag_off + 8 + 16 k` (lo) and `+ 8` (hi).
    pub flag_off: u32,
    /// Size of the whole parameter buffer of the checked entry.
    pub param_size: u32,
    /// Stores, atomics and reductions checked.
    pub checked: u32,
}

impl CheckedEntry {
    /// The checked entry's parameter buffer: the guest's `own` parameters, the flag word's
    /// address and one `[lo, hi)` per write-set parameter (`ranges`, in [`Self::params`] order).
    pub fn buffer(&self, own: &[u8], flag: u64, ranges: &[(u64, u64)]) -> Vec<u8> {
        let mut b = own.to_vec();
        b.resize(self.flag_off as usize, 0);
        b.extend_from_slice(&flag.to_le_bytes());
        for k in 0..self.params.len() {
            let (lo, hi) = ranges.get(k).copied().unwrap_or((0, 0));
            b.extend_from_slice(&lo.to_le_bytes());
            b.extend_from_slice(&hi.to_le_bytes());
        }
        b.resize(self.param_size as usize, 0);
        b
    }
}

/// A checked module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The PTX to load.
    pub ptx: String,
    /// The entries that check (the others are unchanged: their write sets are unbounded).
    pub entries: Vec<CheckedEntry>,
}

impl Checked {
    /// The checked entry `name`, if it checks.
    pub fn entry(&self, name: &str) -> Option<&CheckedEntry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// The offset of the flag parameter ([`FLAG_PARAM`]) of `entry` in checked module `text`:
/// where a suspended run of it gets the flag word of the engine that resumes it. `None` when
/// the text does not parse or the entry has no such parameter (not a checked entry).
pub fn flag_offset(text: &str, entry: &str) -> Option<u32> {
    let m = crate::parse(text).ok()?;
    let e = m.entry(entry)?;
    e.params
        .iter()
        .find(|p| p.name == FLAG_PARAM && p.size == 8)
        .map(|p| p.offset)
}

/// Transforms `text` (within the budgets of `opts`): every entry with a bounded write set
/// checks its stores.
pub fn transform(text: &str, opts: &LoadOptions) -> Result<Checked, BoundsError> {
    let analysed = crate::parse_with(text, opts)?;
    let mut m = module::load(text, opts)?;
    let vars: HashSet<String> = m.vars.iter().map(|v| v.name.clone()).collect();
    let mut entries = Vec::new();
    for e in &mut m.entries {
        let Some(ws) = analysed.write_set(&e.decls.name) else {
            continue;
        };
        if ws.unbounded {
            continue;
        }
        entries.push(check_entry(e, ws.params.into_iter().collect(), &vars)?);
    }
    let ptx = super::print::module(&m);
    crate::parse_with(&ptx, opts).map_err(|e| BoundsError::Internal(e.to_string()))?;
    Ok(Checked { ptx, entries })
}

/// Base opcode, whether the space is global or generic, the byte width of the access, and
/// the index of its address operand: for `st`, `atom` and `red`, else `None`.
fn store_shape(opcode: &str) -> Option<(bool, u64, usize)> {
    let mut parts = opcode.split('.');
    let base = parts.next()?;
    let addr = match base {
        "st" | "red" => 0,
        "atom" => 1,
        _ => return None,
    };
    let (mut memory, mut n, mut ty) = (true, 1u64, None);
    for p in parts {
        match p {
            "v2" => n = 2,
            "v4" => n = 4,
            _ if ["shared", "local", "param", "const"]
                .iter()
                .any(|s| p.starts_with(s)) =>
            {
                memory = false
            }
            _ => {
                if let Some(t) = crate::ir::Ty::from_name(p) {
                    ty = Some(t);
                }
            }
        }
    }
    let bytes = ty.map_or(16, |t: Ty| u64::from(t.bytes()));
    Some((memory, n * bytes, addr))
}

struct Emit {
    out: Vec<Stmt>,
    pos: Pos,
    labels: u32,
}

fn r(n: &str) -> ROp {
    ROp::Name(n.to_string(), Pos::default())
}

impl Emit {
    fn i(&mut self, op: &str, ops: Vec<ROp>) {
        self.g(None, op, ops);
    }
    fn g(&mut self, guard: Option<(String, bool)>, op: &str, ops: Vec<ROp>) {
        self.out.push(Stmt::Inst(RawInst {
            pos: self.pos,
            guard: guard.map(|(g, neg)| (g, neg, Pos::default())),
            opcode: op.to_string(),
            ops,
        }));
    }
}

fn check_entry(
    e: &mut StmtEntry,
    params: Vec<u32>,
    vars: &HashSet<String>,
) -> Result<CheckedEntry, BoundsError> {
    let name = e.decls.name.clone();
    let d = &mut e.decls;
    let labels = e.body.iter().filter_map(|s| match s {
        Stmt::Label(l, _) => Some(l),
        Stmt::Inst(_) => None,
    });
    if let Some(n) = d
        .regs
        .keys()
        .chain(d.params.iter().map(|p| &p.name))
        .chain(d.shared.iter().map(|v| &v.name))
        .chain(d.local.iter().map(|v| &v.name))
        .chain(labels)
        .find(|n| n.trim_start_matches(['%', '$']).starts_with(PREFIX))
    {
        return Err(BoundsError::ReservedName {
            entry: name,
            name: n.clone(),
        });
    }
    // Parameters: the flag pointer, then a [lo, hi) pair per write-set parameter.
    let own_size = d.param_size;
    let flag_off = own_size.next_multiple_of(8);
    let mut extra = vec![FLAG_PARAM.to_string()];
    for k in 0..params.len() {
        extra.push(format!("{PREFIX}lo{k}"));
        extra.push(format!("{PREFIX}hi{k}"));
    }
    for (k, p) in extra.iter().enumerate() {
        d.params.push(ParamInfo {
            name: p.clone(),
            offset: flag_off + 8 * k as u32,
            size: 8,
            align: 8,
        });
        if k > 0 {
            d.regs.insert(format!("%{p}"), Ty::U64);
        }
    }
    d.param_size = flag_off + 8 * extra.len() as u32;
    for n in ["a", "e", "f"] {
        d.regs.insert(format!("%{PREFIX}{n}"), Ty::U64);
    }
    for n in ["p", "q"] {
        d.regs.insert(format!("%{PREFIX}{n}"), Ty::Pred);
    }
    let body = std::mem::take(&mut e.body);
    let mut g = Emit {
        out: Vec::with_capacity(body.len() + 8),
        pos: d.pos,
        labels: 0,
    };
    // Prologue: the extents in registers. The flag's address is read from its parameter where
    // a store flags (`check`): no register holds it across the kernel, so a preempted run's
    // saved registers never carry it, and the device can re-point a suspended run's flag
    // parameter at a word of the engine that resumes it (or at 0: no flag).
    for p in extra.iter().skip(1) {
        g.i(
            "ld.param.u64",
            vec![
                r(&format!("%{p}")),
                ROp::Addr {
                    base: Some(p.clone()),
                    off: 0,
                    pos: Pos::default(),
                },
            ],
        );
    }
    let mut checked = 0u32;
    for st in body {
        let Stmt::Inst(inst) = &st else {
            g.out.push(st);
            continue;
        };
        let Some((true, width, at)) = store_shape(&inst.opcode) else {
            g.out.push(st);
            continue;
        };
        let line = inst.pos.line;
        let bad = |what: String| BoundsError::Address {
            entry: name.clone(),
            line,
            what,
        };
        let (base, off) = match inst.ops.get(at) {
            Some(ROp::Addr {
                base: Some(b), off, ..
            }) => (b.clone(), *off),
            other => return Err(bad(format!("{other:?}"))),
        };
        if vars.contains(&base) {
            // A module variable: its own storage, not the VM's memory (not in write sets).
            g.out.push(st);
            continue;
        }
        match d.regs.get(&base) {
            Some(Ty::U64 | Ty::S64 | Ty::B64) => {}
            _ => return Err(bad(base)),
        }
        g.pos = inst.pos;
        checked += 1;
        let skip = inst.guard.as_ref().map(|(gr, neg, _)| {
            g.labels += 1;
            let l = format!("${PREFIX}L{}", g.labels);
            g.g(Some((gr.clone(), !neg)), "bra", vec![r(&l)]);
            l
        });
        check(&mut g, &base, off, width, params.len());
        if let Some(l) = skip {
            g.out.push(Stmt::Label(l, inst.pos));
        }
        g.out.push(st);
    }
    e.body = g.out;
    Ok(CheckedEntry {
        name,
        params,
        own_size,
        flag_off,
        param_size: d.param_size,
        checked,
    })
}

/// `%__ws_p` = the `width`-byte access at `[base + off]` lies outside every `[lo_k, hi_k)`;
/// then the flag's address read from its parameter and, under `%__ws_p`, the flag store unless
/// that address is 0.
fn check(g: &mut Emit, base: &str, off: i64, width: u64, ranges: usize) {
    let (a, e, f, p, q) = ("%__ws_a", "%__ws_e", FLAG_REG, "%__ws_p", "%__ws_q");
    g.i("add.s64", vec![r(a), r(base), ROp::Int(off as u64)]);
    g.i("add.s64", vec![r(e), r(a), ROp::Int(width)]);
    for k in 0..ranges {
        let dst = if k == 0 { p } else { q };
        g.i(
            "setp.lt.u64",
            vec![r(dst), r(a), r(&format!("%{PREFIX}lo{k}"))],
        );
        g.i(
            "setp.gt.or.u64",
            vec![r(dst), r(e), r(&format!("%{PREFIX}hi{k}")), r(dst)],
        );
        if k > 0 {
            g.i("and.pred", vec![r(p), r(p), r(q)]);
        }
    }
    if ranges == 0 {
        // No write-set parameter but a store: every such store is outside.
        g.i("setp.eq.u64", vec![r(p), r(a), r(a)]);
    }
    // The load is not guarded: a guarded definition would keep the register live back to the
    // kernel's entry (it kills nothing), and no preemption point could be placed.
    let under_p = || Some((p.to_string(), false));
    g.i(
        "ld.param.u64",
        vec![
            r(f),
            ROp::Addr {
                base: Some(FLAG_PARAM.to_string()),
                off: 0,
                pos: Pos::default(),
            },
        ],
    );
    g.g(under_p(), "setp.ne.u64", vec![r(p), r(f), ROp::Int(0)]);
    g.g(
        under_p(),
        "st.global.u32",
        vec![
            ROp::Addr {
                base: Some(f.to_string()),
                off: 0,
                pos: Pos::default(),
            },
            ROp::Int(1),
        ],
    );
}
