//! Fuzz harness of the pushbuffer decoder and the method state: arbitrary words → method calls
//! → commands, checked against the encoding and a model of the method registers.

use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};

use crate::methods::{Command, MethodError, MethodState};
use crate::pushbuf::{self, DecodeError, MethodCall};
use crate::regs::MAX_PUSH;
use crate::regs::method::*;

/// Highest method address a header can produce: address field 0x1fff, INCR of 0x1fff words.
const MAX_METHOD_ADDR: u32 = (0x1fff + 0x1ffe) * 4;

/// One pushbuffer item for the structured half of the harness.
#[derive(Debug, Arbitrary)]
enum Item {
    Incr(u16, Vec<u32>),
    NonIncr(u16, Vec<u32>),
    Immd(u16, u16),
}

/// Runs the harness on `data`: the first byte selects raw words (even) or a structured, valid
/// pushbuffer (odd) whose decoding must equal what it was built from.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let words: Vec<u32> = if mode & 1 == 0 {
        rest.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take(MAX_PUSH as usize)
            .collect()
    } else {
        let Ok(items) = Vec::<Item>::arbitrary_take_rest(Unstructured::new(rest)) else {
            return;
        };
        let (words, expected) = encode(&items);
        let (calls, err) = pushbuf::decode(&words);
        assert_eq!(err, None, "a well-formed pushbuffer failed to decode");
        assert_eq!(calls, expected, "decoding differs from the encoding");
        words
    };
    let calls = check_decode(&words);
    check_methods(&calls);
}

/// Encodes `items` and returns the words and the method calls they stand for.
fn encode(items: &[Item]) -> (Vec<u32>, Vec<MethodCall>) {
    let (mut words, mut calls) = (Vec::new(), Vec::new());
    for item in items {
        match item {
            Item::Incr(a, data) | Item::NonIncr(a, data) => {
                let addr = u32::from(*a & 0x1fff) << 2;
                let data = &data[..data.len().min(0x1fff)];
                let incr = matches!(item, Item::Incr(..));
                let n = data.len() as u32;
                words.push(if incr {
                    pushbuf::incr(addr, n)
                } else {
                    pushbuf::nonincr(addr, n)
                });
                words.extend_from_slice(data);
                for (k, &d) in data.iter().enumerate() {
                    let step = if incr { 4 * k as u32 } else { 0 };
                    calls.push(MethodCall {
                        addr: addr + step,
                        data: d,
                    });
                }
            }
            Item::Immd(a, d) => {
                let addr = u32::from(*a & 0x1fff) << 2;
                let data = u32::from(*d & 0x1fff);
                words.push(pushbuf::immd(addr, data));
                calls.push(MethodCall { addr, data });
            }
        }
    }
    (words, calls)
}

/// Decodes `words` and checks the decoder's invariants: bounded output, addresses in range, an
/// error names a header inside the segment, and the calls before it are exactly what the prefix
/// up to that header decodes to.
fn check_decode(words: &[u32]) -> Vec<MethodCall> {
    let (calls, err) = pushbuf::decode(words);
    assert!(calls.len() <= words.len(), "more calls than words");
    for c in &calls {
        assert!(
            c.addr % 4 == 0 && c.addr <= MAX_METHOD_ADDR,
            "bad call {c:?}"
        );
    }
    if let Some(e) = err {
        let index = match e {
            DecodeError::Opcode { index, header, .. }
            | DecodeError::Reserved { index, header }
            | DecodeError::Truncated { index, header, .. } => {
                assert_eq!(words.get(index), Some(&header), "error names another word");
                index
            }
        };
        let (prefix, perr) = pushbuf::decode(&words[..index]);
        assert_eq!(perr, None, "the prefix before the bad header failed");
        assert_eq!(prefix, calls, "calls before the bad header differ");
    }
    calls
}

/// Applies `calls` to a fresh method state and checks every command against a model of the
/// method registers.
fn check_methods(calls: &[MethodCall]) {
    let mut state = MethodState::default();
    let mut model: HashMap<u32, u32> = HashMap::new();
    let reg = |m: &HashMap<u32, u32>, a: u32| m.get(&a).copied().unwrap_or(0);
    let wide = |m: &HashMap<u32, u32>, hi: u32, lo: u32| {
        u64::from(reg(m, hi)) << 32 | u64::from(reg(m, lo))
    };
    for c in calls {
        let r = state.apply(c.addr, c.data);
        if r != Err(MethodError::Unknown(c.addr)) {
            model.insert(c.addr, c.data);
        }
        let Ok(Some(cmd)) = r else { continue };
        match cmd {
            Command::SemAcquire { va, payload } | Command::SemRelease { va, payload, .. } => {
                assert_eq!(c.addr, SEM_EXECUTE);
                assert_eq!(va, wide(&model, SEM_ADDR_HI, SEM_ADDR_LO));
                assert_eq!(payload, reg(&model, SEM_PAYLOAD));
            }
            Command::Copy { src, dst, len } => {
                assert_eq!(c.addr, COPY_LAUNCH);
                assert_eq!(src, wide(&model, COPY_SRC_HI, COPY_SRC_LO));
                assert_eq!(dst, wide(&model, COPY_DST_HI, COPY_DST_LO));
                assert_eq!(len, u64::from(reg(&model, COPY_LEN)));
            }
            Command::Launch(l) => {
                assert_eq!(c.addr, LAUNCH);
                assert_eq!(l.code_va, wide(&model, CODE_HI, CODE_LO));
                assert_eq!(l.code_len, reg(&model, CODE_LEN));
                assert_eq!(l.entry_va, wide(&model, ENTRY_HI, ENTRY_LO));
                assert_eq!(l.param_va, wide(&model, PARAM_HI, PARAM_LO));
                assert_eq!(l.param_len, reg(&model, PARAM_LEN));
                for k in 0..3 {
                    assert_eq!(l.grid[k], reg(&model, GRID_X + 4 * k as u32));
                    assert_eq!(l.block[k], reg(&model, BLOCK_X + 4 * k as u32));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_runs_on_random_and_crafted_inputs() {
        for input in super::super::random_inputs(0x9e37_79b9, 400, 512) {
            run(&input);
        }
        // A crafted segment: every command once, then a truncated INCR.
        let mut words = vec![
            pushbuf::incr(COPY_SRC_HI, 6),
            1,
            2,
            3,
            4,
            4096,
            0,
            pushbuf::immd(SEM_ADDR_LO, 0x40),
            pushbuf::immd(SEM_EXECUTE, SEM_OP_RELEASE),
            pushbuf::incr(CODE_HI, 18),
        ];
        words.extend(1..=18);
        words.push(pushbuf::incr(0, 5));
        let mut bytes = vec![0u8];
        bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        run(&bytes);
    }
}
