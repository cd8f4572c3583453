//! Fuzz harness of the vgpud protocol, shared by the cargo-fuzz target `wire` in `/fuzz`
//! (feature `fuzzing`) and by this crate's tests (docs/fuzzing.md).
//!
//! An arbitrary datagram (with or without a descriptor attached) goes through a real
//! `SOCK_SEQPACKET` pair into `Conn::recv`, and what arrives into `decode` as both message
//! directions. Checked: the bytes arrive unchanged or, when longer than the receive buffer, as
//! `Truncated` (never a short message); an attached descriptor arrives; only messages within
//! `MAX_MESSAGE` decode, and a decoded message re-encodes to bytes that decode to it again.

use std::fs::File;
use std::os::fd::AsFd;
use std::sync::OnceLock;

use crate::proto::{MAX_MESSAGE, ToDaemon, ToVm, decode, encode};
use crate::wire::{Conn, Received, WireError};

/// A connected socket pair and a descriptor to pass, made once per process.
fn pair() -> &'static (Conn, Conn, File) {
    static PAIR: OnceLock<(Conn, Conn, File)> = OnceLock::new();
    PAIR.get_or_init(|| {
        let (a, b) = Conn::pair().expect("socketpair");
        (a, b, File::open("/dev/null").expect("/dev/null"))
    })
}

/// Runs the harness on `data`: byte 0 bit 0 attaches a descriptor, bit 1 receives into a
/// buffer of byte 1's size instead of `MAX_MESSAGE`; the rest is the datagram.
pub fn run(data: &[u8]) {
    let (Some(&flags), Some(&small)) = (data.first(), data.get(1)) else {
        return;
    };
    let msg = &data[2..];
    let (tx, rx, file) = pair();
    let fd = (flags & 1 != 0).then(|| file.as_fd());
    // Datagrams above the socket buffer fail to send (EMSGSIZE): nothing to receive then.
    if tx.send(msg, fd).is_err() {
        return;
    }
    let mut buf = vec![
        0u8;
        if flags & 2 != 0 {
            usize::from(small)
        } else {
            MAX_MESSAGE
        }
    ];
    match rx.try_recv(&mut buf) {
        Ok(Received::Message(n, got_fd)) => {
            assert!(msg.len() <= buf.len(), "a longer datagram was not refused");
            assert_eq!(&buf[..n], msg, "datagram changed in transit");
            assert_eq!(
                got_fd.is_some(),
                fd.is_some(),
                "descriptor lost or invented"
            );
        }
        Ok(Received::Closed) => {
            // An empty datagram without a descriptor reads as end of file (SEQPACKET).
            assert!(
                msg.is_empty() && fd.is_none(),
                "a datagram read as end of file"
            );
        }
        Ok(Received::Empty) => panic!("a sent datagram did not arrive"),
        Err(WireError::Truncated(len)) => {
            assert_eq!(len, buf.len());
            assert!(msg.len() > buf.len(), "a fitting datagram was refused");
        }
        Err(e) => panic!("recv: {e}"),
    }
    check_decode::<ToDaemon>(msg);
    check_decode::<ToVm>(msg);
}

fn check_decode<T>(bytes: &[u8])
where
    T: for<'a> serde::Deserialize<'a> + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let Ok(m) = decode::<T>(bytes) else { return };
    assert!(
        bytes.len() <= MAX_MESSAGE,
        "an oversized message was decoded"
    );
    let again = encode(&m);
    assert!(!again.is_empty(), "encoding failed");
    assert_eq!(
        decode::<T>(&again).ok().as_ref(),
        Some(&m),
        "re-encoded message differs"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Hello, RunOutcome};

    #[test]
    fn harness_runs_on_random_and_valid_inputs() {
        let mut inputs = Vec::new();
        let mut s = 0x0bad_cafe_u64;
        for _ in 0..300 {
            let mut next = || {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                s.wrapping_mul(0x2545_f491_4f6c_dd1d)
            };
            let len = (next() % 600) as usize;
            inputs.push((0..len).map(|_| (next() >> 56) as u8).collect::<Vec<u8>>());
        }
        let valid = [
            encode(&ToDaemon::Hello(Hello {
                version: 1,
                name: "vm \u{e9}".into(),
                weight: 2,
                priority: 1,
                vram: 64 << 20,
                channels: 4,
                resume: None,
                gpu: Some(1),
                word: false,
            })),
            encode(&ToDaemon::Hello(Hello {
                version: 3,
                name: "back".into(),
                weight: 1,
                priority: 0,
                vram: 2 << 20,
                channels: 1,
                resume: Some(crate::proto::Resume {
                    boot: "00ff".into(),
                    vm: 7,
                    gpu: 1,
                    vram_offset: 2 << 20,
                }),
                gpu: None,
                word: true,
            })),
            encode(&ToDaemon::Done {
                seq: 3,
                outcome: RunOutcome::Faulted,
                gpu_ns: 1,
                start_ns: 2,
                end_ns: 3,
                more: false,
            }),
            encode(&ToVm::Error {
                message: "no \"quota\"\n".into(),
                fatal: true,
            }),
            br#"{"type":"grant","seq":1,"slice_ns":2}"#.to_vec(),
            vec![b' '; MAX_MESSAGE + 1],
        ];
        for (i, v) in valid.into_iter().enumerate() {
            let mut input = vec![i as u8, 16];
            input.extend(v);
            inputs.push(input);
        }
        inputs.push(vec![1, 0]);
        for input in inputs {
            run(&input);
        }
    }
}
