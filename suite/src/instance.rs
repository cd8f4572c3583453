//! A concrete workload instance: buffers with their inputs and expected outputs, launches, and the check.

use alloc::vec::Vec;
use core::fmt;

use crate::Size;
use crate::param::Param;

/// Element type of a buffer compared exactly (used to index and print mismatches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// Bytes.
    U8,
    /// Little-endian u32 words.
    U32,
    /// Little-endian i32 words.
    I32,
    /// Little-endian u64 words.
    U64,
    /// f32, compared bit for bit.
    F32,
}

impl Elem {
    /// Width in bytes.
    pub const fn size(self) -> usize {
        match self {
            Elem::U8 => 1,
            Elem::U32 | Elem::I32 | Elem::F32 => 4,
            Elem::U64 => 8,
        }
    }

    fn value(self, b: &[u8]) -> Value {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        let v = u64::from_le_bytes(w);
        match self {
            Elem::U8 | Elem::U32 | Elem::U64 => Value::U64(v),
            Elem::I32 => Value::I64(i64::from(v as u32 as i32)),
            Elem::F32 => Value::F32(f32::from_bits(v as u32)),
        }
    }
}

/// What a buffer must hold after the last launch.
#[derive(Clone, Debug, PartialEq)]
pub enum Expect {
    /// Not read back (input-only or scratch).
    Ignore,
    /// Exactly these bytes; `elem` says how to index and print a difference.
    Exact {
        /// Element type.
        elem: Elem,
        /// Expected contents.
        bytes: Vec<u8>,
    },
    /// f32 values, each within `abs + rel * |expected|` (NaN must meet NaN).
    F32 {
        /// Expected values.
        values: Vec<f32>,
        /// Absolute tolerance.
        abs: f32,
        /// Relative tolerance.
        rel: f32,
    },
    /// Little-endian u64 values, each at least `min` (timing results).
    U64AtLeast {
        /// How many values.
        count: usize,
        /// Lower bound of each.
        min: u64,
    },
}

impl Expect {
    /// Size in bytes the read-back buffer must have (0 for `Ignore`).
    pub fn len_bytes(&self) -> usize {
        match self {
            Expect::Ignore => 0,
            Expect::Exact { bytes, .. } => bytes.len(),
            Expect::F32 { values, .. } => values.len() * 4,
            Expect::U64AtLeast { count, .. } => count * 8,
        }
    }
}

/// One device buffer of an instance.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    /// Short name (for messages).
    pub name: &'static str,
    /// Initial contents (its length is the buffer size); the driver copies it in before the
    /// first launch.
    pub init: Vec<u8>,
    /// Expected contents after the last launch.
    pub expect: Expect,
}

impl Buffer {
    /// Whether the driver must read this buffer back for [`Instance::check`].
    pub fn read_back(&self) -> bool {
        !matches!(self.expect, Expect::Ignore)
    }
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Entry (`.entry` name) in the workload's PTX.
    pub entry: &'static str,
    /// Grid size in CTAs.
    pub grid: [u32; 3],
    /// CTA size in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// Parameters in `.entry` order.
    pub params: Vec<Param>,
}

impl Launch {
    /// 1-D launch without dynamic shared memory.
    pub fn linear(entry: &'static str, grid: u32, block: u32, params: Vec<Param>) -> Self {
        Self {
            entry,
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            params,
        }
    }

    /// Total threads launched.
    pub fn threads(&self) -> u64 {
        self.grid
            .iter()
            .chain(&self.block)
            .map(|&d| u64::from(d))
            .product()
    }
}

/// A runnable instance of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    /// Workload name.
    pub workload: &'static str,
    /// Size it was made for.
    pub size: Size,
    /// PTX module text (all launches use entries of this module).
    pub ptx: &'static str,
    /// Buffers; `Param::Buffer(i)` refers to `buffers[i]`.
    pub buffers: Vec<Buffer>,
    /// Launches, run in order on one stream (each sees the previous one's writes).
    pub launches: Vec<Launch>,
    /// Rough count of thread-instructions executed (all launches), for sizing runs on an
    /// interpreter; timing-dependent kernels give their count for an interpreter at ~1e8/s.
    pub approx_thread_instrs: u64,
}

/// Outcome of a successful check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Buffers compared.
    pub buffers: usize,
    /// Elements compared.
    pub elements: usize,
    /// Largest absolute difference seen in a tolerance (F32) comparison, 0 otherwise.
    pub max_abs_err: f32,
}

/// A value in a mismatch report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// Unsigned integer (u8, u32, u64 elements).
    U64(u64),
    /// Signed integer.
    I64(i64),
    /// f32 value.
    F32(f32),
    /// "at least this" bound.
    AtLeast(u64),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U64(v) => write!(f, "{v} ({v:#x})"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v:e} ({:#010x})", v.to_bits()),
            Value::AtLeast(v) => write!(f, ">= {v}"),
        }
    }
}

