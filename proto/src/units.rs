//! The option grammar of the command lines, shared by `--gpu`, `vgpud --sched` and `vgpu-bench`:
//! `key=value,...` strings ([`pairs`]), sizes (`256M`, `8G`, `4096` bytes), durations (`500us`,
//! `2ms`), and clap value parsers for numbers in a range. It lives in the protocol crate because
//! both sides of the VM–daemon contract (the device model and the scheduler) parse with it and
//! this crate is the one they share without pulling in each other's policy code.

use std::time::Duration;

/// An item of an option string that is not `key=value`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected key=value, got {0:?}")]
pub struct SyntaxError(pub String);

/// The items of an option string: `key=value` pairs separated by commas, whitespace around
/// items, keys and values ignored, empty items skipped (an empty string has none). The value
/// may be empty (`host=`); an item without `=` is a [`SyntaxError`].
pub fn pairs(s: &str) -> impl Iterator<Item = Result<(&str, &str), SyntaxError>> {
    s.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| SyntaxError(item.into()))
        })
}

/// Parses `N` with a unit: `ns`, `us` (or `µs`), `ms`, `s`. Returns `None` on anything else.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let nanos_per = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(nanos_per).map(Duration::from_nanos)
}

/// Parses a byte count with an optional K/M/G suffix (binary units); `None` if malformed or
/// out of range.
pub fn parse_size(v: &str) -> Option<u64> {
    let (num, mult) = match v.as_bytes().last()? {
        b'K' | b'k' => (&v[..v.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&v[..v.len() - 1], 1 << 20),
        b'G' | b'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// A clap value parser for a decimal number in `lo..=hi` (the error names the range; clap
/// names the option).
pub fn f64_in(lo: f64, hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |s: &str| match s.trim().parse::<f64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("a number from {lo} to {hi}")),
    }
}

/// A clap value parser for a size (K/M/G suffix) that is a multiple of `align` in `lo..=hi`.
pub fn size_in(
    lo: u64,
    hi: u64,
    align: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync {
    move |s: &str| match parse_size(s.trim()) {
        Some(v) if (lo..=hi).contains(&v) && v.is_multiple_of(align) => Ok(v),
        _ => Err(format!(
            "a size from {} to {} (K/M/G suffix), a multiple of {}",
            human(lo),
            human(hi),
            human(align)
        )),
    }
}

/// `bytes` with the largest K/M/G suffix that divides it.
pub fn human(bytes: u64) -> String {
    for (suffix, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let p = f64_in(0.5, 10.0);
        assert_eq!(p("0.5"), Ok(0.5));
        for bad in ["0", "10.5", "nan", "inf", "x", "-1"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        let s = size_in(2 << 20, 1 << 30, 2 << 20);
        assert_eq!(s("64M"), Ok(64 << 20));
        assert!(s("3M").is_err() && s("2G").is_err() && s("0").is_err());
        assert_eq!(
            s("1").unwrap_err(),
            "a size from 2M to 1G (K/M/G suffix), a multiple of 2M"
        );
    }

    #[test]
    fn pairs_and_durations() {
        let got: Vec<_> = pairs(" a=1,, b = x y ,c=").collect();
        assert_eq!(got, [Ok(("a", "1")), Ok(("b", "x y")), Ok(("c", ""))]);
        assert_eq!(pairs("").count(), 0);
        assert_eq!(
            pairs("a=1,oops").nth(1),
            Some(Err(SyntaxError("oops".into())))
        );
        assert_eq!(parse_duration("500us"), Some(Duration::from_micros(500)));
        assert_eq!(parse_duration("2ms"), Some(Duration::from_millis(2)));
        assert_eq!(parse_duration("7"), None);
        assert_eq!(parse_duration("99999999999999999999s"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("8g"), Some(8 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        for bad in ["", "M", "1.5G", "-1K", "99999999999999999999G", "1T"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
