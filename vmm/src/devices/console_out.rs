//! Where the UART's output goes: stdout as is, or (`--console-prefix TEXT`) whole lines, each
//! with the prefix, written with one `write(2)` each so that the lines of VMs sharing a
//! terminal or pipe never mix (a pipe keeps writes of up to PIPE_BUF bytes whole).

use std::io::Write;

/// Longest line kept whole; longer ones are cut into pieces of this size, each prefixed.
const MAX_LINE: usize = 2048;

/// The UART's output for `prefix` (none: stdout unchanged).
pub fn console_out(prefix: Option<String>) -> Box<dyn Write + Send> {
    match prefix {
        None => Box::new(std::io::stdout()),
        Some(p) => Box::new(Prefixed::new(p, std::io::stdout())),
    }
}

/// Buffers a line and writes `prefix + line` at its newline (or at `MAX_LINE` bytes, or when
/// dropped).
pub struct Prefixed<W: Write> {
    prefix: Vec<u8>,
    line: Vec<u8>,
    out: W,
}

impl<W: Write> Prefixed<W> {
    pub fn new(prefix: String, out: W) -> Self {
        Prefixed {
            prefix: prefix.into_bytes(),
            line: Vec::new(),
            out,
        }
    }

    fn emit(&mut self) -> std::io::Result<()> {
        if self.line.is_empty() {
            return Ok(());
        }
        let mut whole = Vec::with_capacity(self.prefix.len() + self.line.len());
        whole.extend_from_slice(&self.prefix);
        whole.append(&mut self.line);
        self.out.write_all(&whole)?;
        self.out.flush()
    }
}

impl<W: Write> Write for Prefixed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            self.line.push(b);
            if b == b'\n' || self.line.len() >= MAX_LINE {
                self.emit()?;
            }
        }
        Ok(buf.len())
    }

    /// Lines are written when complete: a partial line waits for its newline.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for Prefixed<W> {
    fn drop(&mut self) {
        let _ = self.emit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_gets_the_prefix_once() {
        let mut buf = Vec::new();
        {
            let mut p = Prefixed::new("[a] ".into(), &mut buf);
            for b in b"one\ntw" {
                p.write_all(&[*b]).unwrap();
            }
            p.write_all(b"o\n\nthree").unwrap();
        }
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "[a] one\n[a] two\n[a] \n[a] three"
        );
    }
}
