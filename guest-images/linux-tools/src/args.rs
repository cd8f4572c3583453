//! `key=value` words and `--flag value` options of the tools' command lines.

use crate::ToolError;

/// Parsed arguments: `key=value` words and positional words, in order.
#[derive(Debug, Default)]
pub struct Args {
    pub kv: Vec<(String, String)>,
    pub words: Vec<String>,
}

impl Args {
    /// Splits `argv` (without the program name) into `key=value` pairs and other words;
    /// `--key value` is taken as `key=value`.
    pub fn parse(argv: &[String]) -> Result<Self, ToolError> {
        let mut a = Args::default();
        let mut it = argv.iter();
        while let Some(w) = it.next() {
            if let Some(k) = w.strip_prefix("--") {
                let v = it
                    .next()
                    .ok_or_else(|| ToolError::Bad(format!("--{k} needs a value")))?;
                a.kv.push((k.to_string(), v.clone()));
            } else if let Some((k, v)) = w.split_once('=') {
                a.kv.push((k.to_string(), v.to_string()));
            } else {
                a.words.push(w.clone());
            }
        }
        Ok(a)
    }

    /// The last value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.kv
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.kv
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Rejects keys not in `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), ToolError> {
        match self.kv.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            Some((k, _)) => Err(ToolError::Bad(format!(
                "unknown option {k} (known: {})",
                known.join(", ")
            ))),
            None => Ok(()),
        }
    }

    /// `key` parsed as a number (decimal or 0x hex), or `default`.
    pub fn num(&self, key: &str, default: u64) -> Result<u64, ToolError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => {
                parse_num(v).ok_or_else(|| ToolError::Bad(format!("{key}={v}: not a number")))
            }
        }
    }
}

/// A decimal or `0x` hexadecimal number with an optional K/M/G suffix (binary units).
pub fn parse_num(s: &str) -> Option<u64> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let v = match digits.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok()?,
        None => digits.parse().ok()?,
    };
    v.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_options() {
        assert_eq!(parse_num("64M"), Some(64 << 20));
        assert_eq!(parse_num("0x8000000"), Some(0x800_0000));
        assert_eq!(parse_num("12"), Some(12));
        assert_eq!(parse_num("x"), None);
        assert_eq!(parse_num("99999999999G"), None);
        let argv: Vec<String> = ["suite", "size=small", "--entry", "k", "mode=full"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let a = Args::parse(&argv).unwrap();
        assert_eq!(a.words, ["suite"]);
        assert_eq!(a.get("entry"), Some("k"));
        assert_eq!(a.get("mode"), Some("full"));
        assert!(a.only(&["size", "entry", "mode"]).is_ok());
        assert!(a.only(&["size"]).is_err());
        assert!(Args::parse(&["--grid".to_string()]).is_err());
    }
}
