//! PTX rewriting for sliced launches (preemption on hardware that cannot be preempted from
//! outside the driver, as Tally does).
//!
//! Every `.entry` gets four trailing parameters `.param .u32 __pgpu_boff, __pgpu_gx, __pgpu_gy,
//! __pgpu_gz` (block offset and the original grid) and a prologue that computes the original
//! block index from the linear index `L = %ctaid.x + __pgpu_boff` of a 1-D sub-launch:
//! `ctaid.x = L % gx`, `ctaid.y = (L / gx) % gy`, `ctaid.z = L / (gx * gy)`. Every read of
//! `%ctaid.{x,y,z}` in the entry body then reads those registers and `%nctaid.{x,y,z}` the
//! original grid, so a grid of any shape (1-D, 2-D, 3-D) runs as a sequence of 1-D sub-launches
//! of K blocks each. The total block count must fit in 32 bits.
//!
//! A module that cannot be rewritten safely (a `.func` reading `%ctaid`/`%nctaid`, which cannot
//! see the entry's registers, or a vector read of `%ctaid`) is loaded unmodified and its launches
//! run unsliced (not preemptible inside a launch); [`Rewritten::sliced`] says which.

/// The names of the appended parameters, in order.
pub const SLICE_PARAMS: [&str; 4] = ["__pgpu_boff", "__pgpu_gx", "__pgpu_gy", "__pgpu_gz"];

/// Result of [`rewrite`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The text to load.
    pub text: String,
    /// Whether every entry takes the slice parameters (else `text` is the input unchanged).
    pub sliced: bool,
    /// Why the module is not sliced (empty when it is).
    pub reason: String,
}

