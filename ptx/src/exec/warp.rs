//! Warp execution: runs one warp's 32 lanes per instruction under an active mask, with a SIMT
//! reconvergence stack (immediate post-dominators computed at decode time).

// Lane loops index several per-lane arrays by the lane number.
#![allow(clippy::needless_range_loop)]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::exec::alu::{self, Lanes};
use crate::exec::cta::{BarAcc, BarDst, StackEntry, Warp, thread_coords};
use crate::exec::cvt;
use crate::exec::launch::{KernelFault, Stats};
use crate::exec::mem::{LaneFault, Tlb};
use crate::exec::{warp_mem, warp_ops};
use crate::ir::{BarRedOp, BoolOp, Entry, Inst, PSrc, Space, Src, Sreg, TerOp};
use crate::memory::{Access, FaultReason, GlobalMemory};
use crate::modvars::ModMem;

/// Most entries a SIMT stack may hold (bounds hostile saved contexts too).
pub(crate) const MAX_STACK: usize = 4096;

/// Per-CTA environment of a warp.
pub(crate) struct Env<'a> {
    pub entry: &'a Entry,
    pub params: &'a [u8],
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub ctaid: [u32; 3],
    pub nwarps: u32,
    pub mem: &'a dyn GlobalMemory,
    pub module: &'a ModMem,
    pub local_bytes: usize,
    pub t0: Instant,
    /// Where `printf` output goes (the launch's buffer).
    pub printf: &'a std::sync::Mutex<Vec<u8>>,
}

/// Why a warp stopped.
pub(crate) enum WarpStop {
    /// Its instruction budget ran out.
    Budget,
    /// It reached `bar.sync`.
    Barrier,
    /// All lanes exited.
    Done,
    Fault(KernelFault),
}

#[inline(always)]
pub(crate) fn psrc(w: &Warp, p: PSrc) -> u32 {
    match p {
        PSrc::Reg { idx, neg } => {
            let v = w.preds.get(idx as usize).copied().unwrap_or(0);
            if neg { !v } else { v }
        }
        PSrc::Const(b) => {
            if b {
                u32::MAX
            } else {
                0
            }
        }
    }
}

fn sreg(s: Sreg, widx: u32, lane: u32, env: &Env) -> u64 {
    let dim = |d: u8, v: [u32; 3]| u64::from(v[usize::from(d).min(2)]);
    match s {
        Sreg::Tid(d) => dim(d, thread_coords(widx * 32 + lane, env.block)),
        Sreg::Ntid(d) => dim(d, env.block),
        Sreg::Ctaid(d) => dim(d, env.ctaid),
        Sreg::Nctaid(d) => dim(d, env.grid),
        Sreg::LaneId => u64::from(lane),
        Sreg::WarpId => u64::from(widx),
        Sreg::NWarpId => u64::from(env.nwarps),
        Sreg::Clock => u64::from(env.t0.elapsed().as_nanos() as u32),
        Sreg::Clock64 => env.t0.elapsed().as_nanos() as u64,
        Sreg::GlobalTimer => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        Sreg::LaneMaskEq => 1u64 << lane,
        Sreg::LaneMaskLt => (1u64 << lane) - 1,
        Sreg::LaneMaskLe => (1u64 << (lane + 1)) - 1,
        Sreg::LaneMaskGt => u64::from(!(((1u64 << (lane + 1)) - 1) as u32)),
        Sreg::LaneMaskGe => u64::from(!(((1u64 << lane) - 1) as u32)),
        // One virtual SM per launch: persistent-thread kernels see a single SM.
        Sreg::SmId | Sreg::GridId => 0,
        Sreg::NSmId => 1,
    }
}

#[inline(always)]
pub(crate) fn fetch(w: &Warp, s: Src, widx: u32, env: &Env, out: &mut Lanes) {
    match s {
        Src::Reg(r) => {
            let r = r as usize * 32;
            out.copy_from_slice(&w.regs[r..r + 32]);
        }
        Src::Imm(v) => *out = [v; 32],
        Src::Sreg(sr) => {
            for (l, o) in out.iter_mut().enumerate() {
                *o = sreg(sr, widx, l as u32, env);
            }
        }
    }
}

