//! Pushbuffer encoding (docs/hardware.md, "GPFIFO and pushbuffers", "Methods"): method headers,
//! the methods of the virtual GPU, and a builder that remembers method boundaries so a long
//! buffer splits into segments without cutting a method.

use crate::error::Error;
use alloc::vec::Vec;

/// Header opcodes, the header encoding, method addresses and SEM_EXECUTE fields: `vgpu-hw`'s.
pub use vgpu_hw::method::{
    self as method, MAX_COUNT, OP_IMMD, OP_INCR, OP_NONINCR, SEM_FLAG_INTERRUPT as SEM_INTERRUPT,
    SEM_FLAG_TIMESTAMP as SEM_TIMESTAMP, SEM_OP_ACQUIRE as SEM_ACQUIRE,
    SEM_OP_RELEASE as SEM_RELEASE, header,
};

/// Everything a kernel launch needs, as GPU virtual addresses and sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchDesc {
    pub code_va: u64,
    pub code_len: u32,
    pub entry_va: u64,
    pub entry_len: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub param_va: u64,
    pub param_len: u32,
}

const fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}
const fn lo(v: u64) -> u32 {
    v as u32
}

/// A pushbuffer being built: words plus the index where each method starts.
#[derive(Clone, Debug, Default)]
pub struct PushBuf {
    words: Vec<u32>,
    starts: Vec<usize>,
}

