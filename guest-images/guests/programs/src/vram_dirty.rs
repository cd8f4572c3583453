//! A VRAM working set a guest keeps rewriting at a chosen rate, checked byte for byte at the end:
//! the load of live-migration experiments with "1 GiB of VRAM in use and being written"
//! (issue 24). The pool is `pool_mib` MiB of the driver's VRAM pool in 64 KiB blocks; every
//! block is filled once at start (so the whole pool is in use: a snapshot's first round sends
//! it all), then, with each kernel submission, the guest appends copy-engine copies that rewrite
//! the next blocks (round robin) so that `dirty_mib_s` MiB per second of guest time are
//! written. Each block holds a pattern of its index and its generation (how many times it was
//! written); the guest remembers every block's generation and, once the run has drained,
//! copies the whole pool back to system memory and compares it: a page that a migration or a
//! restore left stale, or put at the wrong place, is a mismatch.
//!
//! The copies read from a per-slot staging buffer in system memory, written by the CPU just
//! before the submission that copies it; a slot's staging is rewritten only after that slot's
//! fence completed, so no copy reads a half-written block.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use gpu_driver::{Channel, Error, Gpu, Platform, PushBuf, SysAlloc, VramAlloc};

/// Bytes per block (the unit of writing and of checking).
pub const BLOCK: u64 = 64 << 10;
/// Most blocks one submission rewrites (the staging buffer of a slot: 4 MiB).
pub const MAX_BLOCKS_PER_SUBMIT: u64 = 64;

/// The pool, its blocks' generations and the rate.
pub struct DirtyPool {
    pool: VramAlloc,
    blocks: u64,
    /// Generation of every block (1 after the initial fill).
    gens: Vec<u32>,
    /// Next block to rewrite.
    cursor: u64,
    /// Bytes per second of guest time to rewrite (0: only the initial fill).
    rate: u64,
    /// Bytes rewritten since `t0_ns`.
    written: u64,
    t0_ns: u64,
    /// One staging buffer per slot.
    staging: Vec<SysAlloc>,
    buf: Vec<u8>,
}

/// The 64-bit word `j` of block `b` at generation `g`.
fn word(b: u64, g: u32, j: u64) -> u64 {
    // splitmix64 of (block, generation), then the word index: every word differs from its
    // neighbours and from every other block's and generation's.
    let mut z = (b << 32 | u64::from(g)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) ^ j.wrapping_mul(0x0100_0000_01b3)
}

fn fill_block(out: &mut [u8], b: u64, g: u32) {
    for (j, w) in out.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(b, g, j as u64).to_le_bytes());
    }
}

impl DirtyPool {
    /// Allocates `pool_mib` MiB of VRAM and `slots` staging buffers.
    pub fn new<P: Platform>(
        gpu: &mut Gpu<P>,
        pool_mib: u64,
        dirty_mib_s: u64,
        slots: usize,
    ) -> Result<Self, Error> {
        let len = pool_mib << 20;
        let pool = gpu.vram_alloc(len)?;
        let mut staging = Vec::with_capacity(slots);
        for _ in 0..slots {
            staging.push(gpu.sys_alloc(BLOCK * MAX_BLOCKS_PER_SUBMIT)?);
        }
        let blocks = len / BLOCK;
        Ok(Self {
            pool,
            blocks,
            gens: vec![0; blocks as usize],
            cursor: 0,
            rate: dirty_mib_s << 20,
            written: 0,
            t0_ns: 0,
            staging,
            buf: vec![0; (BLOCK * MAX_BLOCKS_PER_SUBMIT) as usize],
        })
    }

    /// Bytes of the pool.
    pub fn bytes(&self) -> u64 {
        self.blocks * BLOCK
    }

