//! The VRAM section's bytes moved and checksummed on several threads (docs/snapshot.md,
//! "VRAM"): where they go or come from ([`Io`]: the stream, copied on the caller's thread, or a
//! file at offsets, each lane writing or reading its own part with `pwrite`/`pread`), and the
//! lanes themselves: pieces split into at most [`snapfmt::crc::LANE`] bytes, run on the rayon
//! pool, their CRC-32s folded in order by the caller ([`snapfmt::Crc`]). Memory stays bounded by
//! the engine's transfer buffers: lanes work in place in them.

use std::cell::Cell;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use rayon::prelude::*;
use snapfmt::Crc;
use snapfmt::crc::LANE;

/// Where the container is written or read.
#[derive(Clone, Copy)]
pub enum Io<'f> {
    /// Through the `Write`/`Read` the image was opened with.
    Stream,
    /// A file at offsets: the container begins at offset 0, `at` is the stream's offset (the
    /// [`FileAt`] the image goes through shares it).
    File { file: &'f File, at: &'f Cell<u64> },
}

/// A `Write` and `Read` over a file at a shared offset (`pwrite`/`pread`), so that bytes
/// written or read at offsets by the lanes and the container's own stay in step.
pub struct FileAt<'f> {
    pub file: &'f File,
    pub at: &'f Cell<u64>,
}

impl Write for FileAt<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write_at(b, self.at.get())?;
        self.at.set(self.at.get() + n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Read for FileAt<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(b, self.at.get())?;
        self.at.set(self.at.get() + n as u64);
        Ok(n)
    }
}

/// Bytes from which a call's lanes write a tmpfs file through a mapping of it
/// (`super::mapped`), not `pwrite` (which one file's inode lock serialises).
const MAP_MIN: u64 = 1 << 20;

/// Writes `pieces` one after another at `at` in `file`, lanes on several threads (on tmpfs
/// each copying into a shared mapping of the file, elsewhere or where none could be made with
/// `pwrite`); returns each piece's CRC.
pub fn write_at(file: &File, at: u64, pieces: &[&[u8]]) -> std::io::Result<Vec<Crc>> {
    let mut lanes = Vec::new();
    let mut off = at;
    for (i, p) in pieces.iter().enumerate() {
        for l in p.chunks(LANE) {
            lanes.push((i, off, l));
            off += l.len() as u64;
        }
    }
    let region = (off - at >= MAP_MIN && super::mapped::on_tmpfs(file))
        .then(|| {
            super::mapped::Region::new(file, at, off - at)
                .inspect_err(|e| log::debug!("vgpu: snapshot lanes: no mapping ({e}): pwrite"))
                .ok()
        })
        .flatten();
    let done: Vec<std::io::Result<(usize, Crc)>> = lanes
        .par_iter()
        .map(|&(i, off, l)| {
            let c = Crc::of(l);
            match &region {
                // SAFETY: the lanes are disjoint ranges of the file by construction (each
                // lane's offset is the previous lanes' lengths past `at`).
                Some(r) => unsafe { r.write(file, l, off) }?,
                None => file.write_all_at(l, off)?,
            }
            Ok((i, c))
        })
        .collect();
    fold(pieces.len(), done)
}

/// Fills each of `parts` from `file` at its offset, lanes on several threads; returns each
/// part's CRC. A file shorter than asked: `UnexpectedEof`.
pub fn read_at(file: &File, parts: Vec<(u64, &mut [u8])>) -> std::io::Result<Vec<Crc>> {
    let n = parts.len();
    let mut lanes = Vec::new();
    for (i, (off, p)) in parts.into_iter().enumerate() {
        let mut o = off;
        for l in p.chunks_mut(LANE) {
            let len = l.len() as u64;
            lanes.push((i, o, l));
            o += len;
        }
    }
    let done: Vec<std::io::Result<(usize, Crc)>> = lanes
        .into_par_iter()
        .map(|(i, off, l)| {
            file.read_exact_at(l, off)?;
            Ok((i, Crc::of(l)))
        })
        .collect();
    fold(n, done)
}

/// Each piece's CRC from its lanes', in order.
fn fold(n: usize, done: Vec<std::io::Result<(usize, Crc)>>) -> std::io::Result<Vec<Crc>> {
    let mut out = vec![Crc::EMPTY; n];
    for d in done {
        let (i, c) = d?;
        out[i] = out[i].then(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_write_and_read_back_with_their_crcs() {
        // Through `pwrite` or, on tmpfs (/dev/shm where it is one), a mapping.
        lanes_in(&std::env::temp_dir());
        if std::path::Path::new("/dev/shm").is_dir() {
            lanes_in(std::path::Path::new("/dev/shm"));
        }
    }

    fn lanes_in(base: &std::path::Path) {
        let dir = base.join(format!("vgpu-lanes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let a: Vec<u8> = (0..(9u32 << 20) + 5)
            .map(|i| ((i * 31) >> 7) as u8)
            .collect();
        let b = vec![7u8; 12];
        let pieces: Vec<&[u8]> = vec![&b, &a, &[], &b];
        let crcs = write_at(&file, 100, &pieces).unwrap();
        assert_eq!(crcs, pieces.iter().map(|p| Crc::of(p)).collect::<Vec<_>>());
        let mut x = vec![0u8; a.len()];
        let mut y = vec![0u8; 12];
        let got = read_at(
            &file,
            vec![(112, &mut x[..]), (112 + a.len() as u64, &mut y)],
        )
        .unwrap();
        assert_eq!((x == a, y == b), (true, true));
        assert_eq!(got, vec![Crc::of(&a), Crc::of(&b)]);
        // Past the end of the file.
        let mut z = [0u8; 8];
        let e = read_at(
            &file,
            vec![(file.metadata().unwrap().len() - 4, &mut z[..])],
        );
        assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
        // The shared offset moves with the stream's bytes.
        let at = Cell::new(3);
        let mut w = FileAt {
            file: &file,
            at: &at,
        };
        w.write_all(b"xyz").unwrap();
        assert_eq!(at.get(), 6);
        let mut r = FileAt {
            file: &file,
            at: &Cell::new(3),
        };
        let mut back = [0u8; 3];
        r.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"xyz");
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
