//! The per-thread record of the save area: an 8-byte header (`u32` status, `u32` reserved)
//! then one fixed slot per register that is live at any point (so that a register keeps its
//! slot from one preemption to the next, which the incremental save relies on), largest first,
//! naturally aligned; predicates take one byte; then the thread's `.local` variables (copied
//! whole at every save, 8-byte aligned each). The stride is a multiple of 8.

use std::collections::HashMap;

use super::flow::{BitRows, Regs, test};
use super::points::Site;
use crate::decode::VarDecl;
use crate::ir::Ty;

/// Bytes of the record header.
pub const HEADER_BYTES: u32 = 8;

/// Fixed record layout of one entry.
pub(crate) struct Layout {
    /// Slot offset of each saved register.
    pub slot: HashMap<u32, u32>,
    /// Local variables copied whole at every save: (name, offset, size, copy width 4 or 1).
    pub locals: Vec<(String, u32, u32, u32)>,
    /// Bytes of local memory in the record.
    pub local_bytes: u32,
    /// Record stride in bytes.
    pub stride: u32,
}

/// Bytes a register takes in the record.
pub(crate) fn reg_bytes(t: Ty) -> u32 {
    t.bytes()
}

/// Registers live at a site (the carry flag is never live at a point).
pub(crate) fn live_at(live: &BitRows, regs: &Regs, s: &Site) -> Vec<u32> {
    let row = live.row(s.node);
    (0..regs.names.len() as u32)
        .filter(|&r| test(row, r))
        .collect()
}

/// Bytes of a register set.
pub(crate) fn bytes_of(regs: &Regs, set: &[u32]) -> u32 {
    set.iter().map(|&r| reg_bytes(regs.tys[r as usize])).sum()
}

/// The layout for the registers live at the points and the entry's local variables (each at
/// most 2^20 bytes; callers bound the total first).
pub(crate) fn build(regs: &Regs, lives: &[Vec<u32>], local: &[VarDecl]) -> Layout {
    let mut all: Vec<u32> = lives.iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    all.sort_by_key(|&r| std::cmp::Reverse(reg_bytes(regs.tys[r as usize])));
    let mut off = HEADER_BYTES;
    let mut slot = HashMap::new();
    for r in all {
        let b = reg_bytes(regs.tys[r as usize]);
        off = off.next_multiple_of(b);
        slot.insert(r, off);
        off += b;
    }
    let mut locals = Vec::new();
    let start = off.next_multiple_of(8);
    off = start;
    for v in local {
        off = off.next_multiple_of(8);
        let size = v.size.min(1 << 20) as u32;
        let w = if size.is_multiple_of(4) && v.align.is_multiple_of(4) {
            4
        } else {
            1
        };
        locals.push((v.name.clone(), off, size, w));
        off += size;
    }
    Layout {
        slot,
        locals,
        local_bytes: off - start,
        stride: off.next_multiple_of(8),
    }
}
