//! Saved-context format: the complete state of a [`Launch`] (configuration, CTA progress, and
//! for every started CTA its shared memory, barrier state and every warp's registers,
//! predicates, local memory, pc and SIMT stack). The project's one container ([`snapfmt`]:
//! magic `PTXCTX`, version 3, one `LNCH` section with a CRC-32), little-endian, bound to the
//! module's content hash. `restore` treats the bytes as hostile and validates every field.

use std::sync::Arc;

use crate::error::{ContextError, Pos};
use crate::exec::cta::{BarAcc, BarDst, Cta, NO_RPC, StackEntry, Warp};
use crate::exec::launch::{KernelFault, Launch, LaunchConfig, Limits, Stats};
use crate::exec::sched::QUANTUM;
use crate::exec::setup;
use crate::exec::warp::MAX_STACK;
use crate::ir::BarRedOp;
use crate::memory::{Access, FaultReason};
use crate::module::Module;

/// The container: version 2 was the same payload after the magic and version, without
/// sections; it is refused by its number.
const FORMAT: snapfmt::Format = snapfmt::Format {
    magic: *b"PTXCTX\0\0",
    version: 3,
    name: "PTX context",
};
/// The launch section and its version.
const LAUNCH: snapfmt::Id = *b"LNCH";
const LAUNCH_VERSION: u32 = 1;

/// Appends a payload to the container's open section.
struct W<'a>(&'a mut Vec<u8>);

impl W<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

fn access_code(a: Access) -> u8 {
    match a {
        Access::Read => 0,
        Access::Write => 1,
        Access::Atomic => 2,
    }
}

const REASONS: [FaultReason; 8] = [
    FaultReason::Unmapped,
    FaultReason::ReadOnly,
    FaultReason::Misaligned,
    FaultReason::SharedOutOfBounds,
    FaultReason::LocalOutOfBounds,
    FaultReason::ParamOutOfBounds,
    FaultReason::Trap,
    FaultReason::StackOverflow,
];

/// Serialize a launch, appended to `out` (a container nesting it writes it in place).
pub(crate) fn save_into(l: &Launch, out: Vec<u8>) -> Vec<u8> {
    let mut c = snapfmt::Writer::append_to(out, &FORMAT);
    let open = c.begin(LAUNCH, LAUNCH_VERSION);
    encode(l, &mut W(c.buf()));
    c.end(open);
    c.finish()
}

fn encode(l: &Launch, w: &mut W<'_>) {
    w.u64(l.module.hash);
    w.bytes(l.entry_name().as_bytes());
    for v in l.cfg.grid.iter().chain(&l.cfg.block) {
        w.u32(*v);
    }
    w.u32(l.cfg.dynamic_shared);
    w.bytes(&l.cfg.params);
    w.u64(l.next_cta);
    w.u64(l.stats.thread_instructions);
    w.u64(l.stats.warp_instructions);
    match &l.fault {
        None => w.u8(0),
        Some(f) => {
            w.u8(1);
            w.u64(f.va);
            w.u8(access_code(f.access));
            w.u8(REASONS.iter().position(|r| *r == f.reason).unwrap_or(0) as u8);
            w.u32(f.pc);
            w.u32(f.pos.line);
            w.u32(f.pos.col);
            for v in f.cta.iter().chain(&f.thread) {
                w.u32(*v);
            }
        }
    }
    w.u32(l.pending.len() as u32);
    for c in &l.pending {
        w.u64(c.linear);
        w.u32(c.cursor);
        w.u32(c.slice_left);
        w.u32(c.bar.count);
        w.u8(u8::from(c.bar.all));
        w.u8(u8::from(c.bar.any));
        w.bytes(&c.shared);
        w.u32(c.warps.len() as u32);
        for wp in &c.warps {
            for v in [wp.pc, wp.mask, wp.rpc, wp.valid, wp.exited] {
                w.u32(v);
            }
            w.u8(u8::from(wp.at_barrier));
            w.u8(u8::from(wp.done));
            match wp.bar_dst {
                None => w.u8(0),
                Some(b) => {
                    w.u8(match b.op {
                        BarRedOp::Popc => 1,
                        BarRedOp::And => 2,
                        BarRedOp::Or => 3,
                    });
                    w.u32(b.d);
                    w.u32(b.exec);
                }
            }
            w.u32(wp.stack.len() as u32);
            for e in &wp.stack {
                w.u32(e.pc);
                w.u32(e.mask);
                w.u32(e.rpc);
            }
            w.u32(wp.regs.len() as u32);
            for r in &wp.regs {
                w.u64(*r);
            }
            w.u32(wp.preds.len() as u32);
            for p in &wp.preds {
                w.u32(*p);
            }
            w.bytes(&wp.local);
        }
    }
}

