//! PTX identifiers for printing: names made by the parser for nested-scope registers
//! (`%r1{3}`) and by inlining (`%r1@2`, `$__ret@2`) cannot be written in PTX, so each entry's
//! invalid names get fresh valid ones that collide with no other name of the entry.

use std::collections::{HashMap, HashSet};

/// Whether `s` is a PTX identifier: `[a-zA-Z][a-zA-Z0-9_$]*` or `[_$%][a-zA-Z0-9_$]+`.
pub(crate) fn valid(s: &str) -> bool {
    let mut cs = s.chars();
    let Some(c0) = cs.next() else { return false };
    let rest = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    if c0.is_ascii_alphabetic() {
        cs.all(rest)
    } else if matches!(c0, '_' | '$' | '%') {
        let tail: Vec<char> = cs.collect();
        !tail.is_empty() && tail.into_iter().all(rest)
    } else {
        false
    }
}

/// Renaming of one entry's names.
#[derive(Debug, Default)]
pub(crate) struct Names {
    map: HashMap<String, String>,
    used: HashSet<String>,
    next: u64,
}

impl Names {
    /// A renaming for the given names of one entry (every name it declares or labels).
    pub(crate) fn new<'a>(all: impl Iterator<Item = &'a String> + Clone) -> Names {
        let mut n = Names {
            used: all.clone().cloned().collect(),
            ..Names::default()
        };
        for name in all {
            if !valid(name) && !n.map.contains_key(name) {
                let fresh = n.fresh(name);
                n.map.insert(name.clone(), fresh);
            }
        }
        n
    }

    /// A new valid name derived from `base`, unused in the entry (and now reserved).
    pub(crate) fn fresh(&mut self, base: &str) -> String {
        let mut clean: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '%' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // `%` only leads.
        let lead = clean.starts_with('%');
        clean.retain(|c| c != '%');
        if lead {
            clean.insert(0, '%');
        } else if !clean.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '$') {
            clean.insert(0, '_');
        }
        loop {
            let cand = format!("{clean}_${}", self.next);
            self.next += 1;
            if self.used.insert(cand.clone()) {
                return cand;
            }
        }
    }

    /// The printed name of `name`.
    pub(crate) fn get<'a>(&'a self, name: &'a str) -> &'a str {
        self.map.get(name).map_or(name, String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["%r1", "$L__BB0_1", "_Z3foo", "a", "%tid", "$a$b"] {
            assert!(valid(ok), "{ok}");
        }
        for bad in ["%r1{3}", "%r@1", "$__ret@2", "", "%", "1a", "a.b"] {
            assert!(!valid(bad), "{bad}");
        }
    }

    #[test]
    fn renames_only_invalid_names_without_collisions() {
        let names: Vec<String> = ["%r1", "%r1{0}", "%r1_$0", "$__ret@0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let n = Names::new(names.iter());
        assert_eq!(n.get("%r1"), "%r1");
        let a = n.get("%r1{0}").to_string();
        let b = n.get("$__ret@0").to_string();
        assert!(valid(&a) && valid(&b), "{a} {b}");
        assert_ne!(a, "%r1_$0");
        assert_ne!(a, b);
    }
}
