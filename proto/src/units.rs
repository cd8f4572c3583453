//! Sizes on command lines: `256M`, `8G`, `4096` (bytes), shared by `vgpud` and `--gpu`.

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

#[cfg(test)]
mod tests {
    use super::parse_size;

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