/// A source operand's lanes: a view of the register row, or `buf` filled with the value.
#[inline(always)]
pub(crate) fn src<'a>(w: &'a Warp, s: Src, widx: u32, env: &Env, buf: &'a mut Lanes) -> &'a Lanes {
    if let Src::Reg(r) = s {
        let r = r as usize * 32;
        if let Some(row) = w
            .regs
            .get(r..r + 32)
            .and_then(|x| <&Lanes>::try_from(x).ok())
        {
            return row;
        }
        *buf = [0; 32];
        return buf;
    }
    fetch(w, s, widx, env, buf);
    buf
}

#[inline(always)]
pub(crate) fn write(w: &mut Warp, d: u32, exec: u32, v: &Lanes) {
    let r = d as usize * 32;
    let dst = &mut w.regs[r..r + 32];
    if exec == u32::MAX {
        dst.copy_from_slice(v);
    } else {
        for l in 0..32 {
            if exec >> l & 1 != 0 {
                dst[l] = v[l];
            }
        }
    }
}

#[inline(always)]
pub(crate) fn write_pred(w: &mut Warp, d: u32, exec: u32, v: u32) {
    if let Some(p) = w.preds.get_mut(d as usize) {
        *p = (*p & !exec) | (v & exec);
    }
}

pub(crate) fn bool_op(op: BoolOp, a: u32, b: u32) -> u32 {
    match op {
        BoolOp::And => a & b,
        BoolOp::Or => a | b,
        BoolOp::Xor => a ^ b,
    }
}

/// Pop finished reconvergence entries. Returns false when the warp has no live lanes left.
#[inline(always)]
fn reconverge(w: &mut Warp) -> bool {
    while w.pc == w.rpc || w.mask == 0 {
        match w.stack.pop() {
            Some(e) => {
                w.pc = e.pc;
                w.mask = e.mask & !w.exited;
                w.rpc = e.rpc;
            }
            None => {
                w.done = true;
                return false;
            }
        }
    }
    true
}

