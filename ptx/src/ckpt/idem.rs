//! Whether an entry is *idempotent*, so that a preempted thread (a whole CTA or warp for those
//! classes) may be stopped without saving anything and rerun from the start (the `restart`
//! method, REEF-style): no global atomic or reduction, and no parameter both read and written
//! through. A flow-insensitive origin analysis on the statement IR: a 64-bit register's
//! origins are the pointer parameters (`ld.param` of 8 bytes) its definitions derive from,
//! joined over every definition, to a fixed point; a 64-bit value loaded from memory is an
//! unknown pointer, and narrower values (indices) carry none. Every global or generic load
//! then reads through its address's origins and every store writes through them; an address
//! with no origin or an unknown one refuses. Two parameters holding overlapping buffers at run
//! time would defeat the per-parameter test: the engines compare the pointer values of the
//! read and written parameters at each launch ([`Idempotence::reads`], `writes`).

use std::collections::HashMap;

use super::flow::base;
use super::module::StmtEntry;
use crate::decode::{ROp, Stmt};
use crate::ir::Ty;

/// The verdict on one entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Idempotence {
    /// Whether a thread may be rerun from the start (see the module documentation).
    pub idempotent: bool,
    /// Why not (empty when it is).
    pub reason: String,
    /// Parameter-buffer offsets of the pointer parameters loaded through.
    pub reads: Vec<u32>,
    /// Parameter-buffer offsets of the pointer parameters stored through.
    pub writes: Vec<u32>,
}

const UNKNOWN: u64 = 1 << 63;

fn space(op: &str) -> &'static str {
    for m in op.split('.') {
        match m {
            "global" => return "global",
            "shared" => return "shared",
            "local" => return "local",
            "param" => return "param",
            "const" => return "const",
            _ => {}
        }
    }
    "generic"
}

fn names(o: &ROp, out: &mut Vec<String>) {
    match o {
        ROp::Name(n, _) | ROp::Not(n, _) => out.push(n.clone()),
        ROp::Addr { base: Some(n), .. } => out.push(n.clone()),
        ROp::Pair(a, b, _) => {
            out.push(a.clone());
            out.push(b.clone());
        }
        ROp::Vec(v) | ROp::List(v) => v.iter().for_each(|x| names(x, out)),
        _ => {}
    }
}

/// The idempotence of entry `e` (inlined). `work` bounds the fixed point (iterations over
/// the body); past it the entry counts as not idempotent.
pub(crate) fn analyse(e: &StmtEntry, max_rounds: usize) -> Idempotence {
    let d = &e.decls;
    let no = |r: &str| Idempotence {
        reason: r.chars().take(200).collect(),
        ..Idempotence::default()
    };
    let pbit: HashMap<&str, u64> = d
        .params
        .iter()
        .enumerate()
        .filter(|(i, p)| *i < 63 && p.size == 8)
        .map(|(i, p)| (p.name.as_str(), 1u64 << i))
        .collect();
    let wide = |r: &str| {
        d.regs
            .get(r)
            .is_some_and(|t| matches!(t, Ty::B64 | Ty::U64 | Ty::S64))
    };
    let insts: Vec<&crate::decode::RawInst> = e
        .body
        .iter()
        .filter_map(|s| match s {
            Stmt::Inst(i) => Some(i),
            Stmt::Label(..) => None,
        })
        .collect();
    let mut org: HashMap<String, u64> = HashMap::new();
    let mut srcs = Vec::new();
    for round in 0.. {
        if round >= max_rounds {
            return no("analysis budget");
        }
        let mut changed = false;
        for i in &insts {
            let b = base(&i.opcode);
            if matches!(b, "st" | "red" | "bra" | "ret" | "exit" | "bar" | "barrier") {
                continue;
            }
            let Some(ROp::Name(dst, _)) = i.ops.first() else {
                continue;
            };
            if !wide(dst) {
                continue;
            }
            let v = if b == "ld" {
                match (space(&i.opcode), i.ops.get(1)) {
                    ("param", Some(ROp::Addr { base: Some(p), .. })) => {
                        pbit.get(p.as_str()).copied().unwrap_or(UNKNOWN)
                    }
                    _ => UNKNOWN,
                }
            } else if b == "atom" {
                UNKNOWN
            } else {
                srcs.clear();
                i.ops[1..].iter().for_each(|o| names(o, &mut srcs));
                srcs.iter()
                    .fold(0, |a, s| a | org.get(s).copied().unwrap_or(0))
            };
            let slot = org.entry(dst.clone()).or_insert(0);
            if *slot | v != *slot {
                *slot |= v;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let (mut reads, mut writes) = (0u64, 0u64);
    for i in &insts {
        let b = base(&i.opcode);
        let sp = space(&i.opcode);
        if !matches!(sp, "global" | "generic") {
            continue;
        }
        let addr = match b {
            "atom" | "red" | "cp" | "sust" | "suld" | "tex" => {
                return no(&format!("line {}: global `{}`", i.pos.line, i.opcode));
            }
            "ld" => i.ops.get(1),
            "st" => i.ops.first(),
            _ => continue,
        };
        let from = match addr {
            Some(ROp::Addr { base: Some(r), .. }) if d.regs.contains_key(r) => {
                org.get(r).copied().unwrap_or(0)
            }
            // A module variable or a literal address: not a parameter's buffer.
            _ => UNKNOWN,
        };
        if from == 0 || from & UNKNOWN != 0 {
            return no(&format!(
                "line {}: `{}` through an address of no known parameter",
                i.pos.line, i.opcode
            ));
        }
        if b == "ld" {
            reads |= from;
        } else {
            writes |= from;
        }
    }
    let offs = |m: u64| -> Vec<u32> {
        d.params
            .iter()
            .enumerate()
            .filter(|(k, _)| *k < 63 && m & (1 << k) != 0)
            .map(|(_, p)| p.offset)
            .collect()
    };
    if reads & writes != 0 {
        let p = d
            .params
            .iter()
            .enumerate()
            .find(|(k, _)| *k < 63 && reads & writes & (1 << k) != 0)
            .map_or("?", |(_, p)| p.name.as_str());
        return no(&format!("parameter `{p}` is read and written through"));
    }
    Idempotence {
        idempotent: true,
        reason: String::new(),
        reads: offs(reads),
        writes: offs(writes),
    }
}
