//! Instruction builders of the transformation's generated code: linear thread and CTA ids,
//! the record and shared save-block addresses, cooperative shared-memory and local-memory
//! copies, register stores and loads, and the flag poll with its warp or CTA agreement.

use super::emit::SharedPlan;
use super::flow::Regs;
use super::layout::Layout;
use super::points::Class;
use crate::decode::{ROp, RawInst, Stmt};
use crate::error::Pos;
use crate::ir::Ty;

use super::emit::PARAMS;
pub(crate) struct Gen {
    pub out: Vec<Stmt>,
    pub pos: Pos,
    pub labels: u32,
}

pub(crate) fn r(n: &str) -> ROp {
    ROp::Name(n.to_string(), Pos::default())
}

pub(crate) fn imm(v: u64) -> ROp {
    ROp::Int(v)
}

pub(crate) fn at(base: &str, off: i64) -> ROp {
    ROp::Addr {
        base: Some(base.to_string()),
        off,
        pos: Pos::default(),
    }
}

impl Gen {
    pub(crate) fn i(&mut self, op: &str, ops: Vec<ROp>) {
        self.out.push(Stmt::Inst(RawInst {
            pos: self.pos,
            guard: None,
            opcode: op.to_string(),
            ops,
        }));
    }

    pub(crate) fn g(&mut self, guard: &str, neg: bool, op: &str, ops: Vec<ROp>) {
        self.out.push(Stmt::Inst(RawInst {
            pos: self.pos,
            guard: Some((guard.to_string(), neg, Pos::default())),
            opcode: op.to_string(),
            ops,
        }));
    }

    pub(crate) fn label(&mut self, l: &str) {
        self.out.push(Stmt::Label(l.to_string(), self.pos));
    }

    pub(crate) fn fresh(&mut self) -> String {
        self.labels += 1;
        format!("$__ck_L{}", self.labels)
    }