/// Run warp `widx` for at most `budget` instructions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn exec_warp(
    w: &mut Warp,
    widx: u32,
    shared: &mut [u8],
    bar: &mut BarAcc,
    env: &Env,
    tlb: &mut Tlb,
    budget: u64,
    stats: &mut Stats,
) -> WarpStop {
    let code = &env.entry.code;
    let mut ba: Lanes = [0; 32];
    let mut bb: Lanes = [0; 32];
    let mut bc: Lanes = [0; 32];
    let mut r: Lanes = [0; 32];
    let mut scratch: [Lanes; 4] = [[0; 32]; 4];
    for _ in 0..budget {
        if !reconverge(w) {
            return WarpStop::Done;
        }
        let pc = w.pc;
        let Some(op) = code.get(pc as usize) else {
            // Unreachable for decoded code (it ends with exit); treat as exit.
            w.exited |= w.mask;
            w.mask = 0;
            continue;
        };
        let exec = match op.guard {
            None => w.mask,
            Some((p, neg)) => {
                let v = w.preds.get(p as usize).copied().unwrap_or(0);
                (if neg { !v } else { v }) & w.mask
            }
        };
        stats.warp_instructions += 1;
        stats.thread_instructions += u64::from(exec.count_ones());
        let mut next = pc + 1;
        if exec == 0 {
            w.pc = next;
            continue;
        }
        match &op.inst {
            Inst::Un {
                op,
                ty,
                f,
                d,
                a: sa,
            } => {
                let a = src(w, *sa, widx, env, &mut ba);
                alu::un(*op, *ty, *f, a, &mut r);
                write(w, *d, exec, &r);
            }
            Inst::Bin {
                op,
                ty,
                f,
                d,
                a: sa,
                b: sb,
            } => {
                let a = src(w, *sa, widx, env, &mut ba);
                let b = src(w, *sb, widx, env, &mut bb);
                alu::bin(*op, *ty, *f, a, b, &mut r);
                write(w, *d, exec, &r);
            }
            Inst::Ter {
                op,
                ty,
                f,
                d,
                a: sa,
                b: sb,
                c: sc,
            } => {
                let a = src(w, *sa, widx, env, &mut ba);
                let b = src(w, *sb, widx, env, &mut bb);
                let c = src(w, *sc, widx, env, &mut bc);
                alu::ter(*op, *ty, *f, a, b, c, &mut r);
                write(w, *d, exec, &r);
            }
            Inst::Selp {
                ty,
                d,
                a: sa,
                b: sb,
                p,
            } => {
                let a = src(w, *sa, widx, env, &mut ba);
                let b = src(w, *sb, widx, env, &mut bb);
                let pm = psrc(w, *p);
                for l in 0..32 {
                    bc[l] = u64::from(pm >> l & 1);
                }
                alu::ter(TerOp::Selp, *ty, Default::default(), a, b, &bc, &mut r);
                write(w, *d, exec, &r);
            }
            Inst::Bfi {
                ty,
                d,
                a: sa,
                b: sb,
                c: sc,
                e,
            } => {
                let a = src(w, *sa, widx, env, &mut ba);
                let b = src(w, *sb, widx, env, &mut bb);
                let c = src(w, *sc, widx, env, &mut bc);
                fetch(w, *e, widx, env, &mut r);
                let mut out: Lanes = [0; 32];
                for l in 0..32 {
                    out[l] = alu::bfi(*ty, a[l], b[l], c[l], r[l]);
                }
                write(w, *d, exec, &out);
            }
            Inst::PLogic {
                op,
                not,
                d,
                a: pa,
                b: pb,
            } => {
                let x = psrc(w, *pa);
                let v = match op {
                    Some(o) => bool_op(*o, x, psrc(w, *pb)),
                    None if *not => !x,
                    None => x,
                };
                write_pred(w, *d, exec, v);
            }
            Inst::Setp {
                cmp,
                ty,
                ftz,
                p,
                q,
                a: sa,
                b: sb,
                comb,
            } => {
                let a = src(w, *sa, widx, env, &mut ba);
                let b = src(w, *sb, widx, env, &mut bb);
                let m = alu::setp_mask(*cmp, *ty, *ftz, a, b);
                let (pv, qv) = match comb {
                    Some((o, cs)) => {
                        let cv = psrc(w, *cs);
                        (bool_op(*o, m, cv), bool_op(*o, !m, cv))
                    }
                    None => (m, !m),
                };
                write_pred(w, *p, exec, pv);
                if let Some(q) = q {
                    write_pred(w, *q, exec, qv);
                }
            }
            Inst::Cvt {
                dty,
                sty,
                rnd,
                sat,
                ftz,
                dbits,
                d,
                a: sa,
            } => {
                let a = src(w, *sa, widx, env, &mut ba);
                let dmask = if *dbits >= 64 {
                    u64::MAX
                } else {
                    (1u64 << dbits) - 1
                };
                let widen = dty.is_signed() && dty.bits() < *dbits;
                for l in 0..32 {
                    let v = cvt::cvt(*dty, *sty, *rnd, *sat, *ftz, a[l]);
                    r[l] = if widen { dty.extend(v) & dmask } else { v };
                }
                write(w, *d, exec, &r);
            }
            Inst::Cvta {
                space,
                to,
                d,
                a: sa,
            } => {
                use crate::memory::{LOCAL_WINDOW, SHARED_WINDOW};
                let a = src(w, *sa, widx, env, &mut ba);
                let base = match space {
                    Space::Shared => SHARED_WINDOW,
                    Space::Local => LOCAL_WINDOW,
                    _ => 0,
                };
                for l in 0..32 {
                    r[l] = if *to {
                        a[l].wrapping_sub(base)
                    } else {
                        a[l].wrapping_add(base)
                    };
                }
                write(w, *d, exec, &r);
            }
            Inst::Carry { .. }
            | Inst::Set { .. }
            | Inst::Testp { .. }
            | Inst::Prmt { .. }
            | Inst::Slct { .. }
            | Inst::Pack { .. }
            | Inst::Unpack { .. }
            | Inst::Shfl { .. }
            | Inst::Vote { .. }
            | Inst::Redux { .. }
            | Inst::Match { .. } => warp_ops::exec(w, widx, env, exec, &op.inst, &mut scratch),
            Inst::Ld { .. } | Inst::St { .. } | Inst::Atom { .. } | Inst::Printf { .. } => {
                if let Err((l, f)) =
                    warp_mem::exec(w, widx, env, tlb, shared, exec, &op.inst, &mut scratch)
                {
                    return fault(w, env, l, f);
                }
            }
            Inst::Bra { target } => {
                if exec == w.mask {
                    next = *target;
                } else {
                    let rpc = env
                        .entry
                        .ipdom
                        .get(pc as usize)
                        .copied()
                        .unwrap_or(u32::MAX);
                    if w.stack.len() + 2 > MAX_STACK {
                        return fault(
                            w,
                            env,
                            exec.trailing_zeros() as usize,
                            LaneFault {
                                va: 0,
                                access: Access::Read,
                                reason: FaultReason::StackOverflow,
                            },
                        );
                    }
                    if rpc != w.rpc {
                        w.stack.push(StackEntry {
                            pc: rpc,
                            mask: w.mask,
                            rpc: w.rpc,
                        });
                    }
                    w.stack.push(StackEntry {
                        pc: next,
                        mask: w.mask & !exec,
                        rpc,
                    });
                    w.mask = exec;
                    w.rpc = rpc;
                    next = *target;
                }
            }
            Inst::Bar => {
                w.pc = next;
                w.at_barrier = true;
                return WarpStop::Barrier;
            }
            Inst::BarRed { op, d, p } => {
                let pv = psrc(w, *p) & exec;
                bar.count += pv.count_ones();
                bar.all &= pv == exec;
                bar.any |= pv != 0;
                w.bar_dst = Some(BarDst {
                    op: *op,
                    d: *d,
                    exec,
                });
                w.pc = next;
                w.at_barrier = true;
                return WarpStop::Barrier;
            }
            Inst::Exit => {
                w.exited |= exec;
                w.mask &= !exec;
            }
            Inst::Trap => {
                return fault(
                    w,
                    env,
                    exec.trailing_zeros() as usize,
                    LaneFault {
                        va: 0,
                        access: Access::Read,
                        reason: FaultReason::Trap,
                    },
                );
            }
            Inst::Nop => {}
            Inst::Activemask { d } => {
                r = [u64::from(exec); 32];
                write(w, *d, exec, &r);
            }
        }
        w.pc = next;
        if !reconverge(w) {
            return WarpStop::Done;
        }
    }
    WarpStop::Budget
}

