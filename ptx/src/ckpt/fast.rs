//! Constant-trip chunks of strip-mined loops (issue 23: the never-preempted cost on a GPU).
//! A clamped inner loop (`strip.rs`) has a trip count `ptxas` cannot know, so every chunk
//! pays its unrolling's set-up: a peeled iteration, a remainder loop and the branches between
//! them, which on an H100 cost 10% on a 4-instruction loop and 21% on a loop with a load
//! (each peeled or remainder iteration waits for its load alone). When the whole chunk fits
//! before the bound, the point runs instead a *copy* of the inner loop that counts a
//! register down from the chunk's iteration count, a loop `ptxas` unrolls with no remainder:
//!
//! ```text
//! L: <point: poll>                          L: <point: poll>
//!    lim = min(n, i + k*s)                     t = i + k*s
//! I: body; add i, i, s                         if (t wrapped || t beyond n) goto S
//!    setp.lt p, i, lim; @p bra I               c = k
//!    setp.lt p, i, n; @p bra L     ==>      F: body; sub c, c, 1            (no add i)
//!                                              setp.ne p, c, 0; @p bra F
//!                                              i = t; bra T
//!                                           S: lim = min(n, i + k*s)
//!                                           I: body; add i, i, s; setp.lt p, i, lim; @p bra I
//!                                           T: setp.lt p, i, n; @p bra L
//! ```
//!
//! The copy runs exactly the iterations the clamped loop would (when `i + k*s` neither wraps
//! nor passes the bound, the clamped loop runs `k` of them), and it runs only for loops whose
//! induction register nothing else in the loop reads (`Strip::fast`), so dropping its step
//! inside the copy and setting it once after is exact, and the copy executes as many
//! instructions per iteration as the original (the sim interpreter's counts do not grow).
//! A copy holds no point (a loop with another point inside gets none).

use super::build::{imm, r};
use super::strip::{Strip, lim_reg};
use crate::decode::{ROp, RawInst, Stmt};
use crate::error::Pos;

fn inst(pos: Pos, op: &str, ops: Vec<ROp>) -> Stmt {
    Stmt::Inst(RawInst {
        pos,
        guard: None,
        opcode: op.to_string(),
        ops,
    })
}

/// Label of point `n`'s constant-trip copy.
pub(crate) fn copy_label(n: u64) -> String {
    format!("$__ck_fa{n}")
}

/// Label of point `n`'s clamped (slow) chunk.
pub(crate) fn slow_label(n: u64) -> String {
    format!("$__ck_sl{n}")
}

/// Label of point `n`'s loop test, after both chunk forms.
pub(crate) fn test_label(n: u64) -> String {
    format!("$__ck_te{n}")
}

/// The head at point `n`: `t = iv ± k*s` into the bound register; to the clamped chunk
/// unless `t` lies strictly beyond `iv` (no wrap) and not beyond the bound (in the loop's
/// direction); else the counter gets the chunk's iterations.
pub(crate) fn head(st: &Strip, n: u64, pos: Pos) -> Vec<Stmt> {
    let l = lim_reg(st.wide());
    let span = st.step.unsigned_abs() * u64::from(st.chunk);
    let (arith, beyond, within) = if st.step > 0 {
        ("add", "gt", "le")
    } else {
        ("sub", "lt", "ge")
    };
    let ty = st.ty;
    vec![
        inst(
            pos,
            &format!("{arith}.{ty}"),
            vec![r(l), r(&st.iv), imm(span)],
        ),
        inst(
            pos,
            &format!("setp.{beyond}.{ty}"),
            vec![r("%__ck_q"), r(l), r(&st.iv)],
        ),
        inst(
            pos,
            &format!("setp.{within}.and.{ty}"),
            vec![r("%__ck_q"), r(l), st.bound.clone(), r("%__ck_q")],
        ),
        Stmt::Inst(RawInst {
            pos,
            guard: Some(("%__ck_q".into(), true, Pos::default())),
            opcode: "bra".into(),
            ops: vec![r(&slow_label(n))],
        }),
        inst(pos, "mov.u32", vec![r("%__ck_k"), imm(u64::from(st.chunk))]),
    ]
}

/// The constant-trip copy of point `n`'s clamped inner loop `slow` (the statements after its
/// `$__ck_in` label, through its back branch to it), then `iv = t` and a branch to the test;
/// `None` when the loop holds anything the copy must not duplicate (another point's label)
/// or the shapes are not the ones `strip.rs` emits.
pub(crate) fn copy(st: &Strip, n: u64, slow: &[Stmt], pos: Pos) -> Option<Vec<Stmt>> {
    let inner = format!("$__ck_in{n}");
    let renamed = |name: &str| format!("$__ck_f{n}_{}", name.trim_start_matches('$'));
    let mut labels = Vec::new();
    for s in slow {
        if let Stmt::Label(name, _) = s {
            if name.starts_with("$__ck") {
                return None;
            }
            labels.push(name.clone());
        }
    }
    let is_reg = |o: &ROp, n: &str| matches!(o, ROp::Name(x, _) if x == n);
    let (mut tests, mut steps, mut backs) = (0, 0, 0);
    let mut out = vec![Stmt::Label(copy_label(n), pos)];
    for s in slow {
        match s {
            Stmt::Label(name, p) => out.push(Stmt::Label(renamed(name), *p)),
            Stmt::Inst(i) if i.ops.iter().any(|o| is_reg(o, lim_reg(st.wide()))) => {
                // The inner test: count down instead.
                let pred = i.ops.first()?.clone();
                tests += 1;
                out.push(inst(
                    i.pos,
                    "sub.u32",
                    vec![r("%__ck_k"), r("%__ck_k"), imm(1)],
                ));
                out.push(inst(i.pos, "setp.ne.u32", vec![pred, r("%__ck_k"), imm(0)]));
            }
            Stmt::Inst(i) if i.ops.first().is_some_and(|o| is_reg(o, &st.iv)) => {
                // The induction step: the copy sets the register once, after the loop.
                steps += 1;
            }
            Stmt::Inst(i) => {
                let mut c = i.clone();
                if super::flow::base(&c.opcode) == "bra" {
                    for o in &mut c.ops {
                        if let ROp::Name(t, _) = o {
                            if *t == inner {
                                *t = copy_label(n);
                                backs += 1;
                            } else if labels.contains(t) {
                                *t = renamed(t);
                            }
                        }
                    }
                }
                out.push(Stmt::Inst(c));
            }
        }
    }
    if (tests, steps, backs) != (1, 1, 1) {
        return None;
    }
    let mov = if st.wide() { "mov.b64" } else { "mov.b32" };
    out.push(inst(pos, mov, vec![r(&st.iv), r(lim_reg(st.wide()))]));
    out.push(inst(pos, "bra.uni", vec![r(&test_label(n))]));
    Some(out)
}