/// Why outputs were rejected.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Mismatch {
    /// `outputs` must have one slice per buffer.
    #[error("expected {expected} output slices (one per buffer), got {got}")]
    OutputCount {
        /// Buffers in the instance.
        expected: usize,
        /// Slices given.
        got: usize,
    },
    /// A read-back buffer has the wrong size.
    #[error("buffer {buffer} ({name}): expected {expected} bytes, got {got}")]
    Length {
        /// Buffer index.
        buffer: usize,
        /// Buffer name.
        name: &'static str,
        /// Expected size.
        expected: usize,
        /// Size given.
        got: usize,
    },
    /// An element differs (the first one found).
    #[error("buffer {buffer} ({name}) element {index}: expected {expected}, got {got}")]
    Value {
        /// Buffer index.
        buffer: usize,
        /// Buffer name.
        name: &'static str,
        /// Element index.
        index: usize,
        /// Expected value.
        expected: Value,
        /// Value found.
        got: Value,
    },
}

/// An instance whose own description is inconsistent (a bug in the suite, caught by tests).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InstanceError {
    /// A launch parameter names a buffer that does not exist.
    #[error("launch {launch} parameter {param} names buffer {index} of {buffers}")]
    NoSuchBuffer {
        /// Launch index.
        launch: usize,
        /// Parameter index.
        param: usize,
        /// Buffer named.
        index: usize,
        /// Buffers in the instance.
        buffers: usize,
    },
    /// An expected output does not have the buffer's size.
    #[error("buffer {buffer} ({name}) is {size} bytes but its expected output is {expected}")]
    ExpectSize {
        /// Buffer index.
        buffer: usize,
        /// Buffer name.
        name: &'static str,
        /// Buffer size.
        size: usize,
        /// Expected-output size.
        expected: usize,
    },
    /// A launch has a zero dimension or more than 1024 threads per CTA.
    #[error("launch {launch} has an invalid shape grid {grid:?} block {block:?}")]
    Shape {
        /// Launch index.
        launch: usize,
        /// Grid.
        grid: [u32; 3],
        /// Block.
        block: [u32; 3],
    },
    /// A launch's entry is not declared in the PTX text.
    #[error("launch {launch} entry {entry} is not in the module")]
    NoSuchEntry {
        /// Launch index.
        launch: usize,
        /// Entry name.
        entry: &'static str,
    },
}

impl Instance {
    /// The same instance with its launch list run `times` times in a row (at least once):
    /// `Size::Xl`'s repeated kernels. The caller's expected outputs must already be those of
    /// `times` runs (the same for kernels whose outputs depend only on their inputs).
    pub fn repeated(mut self, times: u32) -> Self {
        let times = times.max(1);
        let once = core::mem::take(&mut self.launches);
        for _ in 0..times {
            self.launches.extend(once.iter().cloned());
        }
        self.approx_thread_instrs = self.approx_thread_instrs.saturating_mul(u64::from(times));
        self
    }