    /// Writes generation 1 into every block (waiting for each batch), and starts the rate's
    /// clock at `now_ns`.
    pub fn fill<P: Platform>(&mut self, gpu: &mut Gpu<P>, ch: &mut Channel) -> Result<(), Error> {
        let mut b = 0;
        while b < self.blocks {
            let n = (self.blocks - b).min(MAX_BLOCKS_PER_SUBMIT);
            let mut pb = PushBuf::new();
            self.stage(gpu, &mut pb, 0, b, n)?;
            let f = ch.submit(gpu, &mut pb)?;
            ch.wait(gpu, f)?;
            b += n;
        }
        self.t0_ns = gpu.platform().now_ns();
        Ok(())
    }

    /// Writes the next generation of blocks `b..b + n` into slot `slot`'s staging buffer and
    /// appends their copies to `pb`.
    fn stage<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        pb: &mut PushBuf,
        slot: usize,
        b: u64,
        n: u64,
    ) -> Result<(), Error> {
        let bytes = (n * BLOCK) as usize;
        for k in 0..n {
            let g = self.gens[(b + k) as usize] + 1;
            self.gens[(b + k) as usize] = g;
            let at = (k * BLOCK) as usize;
            fill_block(&mut self.buf[at..at + BLOCK as usize], b + k, g);
        }
        let st = &self.staging[slot];
        gpu.sys_write(st, 0, &self.buf[..bytes])?;
        pb.copy(st.va, self.pool.va + b * BLOCK, n * BLOCK);
        Ok(())
    }

    /// Appends to `pb` (the submission of slot `slot`) the rewrites that keep the rate at
    /// `now_ns`: the blocks owed since the start, at most [`MAX_BLOCKS_PER_SUBMIT`], round
    /// robin (a run of blocks that reaches the pool's end stops there). Returns the blocks.
    pub fn append<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        pb: &mut PushBuf,
        slot: usize,
        now_ns: u64,
    ) -> Result<u64, Error> {
        if self.rate == 0 || self.blocks == 0 {
            return Ok(0);
        }
        let due =
            u128::from(self.rate) * u128::from(now_ns.saturating_sub(self.t0_ns)) / 1_000_000_000;
        let owed = (due.saturating_sub(u128::from(self.written)) / u128::from(BLOCK)) as u64;
        let n = owed
            .min(MAX_BLOCKS_PER_SUBMIT)
            .min(self.blocks - self.cursor);
        if n == 0 {
            return Ok(0);
        }
        self.stage(gpu, pb, slot, self.cursor, n)?;
        self.cursor = (self.cursor + n) % self.blocks;
        self.written += n * BLOCK;
        Ok(n)
    }

    /// Bytes rewritten after the initial fill.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Copies the whole pool back (through slot 0's staging buffer) and compares every block
    /// with its pattern. Call only once nothing is in flight.
    pub fn verify<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        ch: &mut Channel,
    ) -> Result<Result<(), String>, Error> {
        let mut want = vec![0u8; BLOCK as usize];
        let mut b = 0;
        while b < self.blocks {
            let n = (self.blocks - b).min(MAX_BLOCKS_PER_SUBMIT);
            let st = &self.staging[0];
            let mut pb = PushBuf::new();
            pb.copy(self.pool.va + b * BLOCK, st.va, n * BLOCK);
            let f = ch.submit(gpu, &mut pb)?;
            ch.wait(gpu, f)?;
            let bytes = (n * BLOCK) as usize;
            gpu.sys_read(&self.staging[0], 0, &mut self.buf[..bytes])?;
            for k in 0..n {
                let g = self.gens[(b + k) as usize];
                fill_block(&mut want, b + k, g);
                let at = (k * BLOCK) as usize;
                let got = &self.buf[at..at + BLOCK as usize];
                if let Some(i) = got.iter().zip(&want).position(|(x, y)| x != y) {
                    return Ok(Err(format!(
                        "VRAM pool block {} (offset {:#x}) generation {g}: byte {i} is {:#x}, expected {:#x}",
                        b + k,
                        (b + k) * BLOCK + i as u64,
                        got[i],
                        want[i]
                    )));
                }
            }
            b += n;
        }
        Ok(Ok(()))
    }
}
