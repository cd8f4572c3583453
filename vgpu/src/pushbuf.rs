//! Pushbuffer decoding: a segment of 32-bit words → the method calls it encodes (INCR,
//! NONINCR, IMMD headers, see docs/hardware.md). A malformed header stops decoding; the calls
//! before it stand, as on hardware, where methods take effect as they are read.

/// One method write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodCall {
    /// Method address in bytes.
    pub addr: u32,
    pub data: u32,
}

/// Why decoding stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("word {index}: unknown opcode {opcode} in header {header:#010x}")]
    Opcode {
        index: usize,
        opcode: u32,
        header: u32,
    },
    #[error("word {index}: reserved subchannel bits set in header {header:#010x}")]
    Reserved { index: usize, header: u32 },
    #[error(
        "word {index}: header {header:#010x} announces {count} data words but the segment ends"
    )]
    Truncated {
        index: usize,
        header: u32,
        count: u32,
    },
}

use vgpu_hw::method::{OP_IMMD, OP_INCR, OP_NONINCR};

/// Decodes `words`; returns the calls and, if decoding stopped early, why.
pub fn decode(words: &[u32]) -> (Vec<MethodCall>, Option<DecodeError>) {
    let mut calls = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let header = words[i];
        let opcode = header >> 29;
        let count = (header >> 16) & 0x1fff;
        let addr = (header & 0x1fff) << 2;
        if (header >> 13) & 0x7 != 0 {
            return (calls, Some(DecodeError::Reserved { index: i, header }));
        }
        match opcode {
            OP_IMMD => {
                calls.push(MethodCall { addr, data: count });
                i += 1;
            }
            OP_INCR | OP_NONINCR => {
                let n = count as usize;
                let Some(data) = words.get(i + 1..i + 1 + n) else {
                    return (
                        calls,
                        Some(DecodeError::Truncated {
                            index: i,
                            header,
                            count,
                        }),
                    );
                };
                for (k, d) in data.iter().enumerate() {
                    let step = if opcode == OP_INCR { 4 * k as u32 } else { 0 };
                    calls.push(MethodCall {
                        addr: addr.wrapping_add(step),
                        data: *d,
                    });
                }
                i += 1 + n;
            }
            _ => {
                return (
                    calls,
                    Some(DecodeError::Opcode {
                        index: i,
                        opcode,
                        header,
                    }),
                );
            }
        }
    }
    (calls, None)
}

/// Encodes an INCR header (for tests and host-side tools).
pub fn incr(addr: u32, count: u32) -> u32 {
    OP_INCR << 29 | (count & 0x1fff) << 16 | (addr >> 2) & 0x1fff
}

/// Encodes an IMMD header.
pub fn immd(addr: u32, data: u32) -> u32 {
    OP_IMMD << 29 | (data & 0x1fff) << 16 | (addr >> 2) & 0x1fff
}

/// Encodes a NONINCR header.
pub fn nonincr(addr: u32, count: u32) -> u32 {
    OP_NONINCR << 29 | (count & 0x1fff) << 16 | (addr >> 2) & 0x1fff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(addr: u32, data: u32) -> MethodCall {
        MethodCall { addr, data }
    }

    #[test]
    fn decodes_all_three_forms() {
        let words = [
            incr(0x100, 3),
            1,
            2,
            3,
            nonincr(0x18, 2),
            7,
            8,
            immd(0x1c, 0x12),
        ];
        let (calls, err) = decode(&words);
        assert_eq!(err, None);
        assert_eq!(
            calls,
            vec![
                call(0x100, 1),
                call(0x104, 2),
                call(0x108, 3),
                call(0x18, 7),
                call(0x18, 8),
                call(0x1c, 0x12)
            ]
        );
    }

    #[test]
    fn malformed_headers_stop_decoding_after_the_good_calls() {
        let (calls, err) = decode(&[immd(0, 1), 0xe000_0000]);
        assert_eq!(calls.len(), 1);
        assert!(matches!(
            err,
            Some(DecodeError::Opcode {
                index: 1,
                opcode: 7,
                ..
            })
        ));
        let (calls, err) = decode(&[incr(0x10, 4), 1, 2]);
        assert!(calls.is_empty());
        assert!(matches!(
            err,
            Some(DecodeError::Truncated {
                index: 0,
                count: 4,
                ..
            })
        ));
        let (_, err) = decode(&[immd(0, 0) | 1 << 13]);
        assert!(matches!(err, Some(DecodeError::Reserved { index: 0, .. })));
        let (calls, err) = decode(&[]);
        assert!(calls.is_empty() && err.is_none());
    }
}
