//! Shared helpers for the integration tests: a bump allocator over `FlatMemory`, parameter
//! buffer building and one-call launches.
#![allow(dead_code)]

pub mod model;

use std::sync::Arc;

use ptx::{FlatMemory, Launch, LaunchConfig, Limits, Module, RunControl, RunOutcome, Stats};

pub const BASE: u64 = 0x1_0000_0000;

/// Flat memory with a bump allocator.
pub struct Mem {
    pub mem: FlatMemory,
    next: u64,
}

impl Mem {
    pub fn new(size: usize) -> Self {
        Self {
            mem: FlatMemory::new(BASE, size),
            next: BASE,
        }
    }

    /// Allocate `bytes` (256-aligned) and return the VA.
    pub fn alloc(&mut self, bytes: usize) -> u64 {
        let va = self.next;
        self.next = (self.next + bytes as u64).div_ceil(256) * 256;
        assert!(self.next <= BASE + self.mem.size(), "test memory too small");
        va
    }

    pub fn put_u32(&mut self, v: &[u32]) -> u64 {
        let va = self.alloc(v.len() * 4);
        assert!(self.mem.write_u32s(va, v));
        va
    }

    pub fn put_f32(&mut self, v: &[f32]) -> u64 {
        let va = self.alloc(v.len() * 4);
        assert!(self.mem.write_f32s(va, v));
        va
    }

    pub fn put_u64(&mut self, v: &[u64]) -> u64 {
        let va = self.alloc(v.len() * 8);
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(self.mem.write(va, &b));
        va
    }

    pub fn u32s(&self, va: u64, n: usize) -> Vec<u32> {
        self.mem.read_u32s(va, n).expect("in range")
    }

    pub fn f32s(&self, va: u64, n: usize) -> Vec<f32> {
        self.mem.read_f32s(va, n).expect("in range")
    }

    pub fn u64s(&self, va: u64, n: usize) -> Vec<u64> {
        let b = self.mem.read(va, n * 8).expect("in range");
        b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }
}

/// Parameter buffer builder following the entry's layout.
#[derive(Default)]
pub struct Params(pub Vec<u8>);

impl Params {
    fn align(&mut self, a: usize) {
        while !self.0.len().is_multiple_of(a) {
            self.0.push(0);
        }
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.align(8);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.align(4);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f32(self, v: f32) -> Self {
        self.u32(v.to_bits())
    }
}

pub fn module(text: &str) -> Arc<Module> {
    Arc::new(ptx::parse(text).unwrap_or_else(|e| panic!("parse: {e}")))
}

pub fn cfg(grid: [u32; 3], block: [u32; 3], dynamic_shared: u32, params: Params) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        dynamic_shared,
        params: params.0,
    }
}

/// Launch and run to completion; panics on fault.
pub fn run(m: &Arc<Module>, entry: &str, c: LaunchConfig, mem: &Mem, threads: usize) -> Stats {
    let mut l = Launch::new(m.clone(), entry, c, &Limits::default()).expect("launch");
    match l.run(&mem.mem, &RunControl::new(threads)) {
        RunOutcome::Completed(s) => s,
        other => panic!("not completed: {other:?}"),
    }
}

/// Deterministic pseudo-random numbers (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }
}

/// The header of the nvcc-style kernels of the feature tests.
pub const NVCC_HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// An nvcc-style entry `k` with `params`, register declarations `regs` and `body`.
pub fn kern(params: &str, regs: &str, body: &str) -> String {
    format!(
        "{NVCC_HEAD}\n.visible .entry k(\n{params}\n)\n.maxntid 1024, 1, 1\n{{\n{regs}\n{body}\n}}\n"
    )
}
