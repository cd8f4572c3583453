//! The destination's readiness in a live GPU migration (docs/snapshot.md "The source waits for
//! the destination's engine"): the destination makes the GPU's engine while the pre-copy rounds
//! arrive (a cuda context takes ~0.3 s), so a source whose rounds converge sooner would pause
//! the guest and wait for it in the paused round. A source that can wait says so in the
//! manifest's `vmm_version` ([`CAPABILITY`] after the version: older destinations ignore that
//! informational field, while an unknown manifest field would make them refuse it); a
//! destination that reads it answers lines on the same connection, each ended by `\n`:
//! `ready/1 hello` right after the manifest (it understands the source's `WAIT` frame), then
//! `ready/1 prepared ENGINE_US` once its engine is made and holds every VRAM page received so
//! far, or `ready/1 fallback` when it makes none during the rounds. Its last line stays `ok` or
//! `error: ...` after the end frame. A destination that was not asked sends nothing before
//! that, so an older source, which reads only the last line, is never confused. Lines are
//! bounded ([`MAX_LINE`]) and checked; anything else is an error.

use std::time::{Duration, Instant};

use super::transport::Link;

/// What a source that waits for the destination's engine adds to the manifest's
/// `vmm_version`; the `1` is the version of the lines below.
pub const CAPABILITY: &str = "ready-ack/1";
/// Longest wait, after the rounds converged, for the `prepared`/`fallback` line.
pub const READY_WAIT: Duration = Duration::from_secs(5);
/// Longest wait, after the rounds converged, for the `hello` line (an older destination sends
/// none: the source then pauses as before).
pub const HELLO_WAIT: Duration = Duration::from_millis(500);
/// How long the source polls for a line between two rounds while it waits.
pub const POLL_SLICE: Duration = Duration::from_millis(10);
/// Longest line accepted (an `error: ` answer included).
pub const MAX_LINE: usize = 4096;
/// Engine times above this (an hour) are refused as nonsense.
const MAX_ENGINE_US: u64 = 3_600_000_000;

/// A line of the destination before its final answer.
#[derive(Debug, Clone, PartialEq)]
pub enum DestMsg {
    /// It reads the source's `WAIT` frame and will say when it is ready.
    Hello,
    /// Its engine is made and holds the VRAM received so far (`prepared`, with the time it
    /// took to make), or it makes none during the rounds (`fallback`, `engine_us` 0).
    Ready { prepared: bool, engine_us: u64 },
    /// It refused the VM (`error: ...`, its final answer, early).
    Refused(String),
}

/// Why a destination's line is refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReadyError {
    #[error("destination's line longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("destination's line is not UTF-8")]
    NotText,
    #[error("destination's line {0:?}: unsupported version (this build speaks ready/1)")]
    Version(String),
    #[error("destination's line {0:?} not understood")]
    Unknown(String),
    #[error("the destination closed the connection during the rounds")]
    Closed,
}

/// Whether a manifest's `vmm_version` asks for the lines.
pub fn asked(vmm_version: &str) -> bool {
    vmm_version.split_whitespace().any(|w| w == CAPABILITY)
}

/// `vmm_version` with the capability added (once).
pub fn asking(vmm_version: &str) -> String {
    if asked(vmm_version) {
        vmm_version.to_owned()
    } else {
        format!("{vmm_version} {CAPABILITY}")
    }
}

/// The line of `msg` (with its `\n`).
pub fn line(msg: &DestMsg) -> String {
    match msg {
        DestMsg::Hello => "ready/1 hello\n".into(),
        DestMsg::Ready {
            prepared: true,
            engine_us,
        } => format!("ready/1 prepared {engine_us}\n"),
        DestMsg::Ready {
            prepared: false, ..
        } => "ready/1 fallback\n".into(),
        DestMsg::Refused(e) => format!("error: {}\n", e.replace('\n', " ")),
    }
}

/// Parses one line (without its `\n`).
pub fn parse(line: &[u8]) -> Result<DestMsg, ReadyError> {
    if line.len() > MAX_LINE {
        return Err(ReadyError::TooLong);
    }
    let text = std::str::from_utf8(line).map_err(|_| ReadyError::NotText)?;
    if let Some(e) = text.strip_prefix("error: ") {
        return Ok(DestMsg::Refused(e.to_owned()));
    }
    let unknown = || ReadyError::Unknown(text.to_owned());
    let mut words = text.split(' ');
    match words.next().and_then(|w| w.strip_prefix("ready/")) {
        Some("1") => {}
        Some(_) => return Err(ReadyError::Version(text.to_owned())),
        None => return Err(unknown()),
    }
    let msg = match (words.next(), words.next()) {
        (Some("hello"), None) => DestMsg::Hello,
        (Some("fallback"), None) => DestMsg::Ready {
            prepared: false,
            engine_us: 0,
        },
        (Some("prepared"), Some(us)) => {
            let engine_us = us
                .parse::<u64>()
                .ok()
                .filter(|&v| v <= MAX_ENGINE_US && us.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(unknown)?;
            DestMsg::Ready {
                prepared: true,
                engine_us,
            }
        }
        _ => return Err(unknown()),
    };
    if words.next().is_some() {
        return Err(unknown());
    }
    Ok(msg)
}

/// The source's side: bytes the destination sent during the rounds, cut into lines.
#[derive(Debug, Default)]
pub struct Inbox {
    buf: Vec<u8>,
}

impl Inbox {
    /// The next line, read from `conn` for at most `wait` if none is here yet; `None` if none
    /// came in time.
    pub fn poll(&mut self, conn: &Link, wait: Duration) -> Result<Option<DestMsg>, ReadyError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let rest = self.buf.split_off(i + 1);
                let line = std::mem::replace(&mut self.buf, rest);
                return parse(&line[..i]).map(Some);
            }
            if self.buf.len() >= MAX_LINE {
                return Err(ReadyError::TooLong);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = vec![0u8; MAX_LINE - self.buf.len()];
            match conn.try_read(&mut chunk, left) {
                Ok(Some(0)) => return Err(ReadyError::Closed),
                Ok(Some(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(None) => return Ok(None),
                Err(e) => {
                    log::warn!("migration: read the destination's line: {e}");
                    return Err(ReadyError::Closed);
                }
            }
        }
    }

    /// What was read past the lines taken (the start of the final answer, if any).
    pub fn rest(&self) -> &[u8] {
        &self.buf
    }
}

/// Source side, after sending failed: the destination's `error: ...` line if it sent one
/// before closing the connection (a destination that refused the VM at its manifest, e.g. a
/// standby it does not fit), read for at most [`REFUSAL_WAIT`]. Lines before it (`ready/1`)
/// are skipped; at most [`MAX_LINE`] bytes are read per line.
pub fn refusal(conn: &Link) -> Option<String> {
    let mut inbox = Inbox::default();
    let deadline = Instant::now() + REFUSAL_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match inbox.poll(conn, left) {
            Ok(Some(DestMsg::Refused(why))) => return Some(why),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return None,
        }
    }
}