impl PushBuf {
    /// An empty pushbuffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The encoded words.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.words.clear();
        self.starts.clear();
    }

    /// INCR: `data[k]` to `method + 4k` (split into several headers past 8191 words).
    pub fn incr(&mut self, method: u32, data: &[u32]) -> &mut Self {
        for (n, chunk) in data.chunks(MAX_COUNT as usize).enumerate() {
            self.starts.push(self.words.len());
            let m = method + 4 * (n as u32) * MAX_COUNT;
            self.words.push(header(OP_INCR, chunk.len() as u32, m));
            self.words.extend_from_slice(chunk);
        }
        self
    }

    /// NONINCR: every word of `data` to `method`.
    pub fn nonincr(&mut self, method: u32, data: &[u32]) -> &mut Self {
        for chunk in data.chunks(MAX_COUNT as usize) {
            self.starts.push(self.words.len());
            self.words
                .push(header(OP_NONINCR, chunk.len() as u32, method));
            self.words.extend_from_slice(chunk);
        }
        self
    }

    /// One method with one value: IMMD when it fits 13 bits, INCR otherwise.
    pub fn method(&mut self, method: u32, value: u32) -> &mut Self {
        if value <= MAX_COUNT {
            self.starts.push(self.words.len());
            self.words.push(header(OP_IMMD, value, method));
            self
        } else {
            self.incr(method, &[value])
        }
    }

    /// A raw word as its own "method" (for tests of the device's checks).
    pub fn raw(&mut self, word: u32) -> &mut Self {
        self.starts.push(self.words.len());
        self.words.push(word);
        self
    }

    /// Semaphore release of `payload` at `va`, with optional interrupt and timestamp.
    pub fn release(
        &mut self,
        va: u64,
        payload: u32,
        interrupt: bool,
        timestamp: bool,
    ) -> &mut Self {
        let mut exec = SEM_RELEASE;
        if interrupt {
            exec |= SEM_INTERRUPT;
        }
        if timestamp {
            exec |= SEM_TIMESTAMP;
        }
        self.incr(method::SEM_ADDR_HI, &[hi(va), lo(va), payload, exec])
    }

    /// Semaphore acquire: wait until the u32 at `va` is at least `payload`.
    pub fn acquire(&mut self, va: u64, payload: u32) -> &mut Self {
        self.incr(method::SEM_ADDR_HI, &[hi(va), lo(va), payload, SEM_ACQUIRE])
    }

    /// Copy-engine copy of `len` bytes (split at 2 GiB).
    pub fn copy(&mut self, src: u64, dst: u64, len: u64) -> &mut Self {
        const CHUNK: u64 = 1 << 31;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK);
            let (s, d) = (src.wrapping_add(done), dst.wrapping_add(done));
            self.incr(method::COPY_SRC_HI, &[hi(s), lo(s), hi(d), lo(d), n as u32]);
            self.method(method::COPY_LAUNCH, 0);
            done += n;
        }
        self
    }

    /// A kernel launch.
    pub fn launch(&mut self, l: &LaunchDesc) -> &mut Self {
        self.incr(
            method::CODE_HI,
            &[
                hi(l.code_va),
                lo(l.code_va),
                l.code_len,
                hi(l.entry_va),
                lo(l.entry_va),
                l.entry_len,
                l.grid[0],
                l.grid[1],
                l.grid[2],
                l.block[0],
                l.block[1],
                l.block[2],
                l.shared_bytes,
                hi(l.param_va),
                lo(l.param_va),
                l.param_len,
            ],
        );
        self.method(method::LAUNCH, 0)
    }

    /// Splits the words into segments of at most `max_words`, each ending at a method
    /// boundary: (first word, word count) pairs.
    pub fn segments(&self, max_words: usize) -> Result<Vec<(usize, usize)>, Error> {
        let mut out = Vec::new();
        let mut seg_start = 0;
        let ends = self
            .starts
            .iter()
            .skip(1)
            .copied()
            .chain([self.words.len()]);
        for (start, end) in self.starts.iter().copied().zip(ends) {
            if end - start > max_words {
                return Err(Error::PushTooLong(end - start));
            }
            if end - seg_start > max_words {
                out.push((seg_start, start - seg_start));
                seg_start = start;
            }
        }
        if seg_start < self.words.len() {
            out.push((seg_start, self.words.len() - seg_start));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_match_spec() {
        assert_eq!(header(OP_INCR, 4, 0x010), 0x2004_0004);
        assert_eq!(header(OP_NONINCR, 2, 0x018), 0x6002_0006);
        assert_eq!(header(OP_IMMD, 0, 0x240), 0x8000_0090);
        assert_eq!(header(OP_IMMD, 0x1fff, 0x114), 0x9fff_0045);
    }

    #[test]
    fn release_copy_launch_encode() {
        let mut p = PushBuf::new();
        p.release(0x1_2345_6780, 7, true, true);
        assert_eq!(p.words(), [0x2004_0004, 1, 0x2345_6780, 7, 0x32]);
        p.clear();
        p.copy(0x10, 0x20, 0x30);
        assert_eq!(
            p.words(),
            [0x2005_0040, 0, 0x10, 0, 0x20, 0x30, 0x8000_0045]
        );
        p.clear();
        p.launch(&LaunchDesc {
            grid: [2, 1, 1],
            ..Default::default()
        });
        assert_eq!(p.words().len(), 18);
        assert_eq!(p.words()[0], header(OP_INCR, 16, 0x200));
        assert_eq!(p.words()[7], 2);
        assert_eq!(p.words()[17], 0x8000_0090);
        p.clear();
        p.method(method::SEM_PAYLOAD, 0x12345);
        assert_eq!(p.words(), [0x2001_0006, 0x12345]);
    }

    #[test]
    fn segments_split_at_method_boundaries() {
        let mut p = PushBuf::new();
        p.release(0, 1, false, false); // 5 words
        p.method(method::NOP, 0); // 1
        p.release(0, 2, false, false); // 5
        assert_eq!(p.segments(100).unwrap(), [(0, 11)]);
        assert_eq!(p.segments(6).unwrap(), [(0, 6), (6, 5)]);
        assert_eq!(p.segments(5).unwrap(), [(0, 5), (5, 1), (6, 5)]);
        assert_eq!(p.segments(4), Err(Error::PushTooLong(5)));
        assert!(PushBuf::new().segments(4).unwrap().is_empty());
        let big = alloc::vec![0u32; 9000];
        p.clear();
        p.incr(0x100, &big);
        assert_eq!(p.words().len(), 9002);
        assert_eq!(
            p.words()[8192],
            header(OP_INCR, 9000 - 8191, 0x100 + 4 * 8191)
        );
    }
}
