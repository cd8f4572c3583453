//! Less frequent warp instructions, kept out of the hot loop: carry chains, `set`, `testp`,
//! `prmt`, `slct`, register packing, and the warp-collective `shfl`, `vote` and `redux`.

// Lane loops index several per-lane arrays by the lane number.
#![allow(clippy::needless_range_loop)]

use crate::exec::alu::{self, Lanes};
use crate::exec::cta::Warp;
use crate::exec::mem;
use crate::exec::warp::{Env, bool_op, fetch, psrc, src, write, write_pred};
use crate::ir::{Inst, ShflMode, TestpOp, Ty, VoteMode};

/// Execute one of the instructions above for the lanes in `exec`.
pub(crate) fn exec(
    w: &mut Warp,
    widx: u32,
    env: &Env,
    exec: u32,
    inst: &Inst,
    scratch: &mut [Lanes; 4],
) {
    let [ba, bb, bc, r] = scratch;
    match inst {
        Inst::Carry {
            op,
            cin,
            cout,
            ty,
            flag,
            d,
            a: sa,
            b: sb,
            c: sc,
        } => {
            let a = src(w, *sa, widx, env, ba);
            let b = src(w, *sb, widx, env, bb);
            let c = src(w, *sc, widx, env, bc);
            let cf_in = if *cin {
                w.preds.get(*flag as usize).copied().unwrap_or(0)
            } else {
                0
            };
            let mut cf_out = 0u32;
            for l in 0..32 {
                let (v, f) = alu::carry_op(*op, ty.bits(), a[l], b[l], c[l], cf_in >> l & 1 != 0);
                r[l] = v;
                cf_out |= u32::from(f) << l;
            }
            write(w, *d, exec, r);
            if *cout {
                write_pred(w, *flag, exec, cf_out);
            }
        }
        Inst::Set {
            cmp,
            ty,
            float_out,
            ftz,
            d,
            a: sa,
            b: sb,
            comb,
        } => {
            let a = src(w, *sa, widx, env, ba);
            let b = src(w, *sb, widx, env, bb);
            let mut m = alu::setp_mask(*cmp, *ty, *ftz, a, b);
            if let Some((o, cs)) = comb {
                m = bool_op(*o, m, psrc(w, *cs));
            }
            let one = if *float_out {
                u64::from(1f32.to_bits())
            } else {
                0xffff_ffff
            };
            for l in 0..32 {
                r[l] = if m >> l & 1 != 0 { one } else { 0 };
            }
            write(w, *d, exec, r);
        }
        Inst::Testp { op, ty, p, a: sa } => {
            let a = src(w, *sa, widx, env, ba);
            let mut m = 0u32;
            for l in 0..32 {
                let x = if *ty == Ty::F32 {
                    f64::from(f32::from_bits(a[l] as u32))
                } else {
                    f64::from_bits(a[l])
                };
                // Subnormal-ness is a property of the source format.
                let sub = if *ty == Ty::F32 {
                    f32::from_bits(a[l] as u32).is_subnormal()
                } else {
                    x.is_subnormal()
                };
                let v = match op {
                    TestpOp::Finite => x.is_finite(),
                    TestpOp::Infinite => x.is_infinite(),
                    TestpOp::Number => !x.is_nan(),
                    TestpOp::NotANumber => x.is_nan(),
                    TestpOp::Normal => x.is_finite() && x != 0.0 && !sub,
                    TestpOp::Subnormal => sub,
                };
                m |= u32::from(v) << l;
            }
            write_pred(w, *p, exec, m);
        }
        Inst::Prmt {
            d,
            a: sa,
            b: sb,
            c: sc,
        } => {
            let a = src(w, *sa, widx, env, ba);
            let b = src(w, *sb, widx, env, bb);
            let c = src(w, *sc, widx, env, bc);
            for l in 0..32 {
                r[l] = alu::prmt(a[l], b[l], c[l]);
            }
            write(w, *d, exec, r);
        }
        Inst::Slct {
            ty,
            cty,
            ftz,
            d,
            a: sa,
            b: sb,
            c: sc,
        } => {
            let a = src(w, *sa, widx, env, ba);
            let b = src(w, *sb, widx, env, bb);
            let c = src(w, *sc, widx, env, bc);
            let m = ty.mask();
            for l in 0..32 {
                r[l] = if alu::slct_cond(*cty, *ftz, c[l]) {
                    a[l]
                } else {
                    b[l]
                } & m;
            }
            write(w, *d, exec, r);
        }
        Inst::Pack {
            elem_bits,
            d,
            parts,
        } => {
            *r = [0; 32];
            let em = if *elem_bits >= 64 {
                u64::MAX
            } else {
                (1u64 << elem_bits) - 1
            };
            for (k, s) in parts.iter().enumerate() {
                let a = src(w, *s, widx, env, ba);
                let sh = k as u32 * elem_bits;
                for l in 0..32 {
                    r[l] |= (a[l] & em).checked_shl(sh).unwrap_or(0);
                }
            }
            write(w, *d, exec, r);
        }
        Inst::Unpack {
            elem_bits,
            ds,
            a: sa,
        } => {
            fetch(w, *sa, widx, env, ba);
            let a = &ba;
            let em = if *elem_bits >= 64 {
                u64::MAX
            } else {
                (1u64 << elem_bits) - 1
            };
            for (k, d) in ds.iter().enumerate() {
                let sh = k as u32 * elem_bits;
                for l in 0..32 {
                    r[l] = a[l].checked_shr(sh).unwrap_or(0) & em;
                }
                write(w, *d, exec, r);
            }
        }
        Inst::Shfl {
            mode,
            d,
            p,
            a: sa,
            b: sb,
            c: sc,
        } => {
            let a = src(w, *sa, widx, env, ba);
            let b = src(w, *sb, widx, env, bb);
            let c = src(w, *sc, widx, env, bc);
            let mut pm = 0u32;
            for l in 0..32i64 {
                let cl = c[l as usize];
                let bl = i64::from(b[l as usize] as u32 & 31);
                let clamp = (cl & 31) as i64;
                let seg = ((cl >> 8) & 31) as i64;
                let max_lane = (l & seg) | (clamp & !seg);
                let min_lane = l & seg;
                let (j, ok) = match mode {
                    ShflMode::Up => (l - bl, l - bl >= max_lane),
                    ShflMode::Down => (l + bl, l + bl <= max_lane),
                    ShflMode::Bfly => (l ^ bl, (l ^ bl) <= max_lane),
                    ShflMode::Idx => {
                        let j = min_lane | (bl & !seg);
                        (j, j <= max_lane)
                    }
                };
                let j = if ok && (0..32).contains(&j) { j } else { l };
                r[l as usize] = a[j as usize];
                pm |= u32::from(ok) << l;
            }
            write(w, *d, exec, r);
            if let Some(p) = p {
                write_pred(w, *p, exec, pm);
            }
        }
        Inst::Vote {
            mode,
            d,
            a: pa,
            mask,
        } => {
            let pv = psrc(w, *pa) & exec;
            let groups = member_groups(w, *mask, widx, env, exec, bb);
            let mut pr = 0u32;
            for l in 0..32 {
                let g = groups[l];
                let v = pv & g;
                r[l] = u64::from(v);
                let t = match mode {
                    VoteMode::All => v == g,
                    VoteMode::Any => v != 0,
                    VoteMode::Uni => v == 0 || v == g,
                    VoteMode::Ballot => false,
                };
                pr |= u32::from(t) << l;
            }
            if *mode == VoteMode::Ballot {
                write(w, *d, exec, r);
            } else {
                write_pred(w, *d, exec, pr);
            }
        }
        Inst::Redux {
            op,
            ty,
            d,
            a: sa,
            mask,
        } => {
            let groups = member_groups(w, Some(*mask), widx, env, exec, bb);
            let a = src(w, *sa, widx, env, ba);
            for l in 0..32 {
                // Lanes of one group share the result: reuse the previous lane's.
                if l > 0 && groups[l] == groups[l - 1] {
                    r[l] = r[l - 1];
                    continue;
                }
                let mut acc: Option<u64> = None;
                for k in 0..32 {
                    if groups[l] >> k & 1 != 0 {
                        acc = Some(match acc {
                            None => a[k] & ty.mask(),
                            Some(x) => mem::apply(*op, *ty, x, a[k], 0),
                        });
                    }
                }
                r[l] = acc.unwrap_or(0);
            }
            write(w, *d, exec, r);
        }
        Inst::Match {
            all,
            ty,
            d,
            p,
            a: sa,
            mask,
        } => {
            let groups = member_groups(w, Some(*mask), widx, env, exec, bb);
            let a = src(w, *sa, widx, env, ba);
            let m = ty.mask();
            let mut pr = 0u32;
            for l in 0..32 {
                let g = groups[l];
                let mut same = 0u32;
                for k in 0..32 {
                    if g >> k & 1 != 0 && a[k] & m == a[l] & m {
                        same |= 1 << k;
                    }
                }
                let eq_all = same == g;
                r[l] = if !*all {
                    u64::from(same)
                } else if eq_all {
                    u64::from(g)
                } else {
                    0
                };
                pr |= u32::from(eq_all) << l;
            }
            write(w, *d, exec, r);
            if let Some(p) = p {
                write_pred(w, *p, exec, pr);
            }
        }
        _ => {}
    }
}

/// Each lane's group for a warp-collective instruction: the active lanes, restricted to the
/// lane's membermask when the instruction has one (PTX: the collective is over the threads in
/// membermask; a lane outside its own mask still takes part for itself).
fn member_groups(
    w: &mut Warp,
    mask: Option<crate::ir::Src>,
    widx: u32,
    env: &Env,
    exec: u32,
    buf: &mut Lanes,
) -> [u32; 32] {
    let Some(sm) = mask else { return [exec; 32] };
    let mk = src(w, sm, widx, env, buf);
    std::array::from_fn(|l| exec & ((mk[l] as u32) | (1 << l)))
}
