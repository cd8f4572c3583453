//! The `fairness` guest's serial output, as `vgpu-bench fairness` reads it: the `FAIRNESS start`,
//! `FAIRNESS t_ms=<t> done=<n>`, `FAIRNESS end t_ms=<t> done=<n> ok=<0|1>` and
//! `FAIRNESS fault <what>` lines, and with a VRAM working set (`pool_mib=`) the
//! `FAIRNESS pool mib=<N> fill_ms=<ms>` and `FAIRNESS pool rewritten_mib=<M> check=<ok|bad>` lines
//! (guest-images/guests/programs/src/bin/fairness.rs).

/// The end of a run, as the guest reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// Guest milliseconds from the first submission to the end.
    pub t_ms: u64,
    /// Kernels completed (and checked).
    pub done: u64,
    pub ok: bool,
}

/// What one guest printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestRun {
    /// `FAIRNESS start` was seen (the kernels started).
    pub started: bool,
    /// `iters=` of the start line.
    pub iters: Option<u64>,
    /// `(t_ms, done)` of the periodic lines.
    pub progress: Vec<(u64, u64)>,
    pub end: Option<End>,
    /// The text after `FAIRNESS fault`, or a `MISMATCH` line.
    pub fault: Option<String>,
    /// The VRAM working set: its MiB, once filled.
    pub pool_mib: Option<u64>,
    /// MiB of the working set rewritten during the run, and whether the final byte-for-byte
    /// check of the whole set passed.
    pub pool_rewritten_mib: Option<u64>,
    pub pool_ok: Option<bool>,
}

impl GuestRun {
    /// Kernels completed so far: the end line's count, else the last periodic one.
    pub fn done(&self) -> u64 {
        self.end
            .map(|e| e.done)
            .or_else(|| self.progress.last().map(|p| p.1))
            .unwrap_or(0)
    }

    /// Whether the run ended with every result checked (and its VRAM working set, if any).
    pub fn ok(&self) -> bool {
        self.end.is_some_and(|e| e.ok) && self.fault.is_none() && self.pool_ok != Some(false)
    }
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Parses a guest's output (lines it does not know are skipped: the VMM's own output, partial
/// lines of a run that was cut short).
pub fn parse(text: &str) -> GuestRun {
    let mut g = GuestRun::default();
    for line in text.lines().map(str::trim) {
        if line.starts_with("fairness: MISMATCH") {
            g.fault.get_or_insert_with(|| line.to_string());
            continue;
        }
        let Some(rest) = line.strip_prefix("FAIRNESS ") else {
            continue;
        };
        if let Some(p) = rest.strip_prefix("pool ") {
            if let Some(m) = field(p, "mib") {
                g.pool_mib = Some(m);
            }
            if let Some(m) = field(p, "rewritten_mib") {
                g.pool_rewritten_mib = Some(m);
                g.pool_ok = Some(p.split_whitespace().any(|kv| kv == "check=ok"));
            }
        } else if rest.starts_with("start") {
            g.started = true;
            g.iters = field(rest, "iters");
        } else if let Some(f) = rest.strip_prefix("fault") {
            g.fault.get_or_insert_with(|| f.trim().to_string());
        } else if rest.starts_with("end") {
            if let (Some(t_ms), Some(done), Some(ok)) =
                (field(rest, "t_ms"), field(rest, "done"), field(rest, "ok"))
            {
                g.end = Some(End {
                    t_ms,
                    done,
                    ok: ok == 1,
                });
            }
        } else if let (Some(t), Some(d)) = (field(rest, "t_ms"), field(rest, "done")) {
            g.progress.push((t, d));
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_whole_run() {
        let text = "vgpu-vmm: booting\nFAIRNESS start iters=1234 threads=32 blocks=1 depth=2\n\
            FAIRNESS t_ms=100 done=17\nFAIRNESS t_ms=200 done=35\n\
            FAIRNESS end t_ms=1000 done=180 ok=1\n";
        let g = parse(text);
        assert!(g.started);
        assert_eq!(g.iters, Some(1234));
        assert_eq!(g.progress, vec![(100, 17), (200, 35)]);
        assert_eq!(
            g.end,
            Some(End {
                t_ms: 1000,
                done: 180,
                ok: true
            })
        );
        assert_eq!(g.done(), 180);
        assert!(g.ok());
    }

    #[test]
    fn a_cut_or_failed_run_is_not_ok() {
        let g = parse("FAIRNESS start iters=5\nFAIRNESS t_ms=100 done=3\nFAIRNESS t_ms=2");
        assert_eq!((g.done(), g.ok(), g.end), (3, false, None));
        let g = parse("FAIRNESS start iters=5\nFAIRNESS fault timeout: kernel 4\n");
        assert_eq!(g.fault.as_deref(), Some("timeout: kernel 4"));
        assert!(!g.ok());
        let g = parse(
            "FAIRNESS pool mib=1024 fill_ms=900\nFAIRNESS start iters=5\n\
             FAIRNESS pool rewritten_mib=300 check=bad\n",
        );
        assert_eq!(
            (g.pool_mib, g.pool_rewritten_mib, g.pool_ok, g.started),
            (Some(1024), Some(300), Some(false), true)
        );
        let g = parse("fairness: MISMATCH kernel=3\nFAIRNESS end t_ms=9 done=3 ok=0\n");
        assert!(!g.ok() && g.fault.is_some());
        assert_eq!(parse(""), GuestRun::default());
    }
}
