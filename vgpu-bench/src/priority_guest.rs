//! The `infer` guest's serial output, as `vgpu-bench priority` reads it: `INFER req=<n>
//! lat_us=<l>` per request (the first `lines=`), `INFER end t_ms=<t> requests=<n> ok=<0|1>
//! p50_us=<p> p99_us=<p> max_us=<m>`, `INFER fault <what>` and `infer: MISMATCH ...`
//! (guest-images/guests/programs/src/bin/infer.rs).

use std::collections::HashMap;

/// The end line's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    pub t_ms: u64,
    pub requests: u64,
    pub ok: bool,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// What one `infer` guest printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InferRun {
    /// `INFER start` was seen.
    pub started: bool,
    /// Latencies of the requests printed, in order (µs).
    pub lat_us: Vec<u64>,
    pub end: Option<End>,
    pub fault: Option<String>,
    pub mismatches: u64,
}

fn fields(l: &str) -> HashMap<&str, u64> {
    l.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect()
}

/// Parses a guest's console output (lines it does not know are ignored).
pub fn parse(text: &str) -> InferRun {
    let mut r = InferRun::default();
    for l in text.lines() {
        if l.starts_with("infer: MISMATCH") {
            r.mismatches += 1;
        } else if let Some(f) = l.strip_prefix("INFER fault ") {
            r.fault = Some(f.to_string());
        } else if l.starts_with("INFER start ") {
            r.started = true;
        } else if let Some(rest) = l.strip_prefix("INFER end ") {
            let m = fields(rest);
            let g = |k: &str| m.get(k).copied();
            if let (Some(t_ms), Some(requests), Some(ok)) = (g("t_ms"), g("requests"), g("ok")) {
                r.end = Some(End {
                    t_ms,
                    requests,
                    ok: ok == 1,
                    p50_us: g("p50_us").unwrap_or(0),
                    p99_us: g("p99_us").unwrap_or(0),
                    max_us: g("max_us").unwrap_or(0),
                });
            }
        } else if let Some(rest) = l.strip_prefix("INFER ") {
            let m = fields(rest);
            if let (Some(_), Some(lat)) = (m.get("req"), m.get("lat_us")) {
                r.lat_us.push(*lat);
            }
        }
    }
    r
}

impl InferRun {
    /// Ran to its end with every result checked.
    pub fn ok(&self) -> bool {
        self.end.is_some_and(|e| e.ok) && self.fault.is_none() && self.mismatches == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_parsed_and_noise_ignored() {
        let g = parse(
            "boot\nINFER start iters=5 threads=32 blocks=1 kernels=2 think_us=10\n\
             INFER req=1 lat_us=700\nINFER req=2 lat_us=650\nINFER req=x lat_us=1\n\
             INFER end t_ms=1000 requests=9 ok=1 p50_us=640 p99_us=900 max_us=910\n",
        );
        assert!(g.started && g.ok());
        assert_eq!(g.lat_us, [700, 650]);
        assert_eq!(
            g.end,
            Some(End {
                t_ms: 1000,
                requests: 9,
                ok: true,
                p50_us: 640,
                p99_us: 900,
                max_us: 910
            })
        );
        let bad = parse("infer: MISMATCH request=3\nINFER end t_ms=9 requests=3 ok=0\n");
        assert_eq!(bad.mismatches, 1);
        assert!(!bad.ok());
        let f = parse("INFER start\nINFER fault timeout: x\n");
        assert_eq!(f.fault.as_deref(), Some("timeout: x"));
        assert!(!f.ok() && f.end.is_none());
    }
}
