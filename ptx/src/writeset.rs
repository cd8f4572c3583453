//! Which kernel parameters a kernel may store through: the per-launch write set of live
//! snapshots on an engine without a dirty log (issue 17, POS/PhOS: "which parameters are
//! pointers that are stored through"). A forward data-flow analysis over the decoded code (its
//! registers are slots the decoder may reuse, so the analysis follows the control flow): at
//! every instruction each data register holds the set of origins its value may derive from —
//! a parameter loaded with `ld.param`, or `Unknown` (a 64-bit value loaded from memory or
//! returned by an atomic: any pointer) — joined where paths meet, to a fixed point. Values
//! narrower than an address (a `.u32` parameter, a 32-bit load) carry no origin: they are
//! indices and counts, and a pointer assembled from such parts has no origin at all, so a store
//! through it is unbounded. A store, atomic or
//! reduction to global or generic memory whose address derives from exactly one parameter (and
//! nothing unknown) writes through that parameter; any other (an address from memory, from no
//! parameter, or from two) cannot be bounded, and the launch must count as writing everything
//! (`WriteSet::unbounded`), as must a kernel too large for the analysis's budget. Stores to
//! module variables (their own storage, not the VM's memory), shared, local and parameter
//! space are not writes to GPU memory and are left out.
//!
//! Like POS's, the analysis is a speculation about where a store lands: it names the base
//! pointer of each address, and the extent the caller gives each base (its buffer) assumes the
//! index added to it stays inside; as in PhOS that is checked at run time, by the bounds
//! check `crate::ckpt::bounds` inserts. The extent is the caller's decision (docs/snapshot.md,
//! "Live snapshots and VRAM pre-copy"). It is validated against the
//! sim engine's exact dirty log on every suite workload (`pgpu/tests/dirty_log.rs`).

use std::collections::BTreeSet;

use crate::ir::{Inst, Op, Space, Src};
use crate::memory::{MODULE_WINDOW, WINDOW_SIZE};
use crate::module::Module;

/// Origins as bits: bit `i` the `i`th parameter (the first 63), bit 63 unknown.
type Origins = u64;
const UNKNOWN: Origins = 1 << 63;
/// Most register-states (instructions × registers) the analysis keeps, and most instruction
/// visits it makes; past either the kernel counts as unbounded.
const MAX_STATE: usize = 1 << 22;
const MAX_VISITS: usize = 1 << 22;

/// The parameters a kernel may store through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteSet {
    /// Byte offsets (in the parameter buffer) of the parameters whose pointer values reach
    /// the addresses of stores, atomics or reductions to global or generic memory.
    pub params: BTreeSet<u32>,
    /// Some store's address could not be tied to one parameter (or the kernel is too large to
    /// analyse): the launch may write anywhere it can reach.
    pub unbounded: bool,
}

impl WriteSet {
    fn everything() -> Self {
        WriteSet {
            params: BTreeSet::new(),
            unbounded: true,
        }
    }
}

fn of(st: &[Origins], s: &Src) -> Origins {
    match s {
        Src::Reg(r) => st.get(*r as usize).copied().unwrap_or(UNKNOWN),
        Src::Imm(_) | Src::Sreg(_) => 0,
    }
}