/// How long the source looks for the destination's reason after its sending failed.
pub const REFUSAL_WAIT: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn lines_round_trip() {
        for m in [
            DestMsg::Hello,
            DestMsg::Ready {
                prepared: true,
                engine_us: 290_123,
            },
            DestMsg::Ready {
                prepared: false,
                engine_us: 0,
            },
            DestMsg::Refused("no GPU here".into()),
        ] {
            let l = line(&m);
            assert_eq!(parse(l.trim_end_matches('\n').as_bytes()), Ok(m));
        }
    }

    #[test]
    fn hostile_lines_are_refused() {
        let e = |s: &[u8]| parse(s).unwrap_err();
        assert!(matches!(e(b"ready/2 hello"), ReadyError::Version(_)));
        assert!(matches!(e(b"ready/ hello"), ReadyError::Version(_)));
        assert!(matches!(e(b"ok"), ReadyError::Unknown(_)));
        assert!(matches!(e(b""), ReadyError::Unknown(_)));
        assert!(matches!(e(b"ready/1"), ReadyError::Unknown(_)));
        assert!(matches!(e(b"ready/1 prepared"), ReadyError::Unknown(_)));
        assert!(matches!(e(b"ready/1 prepared -1"), ReadyError::Unknown(_)));
        assert!(matches!(e(b"ready/1 prepared +5"), ReadyError::Unknown(_)));
        assert!(matches!(
            e(b"ready/1 prepared 18446744073709551616"),
            ReadyError::Unknown(_)
        ));
        assert!(matches!(
            e(b"ready/1 prepared 3600000001"),
            ReadyError::Unknown(_)
        ));
        assert!(matches!(e(b"ready/1 prepared 5 6"), ReadyError::Unknown(_)));
        assert!(matches!(e(b"ready/1 hello "), ReadyError::Unknown(_)));
        assert!(matches!(e(b"ready/1 fallback x"), ReadyError::Unknown(_)));
        assert_eq!(e(b"ready/1 \xff"), ReadyError::NotText);
        assert_eq!(e(&[b'a'; MAX_LINE + 1]), ReadyError::TooLong);
    }

    #[test]
    fn the_capability_is_asked_once_and_found_as_a_word() {
        let v = asking("0.1.0");
        assert_eq!(v, "0.1.0 ready-ack/1");
        assert_eq!(asking(&v), v);
        assert!(asked(&v));
        assert!(!asked("0.1.0"));
        assert!(!asked("0.1.0 ready-ack/10"));
        assert!(!asked("0.1.0ready-ack/1"));
    }

    #[test]
    fn the_inbox_cuts_lines_keeps_the_rest_and_bounds_them() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let b = Link::from(b);
        let mut a = a;
        let mut inbox = Inbox::default();
        // Nothing yet: None within the wait.
        assert_eq!(inbox.poll(&b, Duration::from_millis(5)), Ok(None));
        // A line cut in two, then a line and the start of the final answer.
        a.write_all(b"ready/1 hel").unwrap();
        assert_eq!(inbox.poll(&b, Duration::from_millis(5)), Ok(None));
        a.write_all(b"lo\nready/1 prepared 7\nok").unwrap();
        assert_eq!(inbox.poll(&b, Duration::ZERO), Ok(Some(DestMsg::Hello)));
        assert_eq!(
            inbox.poll(&b, Duration::from_millis(50)),
            Ok(Some(DestMsg::Ready {
                prepared: true,
                engine_us: 7
            }))
        );
        assert_eq!(inbox.poll(&b, Duration::from_millis(5)), Ok(None));
        assert_eq!(inbox.rest(), b"ok");
        // A line without end: refused at MAX_LINE, not buffered on.
        a.write_all(&[b'x'; MAX_LINE]).unwrap();
        let mut r = Ok(None);
        for _ in 0..100 {
            r = inbox.poll(&b, Duration::from_millis(10));
            if r != Ok(None) {
                break;
            }
        }
        assert_eq!(r, Err(ReadyError::TooLong));
        // The peer gone.
        let mut closed = Inbox::default();
        drop(a);
        assert_eq!(
            closed.poll(&b, Duration::from_millis(50)),
            Err(ReadyError::Closed)
        );
    }
}
