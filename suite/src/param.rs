//! Kernel parameters and their byte layout in a PTX `.param` space (each one at its natural alignment).

use alloc::vec::Vec;

/// One kernel parameter. `Buffer(i)` stands for the GPU address of the instance's buffer `i`:
/// the driver substitutes it (a `.u64` in PTX).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param {
    /// Address of buffer `index` of the instance (8 bytes).
    Buffer(usize),
    /// `.u32` / `.b32`.
    U32(u32),
    /// `.s32`.
    I32(i32),
    /// `.u64` / `.b64`.
    U64(u64),
    /// `.s64`.
    I64(i64),
    /// `.f32`.
    F32(f32),
    /// `.f64`.
    F64(f64),
}

/// A parameter list that cannot be laid out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A `Param::Buffer` names a buffer the driver did not give an address for.
    #[error(
        "parameter {param} refers to buffer {index}, but only {available} buffer addresses were given"
    )]
    NoSuchBuffer {
        /// Position of the parameter in the list.
        param: usize,
        /// The buffer index it names.
        index: usize,
        /// How many addresses were given.
        available: usize,
    },
}

impl Param {
    /// Size in bytes in the parameter space; the alignment is the same.
    pub const fn size(&self) -> u32 {
        match self {
            Param::U32(_) | Param::I32(_) | Param::F32(_) => 4,
            Param::Buffer(_) | Param::U64(_) | Param::I64(_) | Param::F64(_) => 8,
        }
    }

    /// Raw little-endian bits, zero-extended to 64 bits; for `Buffer` the address from
    /// `buffer_addrs`.
    pub fn bits(&self, buffer_addrs: &[u64]) -> Option<u64> {
        Some(match *self {
            Param::Buffer(i) => *buffer_addrs.get(i)?,
            Param::U32(v) => u64::from(v),
            Param::I32(v) => u64::from(v as u32),
            Param::U64(v) => v,
            Param::I64(v) => v as u64,
            Param::F32(v) => u64::from(v.to_bits()),
            Param::F64(v) => v.to_bits(),
        })
    }
}

/// Byte offset of each parameter: each one starts at the next multiple of its own size
/// (PTX `.param` rule for scalars: natural alignment, no reordering).
pub fn param_offsets(params: &[Param]) -> Vec<u32> {
    let mut off = 0u32;
    params
        .iter()
        .map(|p| {
            let a = p.size();
            off = off.next_multiple_of(a);
            let at = off;
            off += a;
            at
        })
        .collect()
}

/// Total size of the laid-out parameters (end of the last one, not padded further).
pub fn params_size(params: &[Param]) -> u32 {
    match (param_offsets(params).last(), params.last()) {
        (Some(off), Some(p)) => off + p.size(),
        _ => 0,
    }
}

/// The parameter bytes a kernel sees (what `cuLaunchKernel`'s `CU_LAUNCH_PARAM_BUFFER_POINTER`
/// takes), with `buffer_addrs[i]` substituted for `Param::Buffer(i)`. Padding bytes are zero.
pub fn layout_params(params: &[Param], buffer_addrs: &[u64]) -> Result<Vec<u8>, LayoutError> {
    let offsets = param_offsets(params);
    let mut out = alloc::vec![0u8; params_size(params) as usize];
    for (i, (p, off)) in params.iter().zip(offsets).enumerate() {
        let bits = p.bits(buffer_addrs).ok_or(LayoutError::NoSuchBuffer {
            param: i,
            index: match p {
                Param::Buffer(b) => *b,
                _ => 0,
            },
            available: buffer_addrs.len(),
        })?;
        let n = p.size() as usize;
        let off = off as usize;
        out[off..off + n].copy_from_slice(&bits.to_le_bytes()[..n]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_natural_alignment() {
        let p = [
            Param::U32(1),
            Param::Buffer(0),
            Param::F32(2.0),
            Param::I32(-1),
            Param::F64(0.5),
            Param::U32(3),
        ];
        assert_eq!(param_offsets(&p), [0, 8, 16, 20, 24, 32]);
        assert_eq!(params_size(&p), 36);
        assert_eq!(params_size(&[]), 0);
    }

    #[test]
    fn layout_substitutes_addresses_and_zeroes_padding() {
        let p = [Param::U32(0xaabb_ccdd), Param::Buffer(1), Param::I32(-2)];
        let bytes = layout_params(&p, &[0x1111, 0x0102_0304_0506_0708]).unwrap();
        assert_eq!(bytes.len(), 20);
        assert_eq!(bytes[0..4], [0xdd, 0xcc, 0xbb, 0xaa]);
        assert_eq!(bytes[4..8], [0; 4]);
        assert_eq!(bytes[8..16], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(bytes[16..20], (-2i32).to_le_bytes());
    }

    #[test]
    fn missing_buffer_is_an_error() {
        let e = layout_params(&[Param::U64(1), Param::Buffer(2)], &[0, 0]).unwrap_err();
        assert_eq!(
            e,
            LayoutError::NoSuchBuffer {
                param: 1,
                index: 2,
                available: 2
            }
        );
    }
}
