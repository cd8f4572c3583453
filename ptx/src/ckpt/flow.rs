//! Control flow and liveness on the statement-level IR of one (inlined) entry: the
//! instructions in order, each one's register definitions and uses (guards, vector operands,
//! address bases, `d|p` pairs and the hidden carry flag counted), its successors, and the
//! registers live before each instruction (backward dataflow on bit sets).

use std::collections::HashMap;

use super::budget::{Budget, Unsupported};
use crate::decode::{EntryDecls, ROp, RawInst, Stmt};
use crate::ir::Ty;

/// Dense register numbering of one entry; the carry flag CC.CF is the last index.
pub(crate) struct Regs {
    pub names: Vec<String>,
    pub tys: Vec<Ty>,
    index: HashMap<String, u32>,
}

impl Regs {
    pub(crate) fn new(decls: &EntryDecls) -> Regs {
        let mut names: Vec<String> = decls.regs.keys().cloned().collect();
        names.sort();
        let tys = names.iter().map(|n| decls.regs[n]).collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(k, n)| (n.clone(), k as u32))
            .collect();
        Regs { names, tys, index }
    }

    /// Index of a register name (not a symbol, special register or label).
    pub(crate) fn get(&self, n: &str) -> Option<u32> {
        self.index.get(n).copied()
    }

    /// The carry flag's index.
    pub(crate) fn cf(&self) -> u32 {
        self.names.len() as u32
    }

    /// Registers and the carry flag.
    pub(crate) fn count(&self) -> usize {
        self.names.len() + 1
    }
}

/// How control leaves an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    Next,
    /// Branch to an instruction index (`n` = the end of the body).
    Branch(usize),
    /// `ret`/`exit`/`trap`.
    Stop,
}

/// One instruction with its flow facts.
pub(crate) struct Node {
    /// Index of the statement in the body.
    pub stmt: usize,
    pub exit: Exit,
    pub guarded: bool,
    pub defs: Vec<u32>,
    pub uses: Vec<u32>,
}

/// Opcode bases without a destination operand.
const NO_DEST: &[&str] = &[
    "st",
    "red",
    "bra",
    "membar",
    "fence",
    "ret",
    "exit",
    "trap",
    "nanosleep",
    "prefetch",
    "prefetchu",
    "nop",
];

/// Opcode base (before the first `.`).
pub(crate) fn base(op: &str) -> &str {
    op.split('.').next().unwrap_or("")
}

fn has_dest(i: &RawInst) -> bool {
    let b = base(&i.opcode);
    if matches!(b, "bar" | "barrier") {
        return i.opcode.split('.').any(|m| m == "red");
    }
    !NO_DEST.contains(&b)
}

fn names_in(o: &ROp, regs: &Regs, out: &mut Vec<u32>) {
    match o {
        ROp::Name(n, _) | ROp::Not(n, _) => out.extend(regs.get(n)),
        ROp::Addr { base: Some(n), .. } => out.extend(regs.get(n)),
        ROp::Pair(a, b, _) => {
            out.extend(regs.get(a));
            out.extend(regs.get(b));
        }
        ROp::Vec(v) | ROp::List(v) => v.iter().for_each(|x| names_in(x, regs, out)),
        _ => {}
    }
}

/// Registers an instruction defines and uses.
pub(crate) fn def_use(i: &RawInst, regs: &Regs) -> (Vec<u32>, Vec<u32>) {
    let mut defs = Vec::new();
    let mut uses = Vec::new();
    if let Some((g, _, _)) = &i.guard {
        uses.extend(regs.get(g));
    }
    for (k, o) in i.ops.iter().enumerate() {
        if k == 0 && has_dest(i) {
            match o {
                // A destination's address base (none in the subset) would still be a use.
                ROp::Addr { .. } => names_in(o, regs, &mut uses),
                _ => names_in(o, regs, &mut defs),
            }
        } else {
            names_in(o, regs, &mut uses);
        }
    }
    if i.opcode.split('.').any(|m| m == "cc") {
        defs.push(regs.cf());
    }
    if matches!(base(&i.opcode), "addc" | "subc" | "madc") {
        uses.push(regs.cf());
    }
    (defs, uses)
}

/// The instructions of a body with their flow facts.
pub(crate) struct Flow {
    pub nodes: Vec<Node>,
}

