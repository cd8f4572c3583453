//! Progress of a long experiment on stderr: a bar redrawn in place when stderr is a terminal,
//! a plain line every few seconds otherwise (logs, CI).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// See the module documentation.
pub struct Progress {
    label: String,
    tty: bool,
    every: Duration,
    last: Option<Instant>,
    drawn: bool,
}

const WIDTH: usize = 30;

impl Progress {
    pub fn new(label: &str) -> Self {
        let tty = std::io::stderr().is_terminal();
        Progress {
            label: label.to_string(),
            tty,
            every: if tty {
                Duration::from_millis(200)
            } else {
                Duration::from_secs(2)
            },
            last: None,
            drawn: false,
        }
    }

    /// The text of one update: `label [####      ]  40% msg` (bar) or `label: 40% msg` (plain).
    pub fn render(&self, fraction: f64, msg: &str) -> String {
        let f = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let pct = (f * 100.0).round() as u32;
        if self.tty {
            let full = (f * WIDTH as f64).round() as usize;
            format!(
                "{} [{}{}] {pct:3}% {msg}",
                self.label,
                "#".repeat(full),
                " ".repeat(WIDTH - full)
            )
        } else {
            format!("{}: {pct}% {msg}", self.label)
        }
    }

    /// Shows `fraction` done (0..=1) with a message, at most every 200 ms (terminal) or 2 s.
    pub fn update(&mut self, fraction: f64, msg: &str) {
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        self.last = Some(Instant::now());
        let line = self.render(fraction, msg);
        let mut e = std::io::stderr().lock();
        let _ = if self.tty {
            self.drawn = true;
            write!(e, "\r\x1b[2K{line}")
        } else {
            writeln!(e, "{line}")
        };
        let _ = e.flush();
    }

    /// A line of its own (the bar, if any, is finished first).
    pub fn note(&mut self, msg: &str) {
        self.finish();
        eprintln!("{}: {msg}", self.label);
    }

    /// Ends the bar's line.
    pub fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_bar_and_plain_lines() {
        let mut p = Progress::new("fairness");
        p.tty = true;
        let bar = p.render(0.5, "x");
        assert!(
            bar.starts_with("fairness [###############               ]  50% x"),
            "{bar}"
        );
        assert!(p.render(7.0, "").contains("100%"));
        p.tty = false;
        assert_eq!(p.render(0.25, "3 s"), "fairness: 25% 3 s");
        assert_eq!(p.render(f64::NAN, ""), "fairness: 0% ");
    }
}