/// Applies `op` to the register state `st` (`param_bit`: the origin bit of a parameter-buffer
/// byte offset).
fn transfer(op: &Op, st: &mut [Origins], param_bit: &dyn Fn(u64) -> Origins) {
    let set = |st: &mut [Origins], d: u32, v: Origins| {
        if let Some(slot) = st.get_mut(d as usize) {
            // A predicated write may not happen: keep what was there too.
            *slot = if op.guard.is_some() { *slot | v } else { v };
        }
    };
    match &op.inst {
        Inst::Un { d, a, .. } | Inst::Cvt { d, a, .. } | Inst::Cvta { d, a, .. } => {
            let v = of(st, a);
            set(st, *d, v);
        }
        Inst::Shfl { d, a, .. } => {
            let v = of(st, a);
            set(st, *d, v);
        }
        Inst::Bin { d, a, b, .. } | Inst::Selp { d, a, b, .. } => {
            let v = of(st, a) | of(st, b);
            set(st, *d, v);
        }
        Inst::Ter { d, a, b, c, .. }
        | Inst::Carry { d, a, b, c, .. }
        | Inst::Prmt { d, a, b, c }
        | Inst::Slct { d, a, b, c, .. } => {
            let v = of(st, a) | of(st, b) | of(st, c);
            set(st, *d, v);
        }
        Inst::Bfi { d, a, b, c, e, .. } => {
            let v = of(st, a) | of(st, b) | of(st, c) | of(st, e);
            set(st, *d, v);
        }
        Inst::Pack { d, parts, .. } => {
            let v = parts.iter().fold(0, |v, p| v | of(st, p));
            set(st, *d, v);
        }
        Inst::Unpack { ds, a, .. } => {
            let v = of(st, a);
            for d in ds {
                set(st, *d, v);
            }
        }
        Inst::Ld {
            space,
            ty,
            n,
            d,
            base,
            off,
            ..
        } => {
            // Narrower than an address: an index or a count, not a pointer (a pointer made of
            // such parts has no origin at all, which makes a store through it unbounded).
            let v = match (space, base) {
                _ if ty.bytes() < 8 => 0,
                (Space::Param, Src::Imm(b)) => param_bit(b.wrapping_add(*off as u64)),
                _ => UNKNOWN,
            };
            for r in d.iter().take(*n as usize) {
                set(st, *r, v);
            }
        }
        Inst::Atom { d: Some(d), ty, .. } => {
            set(st, *d, if ty.bytes() < 8 { 0 } else { UNKNOWN });
        }
        // Everything else writes predicates or values made of no pointer (comparisons,
        // votes, reductions of lanes, the active mask), or nothing.
        Inst::Set { d, .. } | Inst::Redux { d, .. } | Inst::Activemask { d } => set(st, *d, 0),
        // The rest write predicates (or, for `vote`/`match`, a register that may be either:
        // left as it was, which over-approximates), or nothing.
        _ => {}
    }
}

/// Where control may go after instruction `pc`.
fn successors(op: &Op, pc: usize, len: usize, out: &mut Vec<usize>) {
    out.clear();
    let guarded = op.guard.is_some();
    match op.inst {
        Inst::Bra { target } => {
            out.push(target as usize);
            if guarded {
                out.push(pc + 1);
            }
        }
        Inst::Exit | Inst::Trap => {
            if guarded {
                out.push(pc + 1);
            }
        }
        _ => out.push(pc + 1),
    }
    out.retain(|&s| s < len);
}

impl Module {
    /// The write set of entry `name` (`None` if there is no such entry).
    pub fn write_set(&self, name: &str) -> Option<WriteSet> {
        let e = self.entries.iter().find(|e| e.info.name == name)?;
        let (n, len) = (e.nregs as usize, e.code.len());
        if n.saturating_mul(len + 1) > MAX_STATE {
            return Some(WriteSet::everything());
        }
        let params = &e.info.params;
        let param_bit = |at: u64| -> Origins {
            match params.iter().position(|p| {
                (u64::from(p.offset)..u64::from(p.offset) + u64::from(p.size)).contains(&at)
            }) {
                Some(i) if i < 63 => 1 << i,
                _ => UNKNOWN,
            }
        };
        // The state before each instruction (None: not reached yet).
        let mut states: Vec<Option<Vec<Origins>>> = vec![None; len];
        if len > 0 {
            states[0] = Some(vec![0; n]);
        }
        let mut work = vec![0usize];
        let mut succ = Vec::new();
        let mut visits = 0;
        while let Some(pc) = work.pop() {
            visits += 1;
            if visits > MAX_VISITS {
                return Some(WriteSet::everything());
            }
            let Some(mut st) = states.get(pc).and_then(Clone::clone) else {
                continue;
            };
            transfer(&e.code[pc], &mut st, &param_bit);
            successors(&e.code[pc], pc, len, &mut succ);
            for &s in &succ {
                match &mut states[s] {
                    Some(old) => {
                        let mut changed = false;
                        for (o, v) in old.iter_mut().zip(&st) {
                            if *o | v != *o {
                                *o |= v;
                                changed = true;
                            }
                        }
                        if changed {
                            work.push(s);
                        }
                    }
                    slot @ None => {
                        *slot = Some(st.clone());
                        work.push(s);
                    }
                }
            }
        }
        let mut ws = WriteSet::default();
        for (op, st) in e.code.iter().zip(&states) {
            let (space, base, off) = match &op.inst {
                Inst::St {
                    space, base, off, ..
                }
                | Inst::Atom {
                    space, base, off, ..
                } => (*space, base, *off),
                _ => continue,
            };
            let Some(st) = st else { continue }; // never reached
            if !matches!(space, Space::Global | Space::Generic) {
                continue;
            }
            let from = of(st, base);
            let module_var = matches!(base, Src::Imm(a)
                if a.wrapping_add(off as u64).wrapping_sub(MODULE_WINDOW) < WINDOW_SIZE);
            if from & UNKNOWN == 0 && from.count_ones() == 1 {
                let i = from.trailing_zeros() as usize;
                ws.params.insert(params[i].offset);
            } else if !(from == 0 && module_var) {
                ws.unbounded = true;
            }
        }
        Some(ws)
    }
}

