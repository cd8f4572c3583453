//! Binary instance files for drivers outside Rust (the CUDA ground-truth harness, suite/cuda/harness.cu).
//!
//! Little-endian throughout; strings are `u32 length + bytes`, blobs `u64 length + bytes`.
//! ```text
//! file    = "VGPUWL01" str(workload) str(size) str(ptx) u32(nbuf) buffer* u32(nlaunch) launch*
//! buffer  = str(name) blob(init) u8(kind) expect
//!   kind 0 ignore:  nothing
//!   kind 1 exact:   u8(elem: 0 u8, 1 u32, 2 i32, 3 u64, 4 f32) blob(bytes)
//!   kind 2 f32:     f32(abs) f32(rel) blob(values as f32 bytes)
//!   kind 3 atleast: u64(count) u64(min), each u64 element >= min
//! launch  = str(entry) u32(grid)x3 u32(block)x3 u32(shared) u32(param bytes) u32(nparam) param*
//! param   = u8(kind: 0 buffer, 1 u32, 2 i32, 3 u64, 4 i64, 5 f32, 6 f64) u32(offset) u32(size)
//!           u64(value: buffer index or raw bits)
//! ```
//! `offset` comes from [`crate::param_offsets`], so the harness also checks the layout rule.

use alloc::vec::Vec;

use crate::{Elem, Expect, Instance, Param, param_offsets, params_size};

/// File magic.
pub const MAGIC: &[u8; 8] = b"VGPUWL01";

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn blob(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
}

const fn elem_code(e: Elem) -> u8 {
    match e {
        Elem::U8 => 0,
        Elem::U32 => 1,
        Elem::I32 => 2,
        Elem::U64 => 3,
        Elem::F32 => 4,
    }
}

const fn param_code(p: &Param) -> u8 {
    match p {
        Param::Buffer(_) => 0,
        Param::U32(_) => 1,
        Param::I32(_) => 2,
        Param::U64(_) => 3,
        Param::I64(_) => 4,
        Param::F32(_) => 5,
        Param::F64(_) => 6,
    }
}

/// Serializes an instance in the format above.
pub fn encode(inst: &Instance) -> Vec<u8> {
    let mut w = W(Vec::new());
    w.0.extend_from_slice(MAGIC);
    w.str(inst.workload);
    w.str(inst.size.name());
    w.str(inst.ptx);
    w.u32(inst.buffers.len() as u32);
    for b in &inst.buffers {
        w.str(b.name);
        w.blob(&b.init);
        match &b.expect {
            Expect::Ignore => w.u8(0),
            Expect::Exact { elem, bytes } => {
                w.u8(1);
                w.u8(elem_code(*elem));
                w.blob(bytes);
            }
            Expect::F32 { values, abs, rel } => {
                w.u8(2);
                w.u32(abs.to_bits());
                w.u32(rel.to_bits());
                w.blob(&crate::f32_bytes(values));
            }
            Expect::U64AtLeast { count, min } => {
                w.u8(3);
                w.u64(*count as u64);
                w.u64(*min);
            }
        }
    }
    w.u32(inst.launches.len() as u32);
    for l in &inst.launches {
        w.str(l.entry);
        l.grid.iter().chain(&l.block).for_each(|&d| w.u32(d));
        w.u32(l.shared_bytes);
        w.u32(params_size(&l.params));
        w.u32(l.params.len() as u32);
        for (p, off) in l.params.iter().zip(param_offsets(&l.params)) {
            w.u8(param_code(p));
            w.u32(off);
            w.u32(p.size());
            w.u64(match *p {
                Param::Buffer(i) => i as u64,
                _ => p.bits(&[]).unwrap_or(0),
            });
        }
    }
    w.0
}