/// Build the kernel fault of lane `lane` at the current pc (the warp's pc stays at the faulting
/// instruction); `thread` holds the lane until [`fix_thread`] converts it.
fn fault(w: &Warp, env: &Env, lane: usize, f: LaneFault) -> WarpStop {
    WarpStop::Fault(KernelFault {
        va: f.va,
        access: f.access,
        reason: f.reason,
        pc: w.pc,
        pos: env
            .entry
            .pos
            .get(w.pc as usize)
            .copied()
            .unwrap_or_default(),
        cta: env.ctaid,
        thread: [lane as u32, 0, 0],
    })
}

/// Convert the lane-relative thread field of a fault into CTA thread coordinates.
pub(crate) fn fix_thread(f: &mut KernelFault, widx: u32, block: [u32; 3]) {
    f.thread = thread_coords(widx * 32 + f.thread[0], block);
}

/// Deliver a finished `bar.red` reduction to a waiting warp.
pub(crate) fn deliver_bar_red(w: &mut Warp, acc: BarAcc) {
    let Some(dst) = w.bar_dst.take() else {
        return;
    };
    match dst.op {
        BarRedOp::Popc => write(w, dst.d, dst.exec, &[u64::from(acc.count); 32]),
        BarRedOp::And => write_pred(w, dst.d, dst.exec, if acc.all { u32::MAX } else { 0 }),
        BarRedOp::Or => write_pred(w, dst.d, dst.exec, if acc.any { u32::MAX } else { 0 }),
    }
}