#[cfg(test)]
mod tests {
    use crate::parse;

    const HEAD: &str = ".version 7.0\n.target sm_70\n.address_size 64\n";

    fn ws(body: &str) -> super::WriteSet {
        let text = format!(
            "{HEAD}.visible .entry k(.param .u64 a, .param .u64 b, .param .u32 n)\n{{\n{body}\n}}\n"
        );
        let m = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        m.write_set("k").unwrap()
    }

    const REGS: &str = ".reg .b64 %rd<10>;\n.reg .b32 %r<10>;\n";

    #[test]
    fn stores_through_parameters_are_found() {
        // b written (through arithmetic and cvta), a only read.
        let w = ws(&format!(
            "{REGS}ld.param.u64 %rd1, [a];\nld.param.u64 %rd2, [b];\nld.param.u32 %r1, [n];\n\
             cvta.to.global.u64 %rd3, %rd2;\nmov.u32 %r2, %tid.x;\nmul.wide.u32 %rd4, %r2, 4;\n\
             add.s64 %rd5, %rd3, %rd4;\nld.global.u32 %r3, [%rd1];\nst.global.u32 [%rd5+8], %r3;\n\
             atom.global.add.u32 %r4, [%rd3], %r1;\nret;"
        ));
        assert_eq!(w.params.into_iter().collect::<Vec<_>>(), vec![8]);
        assert!(!w.unbounded);
    }

    #[test]
    fn indices_loaded_from_memory_or_parameters_keep_the_base() {
        // A 32-bit index read from a (CSR-like) array, scaled, added to b: b's buffer.
        let w = ws(&format!(
            "{REGS}ld.param.u64 %rd1, [a];\nld.param.u64 %rd2, [b];\nld.param.u32 %r2, [n];\n\
             ld.global.u32 %r1, [%rd1];\nadd.u32 %r1, %r1, %r2;\nmul.wide.u32 %rd3, %r1, 4;\n\
             add.s64 %rd4, %rd2, %rd3;\nst.global.u32 [%rd4], 1;\nret;"
        ));
        assert_eq!(w.params.into_iter().collect::<Vec<_>>(), vec![8]);
        assert!(!w.unbounded);
    }

    #[test]
    fn addresses_from_memory_or_from_nowhere_are_unbounded() {
        // A pointer loaded from memory (pointer chasing).
        let w = ws(&format!(
            "{REGS}ld.param.u64 %rd1, [a];\nld.global.u64 %rd2, [%rd1];\n\
             st.global.u32 [%rd2], 1;\nret;"
        ));
        assert!(w.unbounded);
        // An address made of no parameter.
        let w = ws(&format!(
            "{REGS}mov.u64 %rd1, 4096;\nst.global.u32 [%rd1], 1;\nret;"
        ));
        assert!(w.unbounded);
        // Two parameters mixed into one address.
        let w = ws(&format!(
            "{REGS}ld.param.u64 %rd1, [a];\nld.param.u64 %rd2, [b];\n\
             add.s64 %rd3, %rd1, %rd2;\nst.global.u32 [%rd3], 1;\nret;"
        ));
        assert!(w.unbounded);
        // A register reassigned in a loop keeps every origin it ever had.
        let w = ws(&format!(
            "{REGS}.reg .pred %p<2>;\nld.param.u64 %rd1, [a];\nmov.u64 %rd2, %rd1;\n\
             L: st.global.u32 [%rd2], 1;\nld.global.u64 %rd2, [%rd2];\n\
             setp.ne.u64 %p1, %rd2, 0;\n@%p1 bra L;\nret;"
        ));
        assert!(w.unbounded);
    }

    #[test]
    fn shared_and_local_stores_are_not_memory_writes() {
        let w = ws(&format!(
            "{REGS}.shared .u32 s[32];\nmov.u32 %r1, %tid.x;\nst.shared.u32 [s], %r1;\nret;"
        ));
        assert!(w.params.is_empty() && !w.unbounded, "{w:?}");
    }
}