    /// `%__ck_tl`, `%__ck_nt`, `%__ck_cl`: linear thread id, threads per CTA, linear CTA id.
    pub(crate) fn ids(&mut self) {
        self.i("mov.u32", vec![r("%__ck_t"), r("%tid.z")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%ntid.y")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_tl"), r("%__ck_t"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%tid.y")]);
        self.i("add.u32", vec![r("%__ck_tl"), r("%__ck_tl"), r("%__ck_t")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%ntid.x")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_tl"), r("%__ck_tl"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%tid.x")]);
        self.i("add.u32", vec![r("%__ck_tl"), r("%__ck_tl"), r("%__ck_t")]);
        self.i("mov.u32", vec![r("%__ck_nt"), r("%ntid.x")]);
        self.i("mov.u32", vec![r("%__ck_t"), r("%ntid.y")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_nt"), r("%__ck_nt"), r("%__ck_t")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ntid.z")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_nt"), r("%__ck_nt"), r("%__ck_t")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ctaid.z")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.y")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_cl"), r("%__ck_t"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ctaid.y")]);
        self.i("add.u32", vec![r("%__ck_cl"), r("%__ck_cl"), r("%__ck_t")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.x")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_cl"), r("%__ck_cl"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ctaid.x")]);
        self.i("add.u32", vec![r("%__ck_cl"), r("%__ck_cl"), r("%__ck_t")]);
    }

    /// `%__ck_rec` = save + (cl * nt + tl) * stride (after [`Gen::ids`]).
    pub(crate) fn record(&mut self, stride: u32) {
        self.i(
            "mul.wide.u32",
            vec![r("%__ck_w"), r("%__ck_cl"), r("%__ck_nt")],
        );
        self.i("cvt.u64.u32", vec![r("%__ck_rec"), r("%__ck_tl")]);
        self.i("add.u64", vec![r("%__ck_w"), r("%__ck_w"), r("%__ck_rec")]);
        self.i(
            "mul.lo.u64",
            vec![r("%__ck_w"), r("%__ck_w"), imm(u64::from(stride))],
        );
        self.i("ld.param.u64", vec![r("%__ck_rec"), at(PARAMS[1], 0)]);
        self.i(
            "add.u64",
            vec![r("%__ck_rec"), r("%__ck_rec"), r("%__ck_w")],
        );
    }

    /// The status word just stored in the record (`status`: a value, or `None` for point
    /// `%__ck_pt`'s `pt + 2`) also goes to the mirror (`emit::MIRROR_OFF`) when the host set
    /// one. Only on the paths that store a status, never on a fresh thread's completion; the
    /// ids are computed again here (clobbering `%__ck_t`/`%__ck_u`), so that nothing stays
    /// live across the body for it; every path after it returns.
    pub(crate) fn mirror(&mut self, status: Option<u32>) {
        let skip = self.fresh();
        // From the parameter again, not `%__ck_flagp` (ptxas keeps the flag's address in a
        // uniform register for the polls; this use would make it a per-thread one).
        self.i("ld.param.u64", vec![r("%__ck_mv"), at(PARAMS[0], 0)]);
        self.i(
            "ld.global.u64",
            vec![r("%__ck_mv"), at("%__ck_mv", super::emit::MIRROR_OFF)],
        );
        self.i("setp.eq.u64", vec![r("%__ck_q"), r("%__ck_mv"), imm(0)]);
        self.g("%__ck_q", false, "bra", vec![r(&skip)]);
        self.ids();
        // The thread's index fits 32 bits: a host sets a mirror only for grids of at most
        // 2^20 threads (4 MiB of words).
        self.i(
            "mad.lo.u32",
            vec![r("%__ck_tl"), r("%__ck_cl"), r("%__ck_nt"), r("%__ck_tl")],
        );
        self.i("mul.wide.u32", vec![r("%__ck_mw"), r("%__ck_tl"), imm(4)]);
        self.i("add.u64", vec![r("%__ck_mv"), r("%__ck_mv"), r("%__ck_mw")]);
        let mark = u64::from(super::emit::MIRROR_MARK);
        match status {
            Some(v) => self.i("mov.u32", vec![r("%__ck_u"), imm(u64::from(v) | mark)]),
            None => {
                self.i("add.u32", vec![r("%__ck_u"), r("%__ck_pt"), imm(2)]);
                self.i("or.b32", vec![r("%__ck_u"), r("%__ck_u"), imm(mark)]);
            }
        }
        self.i("st.global.u32", vec![at("%__ck_mv", 0), r("%__ck_u")]);
        self.label(&skip);
    }

    /// `%__ck_sh` = the CTA's shared save block (after [`Gen::ids`]): after every thread
    /// record, `cl * (static + align8(dyn))`.
    pub(crate) fn shared_base(&mut self, stride: u32, sp: &SharedPlan) {
        self.i("mov.u32", vec![r("%__ck_t"), r("%nctaid.x")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.y")]);
        self.i("mul.lo.u32", vec![r("%__ck_t"), r("%__ck_t"), r("%__ck_u")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.z")]);
        self.i("mul.lo.u32", vec![r("%__ck_t"), r("%__ck_t"), r("%__ck_u")]);
        self.i(
            "mul.wide.u32",
            vec![r("%__ck_w"), r("%__ck_t"), r("%__ck_nt")],
        );
        self.i(
            "mul.lo.u64",
            vec![r("%__ck_w"), r("%__ck_w"), imm(u64::from(stride))],
        );
        self.i("ld.param.u64", vec![r("%__ck_sh"), at(PARAMS[1], 0)]);
        self.i("add.u64", vec![r("%__ck_sh"), r("%__ck_sh"), r("%__ck_w")]);
        self.i("ld.param.u32", vec![r("%__ck_dyn"), at(PARAMS[3], 0)]);
        self.i("add.u32", vec![r("%__ck_u"), r("%__ck_dyn"), imm(7)]);
        self.i(
            "and.b32",
            vec![r("%__ck_u"), r("%__ck_u"), imm(!7u64 & 0xFFFF_FFFF)],
        );
        self.i(
            "add.u32",
            vec![r("%__ck_u"), r("%__ck_u"), imm(u64::from(sp.static_bytes))],
        );
        self.i(
            "mul.wide.u32",
            vec![r("%__ck_w"), r("%__ck_cl"), r("%__ck_u")],
        );
        self.i("add.u64", vec![r("%__ck_sh"), r("%__ck_sh"), r("%__ck_w")]);
    }

    /// Cooperative copy of one shared variable to (`save`) or from its save block slot.
    pub(crate) fn copy_var(&mut self, var: &str, off: u32, size: Option<u64>, w: u32, save: bool) {
        let (lp, end) = (self.fresh(), self.fresh());
        let (ty, wimm) = if w == 4 { ("b32", 4) } else { ("u8", 1) };
        self.i("mul.lo.u32", vec![r("%__ck_i"), r("%__ck_tl"), imm(wimm)]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_step"), r("%__ck_nt"), imm(wimm)],
        );
        self.label(&lp);
        let limit = size.map_or(r("%__ck_dyn"), imm);
        self.i("setp.ge.u32", vec![r("%__ck_q"), r("%__ck_i"), limit]);
        self.g("%__ck_q", false, "bra", vec![r(&end)]);
        self.i("mov.u32", vec![r("%__ck_a"), r(var)]);
        self.i("add.u32", vec![r("%__ck_a"), r("%__ck_a"), r("%__ck_i")]);
        self.i("cvt.u64.u32", vec![r("%__ck_w"), r("%__ck_i")]);
        self.i("add.u64", vec![r("%__ck_w"), r("%__ck_w"), r("%__ck_sh")]);
        if save {
            self.i(
                &format!("ld.shared.{ty}"),
                vec![r("%__ck_t"), at("%__ck_a", 0)],
            );
            self.i(
                &format!("st.global.{ty}"),
                vec![at("%__ck_w", i64::from(off)), r("%__ck_t")],
            );
        } else {
            self.i(
                &format!("ld.global.{ty}"),
                vec![r("%__ck_t"), at("%__ck_w", i64::from(off))],
            );
            self.i(
                &format!("st.shared.{ty}"),
                vec![at("%__ck_a", 0), r("%__ck_t")],
            );
        }
        self.i("add.u32", vec![r("%__ck_i"), r("%__ck_i"), r("%__ck_step")]);
        self.i("bra", vec![r(&lp)]);
        self.label(&end);
    }

    pub(crate) fn copy_shared(&mut self, sp: &SharedPlan, save: bool) {
        for (name, off, size, w) in &sp.statics {
            self.copy_var(name, *off, Some(*size), *w, save);
        }
        if let Some(d) = &sp.dynamic {
            self.copy_var(d, sp.static_bytes, None, 1, save);
        }
    }

    /// Copy the thread's local variables to (`save`) or from the record.
    pub(crate) fn copy_locals(&mut self, layout: &Layout, save: bool) {
        for (name, off, size, w) in &layout.locals {
            let ty = if *w == 4 { "b32" } else { "u8" };
            for o in (0..*size).step_by(*w as usize) {
                let rec = at("%__ck_rec", i64::from(off + o));
                let var = ROp::Addr {
                    base: Some(name.clone()),
                    off: i64::from(o),
                    pos: Pos::default(),
                };
                if save {
                    self.i(&format!("ld.local.{ty}"), vec![r("%__ck_t"), var]);
                    self.i(&format!("st.global.{ty}"), vec![rec, r("%__ck_t")]);
                } else {
                    self.i(&format!("ld.global.{ty}"), vec![r("%__ck_t"), rec]);
                    self.i(&format!("st.local.{ty}"), vec![var, r("%__ck_t")]);
                }
            }
        }
    }

    pub(crate) fn store_reg(&mut self, regs: &Regs, reg: u32, off: u32) {
        let name = regs.names[reg as usize].as_str();
        let t = regs.tys[reg as usize];
        if t == Ty::Pred {
            self.i("selp.u32", vec![r("%__ck_t"), imm(1), imm(0), r(name)]);
            self.i(
                "st.global.u8",
                vec![at("%__ck_rec", i64::from(off)), r("%__ck_t")],
            );
        } else {
            let op = format!("st.global.b{}", t.bits());
            self.i(&op, vec![at("%__ck_rec", i64::from(off)), r(name)]);
        }
    }

    pub(crate) fn load_reg(&mut self, regs: &Regs, reg: u32, off: u32) {
        let name = regs.names[reg as usize].as_str();
        let t = regs.tys[reg as usize];
        if t == Ty::Pred {
            self.i(
                "ld.global.u8",
                vec![r("%__ck_t"), at("%__ck_rec", i64::from(off))],
            );
            self.i("setp.ne.u32", vec![r(name), r("%__ck_t"), imm(0)]);
        } else {
            let op = format!("ld.global.b{}", t.bits());
            self.i(&op, vec![r(name), at("%__ck_rec", i64::from(off))]);
        }
    }

    /// Read the flag and decide (per thread, warp or CTA) into `%__ck_p`.
    pub(crate) fn poll(&mut self, class: Class, mask: Option<ROp>) {
        self.i(
            "ld.volatile.global.u32",
            vec![r("%__ck_f"), at("%__ck_flagp", 0)],
        );
        self.decide(class, mask);
    }

    /// Decide on `%__ck_f != 0` (per thread, warp or CTA) into `%__ck_p`. `arg` is the
    /// member mask of a warp decision, or the reduction opcode of a CTA decision.
    pub(crate) fn decide(&mut self, class: Class, arg: Option<ROp>) {
        self.i("setp.ne.u32", vec![r("%__ck_p"), r("%__ck_f"), imm(0)]);
        self.agree(class, arg);
    }

    /// Make `%__ck_p` uniform over the warp (`Warp`) or CTA (`Cta`; this is the barrier).
    pub(crate) fn agree(&mut self, class: Class, arg: Option<ROp>) {
        let mask = arg;
        match class {
            Class::Thread => {}
            Class::Cta => {
                // `barrier.sync` without `.aligned` may run in divergent warps: keep its form.
                let op = match mask {
                    Some(ROp::Name(op, _)) => op,
                    _ => "bar.red.or.pred".to_string(),
                };
                self.i(&op, vec![r("%__ck_p"), imm(0), r("%__ck_p")]);
            }
            Class::Warp => {
                let m = match mask {
                    Some(m) => m,
                    None => {
                        self.i("activemask.b32", vec![r("%__ck_m")]);
                        r("%__ck_m")
                    }
                };
                self.i("vote.sync.any.pred", vec![r("%__ck_p"), r("%__ck_p"), m]);
            }
        }
    }
}