    /// Indices of the buffers to read back.
    pub fn read_back(&self) -> impl Iterator<Item = usize> + '_ {
        self.buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.read_back())
            .map(|(i, _)| i)
    }

    /// Checks the instance's own consistency (buffer indices, sizes, shapes, entries).
    pub fn validate(&self) -> Result<(), InstanceError> {
        for (i, b) in self.buffers.iter().enumerate() {
            let e = b.expect.len_bytes();
            if b.read_back() && e != b.init.len() {
                return Err(InstanceError::ExpectSize {
                    buffer: i,
                    name: b.name,
                    size: b.init.len(),
                    expected: e,
                });
            }
        }
        for (l, launch) in self.launches.iter().enumerate() {
            let threads: u32 = launch.block.iter().product();
            if launch.grid.contains(&0) || launch.block.contains(&0) || threads > 1024 {
                return Err(InstanceError::Shape {
                    launch: l,
                    grid: launch.grid,
                    block: launch.block,
                });
            }
            if !declares_entry(self.ptx, launch.entry) {
                return Err(InstanceError::NoSuchEntry {
                    launch: l,
                    entry: launch.entry,
                });
            }
            for (p, param) in launch.params.iter().enumerate() {
                if let Param::Buffer(index) = *param
                    && index >= self.buffers.len()
                {
                    return Err(InstanceError::NoSuchBuffer {
                        launch: l,
                        param: p,
                        index,
                        buffers: self.buffers.len(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Compares the buffers' contents after the last launch with the CPU reference.
    /// `outputs[i]` is buffer `i`'s contents; slices of buffers that are not read back are
    /// not looked at (they may be empty).
    pub fn check(&self, outputs: &[&[u8]]) -> Result<Summary, Mismatch> {
        if outputs.len() != self.buffers.len() {
            return Err(Mismatch::OutputCount {
                expected: self.buffers.len(),
                got: outputs.len(),
            });
        }
        let mut sum = Summary {
            buffers: 0,
            elements: 0,
            max_abs_err: 0.0,
        };
        for (i, (b, got)) in self.buffers.iter().zip(outputs).enumerate() {
            if !b.read_back() {
                continue;
            }
            let want = b.expect.len_bytes();
            if got.len() != want {
                return Err(Mismatch::Length {
                    buffer: i,
                    name: b.name,
                    expected: want,
                    got: got.len(),
                });
            }
            let value = |index, expected, got| Mismatch::Value {
                buffer: i,
                name: b.name,
                index,
                expected,
                got,
            };
            match &b.expect {
                Expect::Ignore => {}
                Expect::Exact { elem, bytes } => {
                    let w = elem.size();
                    for (k, (e, g)) in bytes.chunks(w).zip(got.chunks(w)).enumerate() {
                        if e != g {
                            return Err(value(k, elem.value(e), elem.value(g)));
                        }
                    }
                    sum.elements += bytes.len() / w;
                }
                Expect::F32 { values, abs, rel } => {
                    for (k, (&e, g)) in values.iter().zip(got.chunks(4)).enumerate() {
                        let g = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
                        match f32_close(e, g, *abs, *rel) {
                            Some(err) => sum.max_abs_err = sum.max_abs_err.max(err),
                            None => return Err(value(k, Value::F32(e), Value::F32(g))),
                        }
                    }
                    sum.elements += values.len();
                }
                Expect::U64AtLeast { min, .. } => {
                    for (k, g) in got.chunks(8).enumerate() {
                        let v =
                            u64::from_le_bytes([g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]]);
                        if v < *min {
                            return Err(value(k, Value::AtLeast(*min), Value::U64(v)));
                        }
                    }
                    sum.elements += got.len() / 8;
                }
            }
            sum.buffers += 1;
        }
        Ok(sum)
    }

    /// The expected contents of every buffer as bytes (inputs for `Ignore` buffers; for
    /// `U64AtLeast` the bound itself): outputs that [`Instance::check`] accepts.
    pub fn reference_outputs(&self) -> Vec<Vec<u8>> {
        self.buffers
            .iter()
            .map(|b| match &b.expect {
                Expect::Ignore => b.init.clone(),
                Expect::Exact { bytes, .. } => bytes.clone(),
                Expect::F32 { values, .. } => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                Expect::U64AtLeast { count, min } => {
                    (0..*count).flat_map(|_| min.to_le_bytes()).collect()
                }
            })
            .collect()
    }
}

/// Absolute error if `got` is within tolerance of `expected`, `None` otherwise.
fn f32_close(expected: f32, got: f32, abs: f32, rel: f32) -> Option<f32> {
    if expected.is_nan() || got.is_nan() {
        return (expected.is_nan() && got.is_nan()).then_some(0.0);
    }
    if expected == got {
        return Some(0.0);
    }
    let err = (expected - got).abs();
    (err <= abs + rel * expected.abs()).then_some(err)
}

/// Whether `ptx` declares `.entry name(`.
fn declares_entry(ptx: &str, name: &str) -> bool {
    ptx.match_indices(".entry").any(|(at, m)| {
        let rest = ptx[at + m.len()..].trim_start();
        rest.strip_prefix(name)
            .is_some_and(|r| r.trim_start().starts_with('('))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_tolerance() {
        assert_eq!(f32_close(1.0, 1.0, 0.0, 0.0), Some(0.0));
        assert!(f32_close(1.0, 1.0 + 1e-6, 0.0, 2e-6).is_some());
        assert!(f32_close(1.0, 1.0 + 1e-5, 0.0, 2e-6).is_none());
        assert!(f32_close(f32::NAN, f32::NAN, 0.0, 0.0).is_some());
        assert!(f32_close(f32::NAN, 0.0, 1.0, 1.0).is_none());
        assert!(f32_close(0.0, f32::NAN, 1.0, 1.0).is_none());
        assert!(f32_close(f32::INFINITY, f32::INFINITY, 0.0, 0.0).is_some());
        assert!(f32_close(f32::INFINITY, f32::MAX, 1.0, 0.0).is_none());
    }

    #[test]
    fn entry_detection() {
        let ptx = ".visible .entry foo(\n.param .u64 a)\n{ ret; }\n.visible .entry foobar (\n)";
        assert!(declares_entry(ptx, "foo"));
        assert!(declares_entry(ptx, "foobar"));
        assert!(!declares_entry(ptx, "fo"));
        assert!(!declares_entry(ptx, "bar"));
    }
}
