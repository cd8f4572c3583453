//! Helpers shared by the integration tests: engine construction, page-aligned host buffers,
//! a small deterministic RNG.

#![allow(dead_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};

use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{Engine, SpaceId, VaWindow};

pub const MIB: u64 = 1 << 20;
pub const BASE: u64 = 0x4_0000_0000;

pub fn engine() -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 * MIB,
        workers: 2,
        ..SimConfig::default()
    })
    .unwrap()
}

pub fn space(e: &SimEngine) -> SpaceId {
    e.create_space(VaWindow {
        base: BASE,
        size: 1 << 30,
    })
    .unwrap()
}

/// A 4 KiB aligned, zeroed host buffer standing for guest RAM.
pub struct HostBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl HostBuf {
    pub fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size (tests pass len > 0).
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Self { ptr, layout }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len());
        // SAFETY: in bounds; no kernel runs while the test reads.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len).to_vec() }
    }
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len());
        // SAFETY: in bounds; no kernel runs while the test writes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// xorshift64*: deterministic pseudo-random numbers for tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

pub mod placed;
pub mod runner;
