//! Memory instructions of a warp (`ld`, `st`, `atom`/`red`): warp-wide fast paths for scalar
//! shared/global accesses, and the general per-lane path (vectors, generic, local, param) that
//! also reports faults with the faulting lane.

// Lane loops index several per-lane arrays by the lane number.
#![allow(clippy::needless_range_loop)]

use crate::exec::alu::Lanes;
use crate::exec::cta::Warp;
use crate::exec::fastmem;
use crate::exec::mem::{LaneFault, MemCtx, Tlb};
use crate::exec::warp::{Env, fetch, write};
use crate::ir::{Inst, Space};
use crate::memory::{Access, FaultReason};

/// Execute a memory instruction for the lanes in `exec`; on a fault, the faulting lane.
#[allow(clippy::too_many_arguments)] // the warp loop's split-borrowed state
pub(crate) fn exec(
    w: &mut Warp,
    widx: u32,
    env: &Env,
    tlb: &mut Tlb,
    shared: &mut [u8],
    exec: u32,
    inst: &Inst,
    scratch: &mut [Lanes; 4],
) -> Result<(), (usize, LaneFault)> {
    let [ba, bb, bc, r] = scratch;
    match inst {
        Inst::Ld {
            space,
            ty,
            dwidth,
            n,
            d,
            base,
            off,
        } => {
            fetch(w, *base, widx, env, ba);
            let a = &*ba;
            let size = u64::from(ty.bytes());
            let dmask = if *dwidth >= 64 {
                u64::MAX
            } else {
                (1u64 << dwidth) - 1
            };
            if *n == 1 {
                let ok = match space {
                    Space::Shared => fastmem::ld_shared(shared, a, *off, size as usize, exec, r),
                    Space::Global | Space::Generic => {
                        fastmem::ld_global(env.mem, tlb, a, *off, size as usize, exec, r)
                    }
                    _ => false,
                };
                if ok {
                    if ty.is_signed() {
                        for v in r.iter_mut() {
                            *v = ty.extend(*v) & dmask;
                        }
                    }
                    write(w, d[0], exec, r);
                    return Ok(());
                }
            }
            let mut vals = [[0u64; 32]; 4];
            let lb = env.local_bytes;
            for l in 0..32 {
                if exec >> l & 1 == 0 {
                    continue;
                }
                let addr = a[l].wrapping_add(*off as u64);
                let mut mc = MemCtx {
                    mem: env.mem,
                    module: env.module,
                    tlb,
                    shared,
                    local: &mut w.local[l * lb..(l + 1) * lb],
                    params: env.params,
                };
                if *n > 1 && !addr.is_multiple_of(size * u64::from(*n)) {
                    return Err((
                        l,
                        LaneFault {
                            va: addr,
                            access: Access::Read,
                            reason: FaultReason::Misaligned,
                        },
                    ));
                }
                for k in 0..usize::from(*n) {
                    let ea = addr.wrapping_add(k as u64 * size);
                    match mc.load(*space, ea, size) {
                        Ok(v) => {
                            let v = if ty.is_signed() {
                                ty.extend(v) & dmask
                            } else {
                                v
                            };
                            vals[k][l] = v;
                        }
                        Err(f) => return Err((l, f)),
                    }
                }
            }
            for k in 0..usize::from(*n) {
                write(w, d[k], exec, &vals[k]);
            }
        }
        Inst::St {
            space,
            ty,
            n,
            a: vals,
            base,
            off,
        } => {
            fetch(w, *base, widx, env, ba);
            let a = &*ba;
            let size = u64::from(ty.bytes());
            let mut data = [[0u64; 32]; 4];
            for k in 0..usize::from(*n) {
                fetch(w, vals[k], widx, env, &mut data[k]);
            }
            if *n == 1 {
                let sz = size as usize;
                let ok = match space {
                    Space::Shared => fastmem::st_shared(shared, a, *off, sz, exec, &data[0]),
                    Space::Global | Space::Generic => {
                        fastmem::st_global(env.mem, tlb, a, *off, sz, exec, &data[0])
                    }
                    _ => false,
                };
                if ok {
                    return Ok(());
                }
            }
            let lb = env.local_bytes;
            for l in 0..32 {
                if exec >> l & 1 == 0 {
                    continue;
                }
                let addr = a[l].wrapping_add(*off as u64);
                let mut mc = MemCtx {
                    mem: env.mem,
                    module: env.module,
                    tlb,
                    shared,
                    local: &mut w.local[l * lb..(l + 1) * lb],
                    params: env.params,
                };
                if *n > 1 && !addr.is_multiple_of(size * u64::from(*n)) {
                    return Err((
                        l,
                        LaneFault {
                            va: addr,
                            access: Access::Write,
                            reason: FaultReason::Misaligned,
                        },
                    ));
                }
                for (k, dk) in data.iter().enumerate().take(usize::from(*n)) {
                    let ea = addr.wrapping_add(k as u64 * size);
                    if let Err(f) = mc.store(*space, ea, size, dk[l]) {
                        return Err((l, f));
                    }
                }
            }
        }
        Inst::Atom {
            space,
            op,
            ty,
            d,
            base,
            off,
            b: sb,
            c: sc,
        } => {
            fetch(w, *base, widx, env, ba);
            let a = &*ba;
            fetch(w, *sb, widx, env, bb);
            let b = &*bb;
            fetch(w, *sc, widx, env, bc);
            let c = &*bc;
            let lb = env.local_bytes;
            for l in 0..32 {
                if exec >> l & 1 == 0 {
                    continue;
                }
                let addr = a[l].wrapping_add(*off as u64);
                let mut mc = MemCtx {
                    mem: env.mem,
                    module: env.module,
                    tlb,
                    shared,
                    local: &mut w.local[l * lb..(l + 1) * lb],
                    params: env.params,
                };
                match mc.atomic(*space, addr, *op, *ty, b[l], c[l]) {
                    Ok(v) => r[l] = v,
                    Err(f) => return Err((l, f)),
                }
            }
            if let Some(d) = d {
                write(w, *d, exec, r);
            }
        }
        Inst::Printf { fmt, args, ret } => {
            let lb = env.local_bytes;
            for l in 0..32 {
                if exec >> l & 1 == 0 {
                    continue;
                }
                let mut mc = MemCtx {
                    mem: env.mem,
                    module: env.module,
                    tlb,
                    shared,
                    local: &mut w.local[l * lb..(l + 1) * lb],
                    params: env.params,
                };
                let call = |mc: &mut MemCtx| {
                    let f = mc.load(Space::Local, *fmt, 8)?;
                    let a = mc.load(Space::Local, *args, 8)?;
                    let (text, n) = crate::exec::printf::format(mc, f, a)?;
                    if let Some(r) = ret {
                        mc.store(Space::Local, *r, 4, u64::from(n))?;
                    }
                    Ok(text)
                };
                let text = call(&mut mc).map_err(|f| (l, f))?;
                let mut buf = env.printf.lock().unwrap_or_else(|e| e.into_inner());
                if buf.len() + text.len() <= crate::exec::printf::PRINTF_BUFFER {
                    buf.extend_from_slice(&text);
                }
            }
        }
        _ => {}
    }
    Ok(())
}