/// The launch section's reader: [`snapfmt::Dec`] with this crate's errors.
struct Rd<'a>(snapfmt::Dec<'a>);

type R<T> = Result<T, ContextError>;

fn frame_error(e: snapfmt::FrameError) -> ContextError {
    use snapfmt::FrameError as F;
    match e {
        F::Magic { .. } => ContextError::BadMagic,
        F::Version { found, .. } => ContextError::Version(found),
        F::Truncated { .. } => ContextError::Truncated,
        F::Trailing => ContextError::Trailing,
        F::Checksum { .. } => ContextError::Invalid("checksum (CRC-32)"),
        F::SectionVersion { .. } => ContextError::Invalid("section version"),
        F::Invalid { what, .. } => ContextError::Invalid(what),
        F::Section { .. } | F::TooLarge { .. } | F::TooManySections(_) => {
            ContextError::Invalid("sections")
        }
    }
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        self.0.take(n).map_err(frame_error)
    }
    fn u8(&mut self) -> R<u8> {
        self.0.u8().map_err(frame_error)
    }
    fn u32(&mut self) -> R<u32> {
        self.0.u32().map_err(frame_error)
    }
    fn u64(&mut self) -> R<u64> {
        self.0.u64().map_err(frame_error)
    }
    fn bool(&mut self) -> R<bool> {
        self.0
            .at("bad flag")
            .bool()
            .map_err(|_| ContextError::Invalid("bad flag"))
    }
    /// A length-prefixed byte string whose length must equal `expect` (if given).
    fn bytes(&mut self, expect: Option<usize>) -> R<Vec<u8>> {
        let n = self.u32()? as usize;
        if expect.is_some_and(|e| e != n) {
            return Err(ContextError::Invalid("byte string length"));
        }
        Ok(self.take(n)?.to_vec())
    }
    /// A count that must equal `expect`.
    fn count(&mut self, expect: usize, what: &'static str) -> R<usize> {
        let n = self.u32()? as usize;
        if n != expect {
            return Err(ContextError::Invalid(what));
        }
        Ok(n)
    }
}

/// The launch section of a saved context (container checked: magic, version, CRC-32, nothing
/// after the end).
fn launch_section(bytes: &[u8]) -> R<&[u8]> {
    let secs = snapfmt::read(&FORMAT, bytes, 1).map_err(frame_error)?;
    match secs.as_slice() {
        [s] if s.id == LAUNCH => s.payload_v(LAUNCH_VERSION).map_err(frame_error),
        _ => Err(ContextError::Invalid("sections")),
    }
}