impl Flow {
    pub(crate) fn build(body: &[Stmt], regs: &Regs, b: &mut Budget) -> Result<Flow, Unsupported> {
        let mut labels = HashMap::new();
        let mut n = 0usize;
        for s in body {
            b.work(1)?;
            match s {
                Stmt::Label(l, _) => {
                    labels.insert(l.clone(), n);
                }
                Stmt::Inst(_) => n += 1,
            }
        }
        let mut nodes = Vec::with_capacity(n);
        for (k, s) in body.iter().enumerate() {
            let Stmt::Inst(i) = s else { continue };
            b.work(1 + i.ops.len() as u64)?;
            let (defs, uses) = def_use(i, regs);
            let exit = match base(&i.opcode) {
                "bra" => match i.ops.first() {
                    Some(ROp::Name(l, _)) => match labels.get(l) {
                        Some(&t) => Exit::Branch(t),
                        None => return Err(Unsupported::IndirectBranch { line: i.pos.line }),
                    },
                    _ => return Err(Unsupported::IndirectBranch { line: i.pos.line }),
                },
                "ret" | "exit" | "trap" => Exit::Stop,
                _ => Exit::Next,
            };
            nodes.push(Node {
                stmt: k,
                exit,
                guarded: i.guard.is_some(),
                defs,
                uses,
            });
        }
        Ok(Flow { nodes })
    }

    /// Successors of instruction `i` (`len()` = the end, an implicit exit: none).
    pub(crate) fn succs(&self, i: usize, out: &mut Vec<usize>) {
        out.clear();
        let n = self.nodes.len();
        let node = &self.nodes[i];
        match node.exit {
            Exit::Next => out.push(i + 1),
            Exit::Branch(t) => {
                out.push(t);
                if node.guarded {
                    out.push(i + 1);
                }
            }
            Exit::Stop => {
                if node.guarded {
                    out.push(i + 1);
                }
            }
        }
        out.retain(|&s| s < n);
    }

    /// Predecessor lists.
    pub(crate) fn preds(&self, b: &mut Budget) -> Result<Vec<Vec<u32>>, Unsupported> {
        let mut preds = vec![Vec::new(); self.nodes.len()];
        let mut tmp = Vec::new();
        for i in 0..self.nodes.len() {
            b.work(2)?;
            self.succs(i, &mut tmp);
            for &s in &tmp {
                preds[s].push(i as u32);
            }
        }
        Ok(preds)
    }
}

/// A fixed-width bit set per instruction, stored flat.
pub(crate) struct BitRows {
    pub words: usize,
    pub bits: Vec<u64>,
}

impl BitRows {
    pub(crate) fn new(rows: usize, width: usize, b: &mut Budget) -> Result<BitRows, Unsupported> {
        let words = width.div_ceil(64).max(1);
        let total = rows.saturating_mul(words);
        b.memory(total as u64 * 8)?;
        Ok(BitRows {
            words,
            bits: vec![0; total],
        })
    }

    pub(crate) fn row(&self, r: usize) -> &[u64] {
        &self.bits[r * self.words..(r + 1) * self.words]
    }

    pub(crate) fn row_mut(&mut self, r: usize) -> &mut [u64] {
        &mut self.bits[r * self.words..(r + 1) * self.words]
    }
}

pub(crate) fn set(row: &mut [u64], i: u32) {
    row[i as usize / 64] |= 1 << (i % 64);
}

pub(crate) fn clear(row: &mut [u64], i: u32) {
    row[i as usize / 64] &= !(1 << (i % 64));
}

pub(crate) fn test(row: &[u64], i: u32) -> bool {
    row[i as usize / 64] >> (i % 64) & 1 == 1
}

