//! Numbers on command lines, shared by `vgpud`, `--gpu` and `vgpu-bench`: sizes (`256M`, `8G`,
//! `4096` bytes) and clap value parsers for numbers in a range.

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
    fn sizes() {
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("8g"), Some(8 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        for bad in ["", "M", "1.5G", "-1K", "99999999999999999999G", "1T"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