/// Rebuild a launch from hostile bytes.
pub(crate) fn restore(module: Arc<Module>, bytes: &[u8], limits: &Limits) -> R<Launch> {
    let mut r = Rd(snapfmt::Dec::new(launch_section(bytes)?, "context"));
    if r.u64()? != module.hash {
        return Err(ContextError::ModuleMismatch);
    }
    let name_len = r.u32()? as usize;
    let name = String::from_utf8(r.take(name_len)?.to_vec())
        .map_err(|_| ContextError::Invalid("entry name"))?;
    let mut dims = [0u32; 6];
    for d in &mut dims {
        *d = r.u32()?;
    }
    let dynamic_shared = r.u32()?;
    let params = r.bytes(None)?;
    let cfg = LaunchConfig {
        grid: [dims[0], dims[1], dims[2]],
        block: [dims[3], dims[4], dims[5]],
        dynamic_shared,
        params,
    };
    let mut l = setup::new_launch(module.clone(), &name, cfg, limits)?;
    let entry = &module.entries[l.entry];
    l.next_cta = r.u64()?;
    if l.next_cta > l.total_ctas {
        return Err(ContextError::Invalid("cta progress"));
    }
    l.stats = Stats {
        thread_instructions: r.u64()?,
        warp_instructions: r.u64()?,
    };
    if r.bool()? {
        let va = r.u64()?;
        let access = match r.u8()? {
            0 => Access::Read,
            1 => Access::Write,
            2 => Access::Atomic,
            _ => return Err(ContextError::Invalid("fault access")),
        };
        let reason = *REASONS
            .get(r.u8()? as usize)
            .ok_or(ContextError::Invalid("fault reason"))?;
        let pc = r.u32()?;
        let pos = Pos {
            line: r.u32()?,
            col: r.u32()?,
        };
        let mut c = [0u32; 6];
        for x in &mut c {
            *x = r.u32()?;
        }
        l.fault = Some(KernelFault {
            va,
            access,
            reason,
            pc,
            pos,
            cta: [c[0], c[1], c[2]],
            thread: [c[3], c[4], c[5]],
        });
    }
    let npending = r.u32()? as u64;
    if npending > l.next_cta {
        return Err(ContextError::Invalid("pending cta count"));
    }
    let block = l.cfg.block;
    let threads = block[0] * block[1] * block[2];
    let nwarps = threads.div_ceil(32) as usize;
    let ncode = entry.code.len() as u32;
    let local_bytes = entry.info.local_bytes_per_thread as usize;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..npending {
        let linear = r.u64()?;
        if linear >= l.next_cta || !seen.insert(linear) {
            return Err(ContextError::Invalid("pending cta index"));
        }
        let cursor = r.u32()?;
        let slice_left = r.u32()?;
        if cursor as usize >= nwarps || u64::from(slice_left) > QUANTUM {
            return Err(ContextError::Invalid("warp cursor"));
        }
        let bar = BarAcc {
            count: r.u32()?,
            all: r.bool()?,
            any: r.bool()?,
        };
        if bar.count > threads {
            return Err(ContextError::Invalid("barrier reduction"));
        }
        let shared = r.bytes(Some(l.shared_bytes as usize))?;
        r.count(nwarps, "warp count")?;
        let mut warps = Vec::with_capacity(nwarps);
        for wi in 0..nwarps {
            let lanes = (threads - wi as u32 * 32).min(32);
            let valid_expected = if lanes == 32 {
                u32::MAX
            } else {
                (1u32 << lanes) - 1
            };
            let (pc, mask, rpc, valid, exited) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
            let pc_ok = |p: u32| p <= ncode;
            let rpc_ok = |p: u32| p <= ncode || p == NO_RPC;
            if valid != valid_expected
                || exited & !valid != 0
                || mask & !valid != 0
                || !pc_ok(pc)
                || !rpc_ok(rpc)
            {
                return Err(ContextError::Invalid("warp state"));
            }
            let at_barrier = r.bool()?;
            let done = r.bool()?;
            let bar_dst = match r.u8()? {
                0 => None,
                k @ 1..=3 => {
                    let op = [BarRedOp::Popc, BarRedOp::And, BarRedOp::Or][usize::from(k - 1)];
                    let (d, exec) = (r.u32()?, r.u32()?);
                    let limit = if op == BarRedOp::Popc {
                        entry.nregs
                    } else {
                        entry.npreds
                    };
                    if d >= limit || exec & !valid != 0 || !at_barrier {
                        return Err(ContextError::Invalid("barrier reduction target"));
                    }
                    Some(BarDst { op, d, exec })
                }
                _ => return Err(ContextError::Invalid("barrier reduction target")),
            };
            let sl = r.u32()? as usize;
            if sl > MAX_STACK {
                return Err(ContextError::Invalid("simt stack depth"));
            }
            let mut stack = Vec::with_capacity(sl);
            for _ in 0..sl {
                let e = StackEntry {
                    pc: r.u32()?,
                    mask: r.u32()?,
                    rpc: r.u32()?,
                };
                if !pc_ok(e.pc) || !rpc_ok(e.rpc) || e.mask & !valid != 0 {
                    return Err(ContextError::Invalid("simt stack entry"));
                }
                stack.push(e);
            }
            let nregs = entry.nregs as usize * 32;
            r.count(nregs, "register count")?;
            let mut regs = Vec::with_capacity(nregs);
            for _ in 0..nregs {
                regs.push(r.u64()?);
            }
            let npreds = entry.npreds as usize;
            r.count(npreds, "predicate count")?;
            let mut preds = Vec::with_capacity(npreds);
            for _ in 0..npreds {
                preds.push(r.u32()?);
            }
            let local = r.bytes(Some(local_bytes * 32))?;
            warps.push(Warp {
                regs,
                preds,
                pc,
                mask,
                rpc,
                stack,
                valid,
                exited,
                at_barrier,
                bar_dst,
                done,
                local,
            });
        }
        l.pending.push(Cta {
            linear,
            warps,
            shared,
            cursor,
            slice_left,
            bar,
        });
    }
    if r.0.left() != 0 {
        return Err(ContextError::Trailing);
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-2 context (the payload right after magic and version, no sections) is refused
    /// by its number, and so is anything but one launch section.
    #[test]
    fn old_contexts_and_other_sections_are_refused() {
        let mut old = b"PTXCTX\0\0".to_vec();
        old.extend_from_slice(&2u32.to_le_bytes());
        old.extend_from_slice(&[0; 64]);
        assert_eq!(launch_section(&old), Err(ContextError::Version(2)));
        let mut w = snapfmt::Writer::new(&FORMAT);
        w.section(*b"OTHR", 1, &[]);
        assert_eq!(
            launch_section(&w.finish()),
            Err(ContextError::Invalid("sections"))
        );
        let mut w = snapfmt::Writer::new(&FORMAT);
        w.section(LAUNCH, 2, &[]);
        assert_eq!(
            launch_section(&w.finish()),
            Err(ContextError::Invalid("section version"))
        );
        assert_eq!(launch_section(b"PTX"), Err(ContextError::Truncated));
    }
}