/// Registers live before each instruction: `live[i] = uses(i) ∪ (∪ live[succ] − kills(i))`,
/// where a guarded definition kills nothing.
pub(crate) fn liveness(flow: &Flow, regs: &Regs, b: &mut Budget) -> Result<BitRows, Unsupported> {
    let n = flow.nodes.len();
    let mut live = BitRows::new(n, regs.count(), b)?;
    let words = live.words;
    let mut tmp = Vec::new();
    let mut acc = vec![0u64; words];
    let mut changed = true;
    while changed {
        changed = false;
        for i in (0..n).rev() {
            b.work(words as u64 * 3 + 2)?;
            flow.succs(i, &mut tmp);
            acc.iter_mut().for_each(|w| *w = 0);
            for &s in &tmp {
                for (a, x) in acc.iter_mut().zip(live.row(s)) {
                    *a |= x;
                }
            }
            let node = &flow.nodes[i];
            if !node.guarded {
                for &d in &node.defs {
                    clear(&mut acc, d);
                }
            }
            for &u in &node.uses {
                set(&mut acc, u);
            }
            let row = live.row_mut(i);
            if row != acc.as_slice() {
                row.copy_from_slice(&acc);
                changed = true;
            }
        }
    }
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::LoadOptions;

    fn facts(body: &str) -> Vec<(Vec<String>, Vec<String>)> {
        let text = format!(
            ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 b)\n{{\n\
             .reg .b32 %r<8>;\n.reg .b64 %rd<4>;\n.reg .pred %p<3>;\n.reg .b16 %h<3>;\n{body}\n}}\n"
        );
        let m = crate::ckpt::module::load(&text, &LoadOptions::default()).expect("loads");
        let e = &m.entries[0];
        let regs = Regs::new(&e.decls);
        let name = |i: u32| {
            regs.names
                .get(i as usize)
                .cloned()
                .unwrap_or_else(|| "CF".into())
        };
        e.body
            .iter()
            .filter_map(|s| match s {
                Stmt::Inst(i) => {
                    let (d, u) = def_use(i, &regs);
                    Some((
                        d.into_iter().map(name).collect(),
                        u.into_iter().map(name).collect(),
                    ))
                }
                Stmt::Label(..) => None,
            })
            .collect()
    }

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn definitions_and_uses_of_every_operand_form() {
        let f = facts(
            "@%p1 ld.global.v2.u32 {%r1, %r2}, [%rd1+8];\n\
             st.global.v2.u32 [%rd2], {%r3, %r4};\n\
             shfl.sync.idx.b32 %r5|%p2, %r6, 1, 31, -1;\n\
             mov.b32 %r7, {%h1, %h2};\n\
             mov.b32 {%h1, %h2}, %r7;\n\
             add.cc.u32 %r1, %r2, %r3;\n\
             addc.u32 %r4, %r4, 0;\n\
             ld.param.u64 %rd3, [b];\n\
             bar.red.popc.u32 %r1, 0, !%p1;\n\
             mov.u32 %r2, %tid.x;\n\
             @!%p2 bra $X;\n\
             $X:\n\
             ret;",
        );
        assert_eq!(f[0], (v(&["%r1", "%r2"]), v(&["%p1", "%rd1"])));
        assert_eq!(f[1], (v(&[]), v(&["%rd2", "%r3", "%r4"])));
        assert_eq!(f[2], (v(&["%r5", "%p2"]), v(&["%r6"])));
        assert_eq!(f[3], (v(&["%r7"]), v(&["%h1", "%h2"])));
        assert_eq!(f[4], (v(&["%h1", "%h2"]), v(&["%r7"])));
        assert_eq!(f[5], (v(&["%r1", "CF"]), v(&["%r2", "%r3"])));
        assert_eq!(f[6], (v(&["%r4"]), v(&["%r4", "CF"])));
        assert_eq!(f[7], (v(&["%rd3"]), v(&[])));
        assert_eq!(f[8], (v(&["%r1"]), v(&["%p1"])));
        assert_eq!(f[9], (v(&["%r2"]), v(&[])));
        assert_eq!(f[10], (v(&[]), v(&["%p2"])));
        assert_eq!(f[11], (v(&[]), v(&[])));
    }

    #[test]
    fn guarded_definitions_do_not_kill_liveness() {
        let text = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 b)\n{\n\
                    .reg .b32 %r<4>;\n.reg .pred %p<2>;\n.reg .b64 %rd1;\n\
                    mov.u32 %r1, 1;\nsetp.eq.u32 %p1, %r1, 0;\n@%p1 mov.u32 %r1, 2;\nmov.u32 %r2, 3;\n\
                    ld.param.u64 %rd1, [b];\nst.global.u32 [%rd1], %r1;\n}\n";
        let m = crate::ckpt::module::load(text, &LoadOptions::default()).expect("loads");
        let e = &m.entries[0];
        let regs = Regs::new(&e.decls);
        let mut b = Budget::new(
            crate::load::Meter::new(&LoadOptions::default()),
            1 << 20,
            1 << 20,
        );
        let fl = Flow::build(&e.body, &regs, &mut b).expect("flow");
        let live = liveness(&fl, &regs, &mut b).expect("liveness");
        let r1 = regs.get("%r1").expect("r1");
        let p1 = regs.get("%p1").expect("p1");
        // Before the guarded mov (index 2) %r1 is live (the guard may be false), so is %p1.
        assert!(test(live.row(2), r1) && test(live.row(2), p1));
        // Before the first mov it is not (killed by an unguarded definition).
        assert!(!test(live.row(0), r1));
        // %r2 is never used: never live.
        let r2 = regs.get("%r2").expect("r2");
        assert!((0..fl.nodes.len()).all(|i| !test(live.row(i), r2)));
    }
}