/// Replaces comments by spaces (same byte offsets) so that searches skip them.
fn mask_comments(src: &str) -> Vec<u8> {
    let mut b = src.as_bytes().to_vec();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'/' && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                b[i] = b' ';
                i += 1;
            }
        } else if b[i] == b'/' && b[i + 1] == b'*' {
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                if b[i] != b'\n' {
                    b[i] = b' ';
                }
                i += 1;
            }
            for _ in 0..2 {
                if i < b.len() {
                    b[i] = b' ';
                    i += 1;
                }
            }
        } else {
            i += 1;
        }
    }
    b
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c == b'%'
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Index of the bracket closing the one opened at `open`.
fn matching(b: &[u8], open: usize, o: u8, c: u8) -> Option<usize> {
    let mut depth = 0usize;
    for (i, &ch) in b.iter().enumerate().skip(open) {
        if ch == o {
            depth += 1;
        } else if ch == c {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// The special-register reads in `b[from..to]`: (position, length, replacement register).
fn special_reads(
    b: &[u8],
    from: usize,
    to: usize,
) -> Result<Vec<(usize, usize, &'static str)>, ()> {
    let mut out = Vec::new();
    let mut i = from;
    while i < to {
        if b[i] == b'%' && (i == 0 || !is_ident(b[i - 1])) {
            let rest = &b[i + 1..to];
            let (n, regs) = if rest.starts_with(b"ctaid") {
                (5, ["%__pgpu5", "%__pgpu6", "%__pgpu7"])
            } else if rest.starts_with(b"nctaid") {
                (6, ["%__pgpu1", "%__pgpu2", "%__pgpu3"])
            } else {
                i += 1;
                continue;
            };
            let after = i + 1 + n;
            let comp = (b.get(after) == Some(&b'.'))
                .then(|| b.get(after + 1).copied())
                .flatten();
            let end = after + 2;
            let reg = match comp {
                Some(b'x') => regs[0],
                Some(b'y') => regs[1],
                Some(b'z') => regs[2],
                _ => return Err(()),
            };
            if b.get(end).is_some_and(|&c| is_ident(c)) {
                return Err(());
            }
            out.push((i, end - i, reg));
            i = end;
        } else {
            i += 1;
        }
    }
    Ok(out)
}

const PROLOGUE: &str = "
\t.reg .b32 %__pgpu<8>;
\tld.param.u32 %__pgpu0, [__pgpu_boff];
\tld.param.u32 %__pgpu1, [__pgpu_gx];
\tld.param.u32 %__pgpu2, [__pgpu_gy];
\tld.param.u32 %__pgpu3, [__pgpu_gz];
\tmov.u32 %__pgpu4, %ctaid.x;
\tadd.u32 %__pgpu4, %__pgpu4, %__pgpu0;
\trem.u32 %__pgpu5, %__pgpu4, %__pgpu1;
\tdiv.u32 %__pgpu4, %__pgpu4, %__pgpu1;
\trem.u32 %__pgpu6, %__pgpu4, %__pgpu2;
\tdiv.u32 %__pgpu7, %__pgpu4, %__pgpu2;
";

fn unsliced(src: &str, reason: &str) -> Rewritten {
    Rewritten {
        text: src.to_string(),
        sliced: false,
        reason: reason.to_string(),
    }
}

/// The names of the entries of `src` (`.entry NAME`, outside comments), in order.
pub fn entry_names(src: &str) -> Vec<String> {
    let b = mask_comments(src);
    let mut names = Vec::new();
    let mut from = 0;
    while let Some((start, end)) = next_entry(&b, from) {
        from = end;
        if end > start {
            names.push(String::from_utf8_lossy(&b[start..end]).into_owned());
        }
    }
    names
}

/// The next `.entry` keyword (a whole word) in the comment-masked `b` at or after `from`: the
/// span of the name after it (empty where no identifier follows).
fn next_entry(b: &[u8], mut from: usize) -> Option<(usize, usize)> {
    while let Some(at) = find(b, from, b".entry") {
        from = at + 6;
        let boundary_before = at == 0 || b[at - 1].is_ascii_whitespace();
        let boundary_after = b.get(at + 6).is_some_and(|c| c.is_ascii_whitespace());
        if !boundary_before || !boundary_after {
            continue;
        }
        let mut i = at + 6;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        return Some((start, i));
    }
    None
}

/// Rewrites every entry of `src` for sliced launches (see the module docs).
pub fn rewrite(src: &str) -> Rewritten {
    let b = mask_comments(src);
    // (position, bytes removed, text inserted), applied back to front.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut bodies = Vec::new();
    let mut from = 0;
    let mut entries = 0;
    while let Some((name_start, name_end)) = next_entry(&b, from) {
        if name_end == name_start {
            return unsliced(src, "entry without a name");
        }
        let mut i = name_end;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let decl = SLICE_PARAMS
            .map(|p| format!(".param .u32 {p}"))
            .join(",\n\t");
        if b.get(i) == Some(&b'(') {
            let Some(close) = matching(&b, i, b'(', b')') else {
                return unsliced(src, "unbalanced parameter list");
            };
            // After the last parameter (before the whitespace that precedes `)`).
            let last = b[i + 1..close]
                .iter()
                .rposition(|c| !c.is_ascii_whitespace())
                .map(|p| i + 1 + p + 1);
            match last {
                Some(at) => edits.push((at, 0, format!(",\n\t{decl}"))),
                None => edits.push((close, 0, format!("\n\t{decl}\n"))),
            }
            i = close + 1;
        } else {
            edits.push((name_end, 0, format!("(\n\t{decl}\n)")));
        }
        let Some(open) = find(&b, i, b"{") else {
            return unsliced(src, "entry without a body");
        };
        if b[i..open].contains(&b';') {
            return unsliced(src, "entry declaration without a body");
        }
        let Some(close) = matching(&b, open, b'{', b'}') else {
            return unsliced(src, "unbalanced entry body");
        };
        let Ok(reads) = special_reads(&b, open + 1, close) else {
            return unsliced(src, "unsupported read of %ctaid/%nctaid in an entry");
        };
        edits.push((open + 1, 0, PROLOGUE.to_string()));
        for (pos, len, reg) in reads {
            edits.push((pos, len, reg.to_string()));
        }
        bodies.push((open, close));
        entries += 1;
        from = close;
    }
    if entries == 0 {
        return unsliced(src, "no entry");
    }
    // Reads outside entry bodies (device functions) cannot see the entry's registers.
    let mut prev = 0;
    for &(open, close) in bodies.iter().chain([(b.len(), b.len())].iter()) {
        if !matches!(special_reads(&b, prev, open), Ok(v) if v.is_empty()) {
            return unsliced(src, "a device function reads %ctaid/%nctaid");
        }
        prev = close;
    }
    edits.sort_by_key(|e| std::cmp::Reverse(e.0));
    let mut text = src.to_string();
    for (pos, len, ins) in edits {
        text.replace_range(pos..pos + len, &ins);
    }
    Rewritten {
        text,
        sliced: true,
        reason: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_skip_comments_and_lookalikes() {
        let src = "// .entry commented(\n/* .entry blocked */\n.visible .entry first(\n)\n{ ret; }\n\
                   .entry second\n{ ret; }\n.func notentry() { ret; }\n.entryish x\n";
        assert_eq!(entry_names(src), ["first", "second"]);
        assert!(entry_names(".entry (").is_empty());
    }

    const K: &str = ".version 7.8\n.target sm_80\n.address_size 64\n\
        // %ctaid.x in a comment\n\
        .visible .entry k(\n\t.param .u64 p\n)\n{\n\t.reg .b32 %r<4>;\n\
        \tmov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %nctaid.y;\n\tmov.u32 %r3, %ctaid.z;\n\tret;\n}\n\
        .visible .entry e\n{\n\tret;\n}\n";

    #[test]
    fn entries_get_parameters_and_reads_are_replaced() {
        let r = rewrite(K);
        assert!(r.sliced, "{}", r.reason);
        let t = &r.text;
        assert!(t.contains(".param .u64 p,\n\t.param .u32 __pgpu_boff"));
        assert!(t.contains(".entry e(\n\t.param .u32 __pgpu_boff"));
        assert!(t.contains("mov.u32 %r1, %__pgpu5;"));
        assert!(t.contains("mov.u32 %r2, %__pgpu2;"));
        assert!(t.contains("mov.u32 %r3, %__pgpu7;"));
        assert!(t.contains("// %ctaid.x in a comment"));
        assert_eq!(t.matches(".reg .b32 %__pgpu<8>;").count(), 2);
    }

    #[test]
    fn device_function_reads_leave_the_module_unsliced() {
        let f = ".func f()\n{\n\t.reg .b32 %r;\n\tmov.u32 %r, %ctaid.x;\n\tret;\n}\n";
        let r = rewrite(&format!("{f}{K}"));
        assert!(!r.sliced);
        assert_eq!(r.text, format!("{f}{K}"));
        let v = ".visible .entry v()\n{\n\tmov.v4.u32 {%r1,%r2,%r3,%r4}, %ctaid;\n}\n";
        assert!(!rewrite(v).sliced);
        assert!(!rewrite("garbage").sliced);
        assert!(!rewrite(".entry (").sliced);
    }
}
