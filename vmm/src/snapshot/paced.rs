//! A reader with one deadline over many reads: the start of an incoming migration stream (its
//! header and manifest) must arrive within [`super::stream::PATIENCE`] in all, not per read, so
//! that a peer trickling a byte at a time cannot hold a destination (a standby serves no
//! request meanwhile) for up to the manifest's size times the per-read timeout. Each read is
//! still bounded by the link's own timeout, so the whole start is bounded by the deadline
//! plus one read's timeout. Past the start the deadline is lifted ([`Paced::lift`]): the
//! rounds of a live migration take as long as the guest needs.

use std::cell::Cell;
use std::io::{self, Read};
use std::time::Instant;

/// `inner` read with a deadline until [`Paced::lift`].
pub struct Paced<R> {
    inner: R,
    until: Cell<Option<Instant>>,
}

impl<R: Read> Paced<R> {
    /// Reads from `inner`, refusing any read that starts at or after `until`.
    pub fn new(inner: R, until: Instant) -> Self {
        Paced {
            inner,
            until: Cell::new(Some(until)),
        }
    }

    /// No deadline from now on.
    pub fn lift(&self) {
        self.until.set(None);
    }
}

impl<R: Read> Read for Paced<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.until.get().is_some_and(|u| Instant::now() >= u) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the stream's header and manifest did not arrive in time",
            ));
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    #[test]
    fn a_trickling_peer_meets_the_deadline_and_a_lifted_one_does_not() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            // A byte every 20 ms, each well within any per-read timeout.
            for _ in 0..30 {
                if b.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let start = Instant::now();
        let mut r = Paced::new(&a, start + Duration::from_millis(150));
        let mut buf = [0u8; 30];
        let err = r.read_exact(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert!(took < Duration::from_millis(500), "{took:?}");
        // Lifted: the rest arrives whatever it takes (to the writer's end: its socket closed).
        r.lift();
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        writer.join().unwrap();
        assert!(!rest.is_empty());
    }
}
