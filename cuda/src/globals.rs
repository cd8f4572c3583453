//! Module variables (`.global`, `.const` at module scope: `__device__` and `__constant__`
//! variables) placed in device memory that the program can reach (`cuModuleGetGlobal` +
//! `cuMemcpyHtoD`, `cudaMemcpyToSymbol`).
//!
//! A pgpu engine keeps such variables in module storage the host cannot address, so a backend
//! that needs them in its address space rewrites the PTX before loading it: the variables'
//! declarations go, each use of a variable's name as a value becomes its device address (a
//! 64-bit integer: `mov.u64 %rd1, c;` → `mov.u64 %rd1, 68719476736;`), a use as a memory
//! operand goes through a register loaded just before the instruction (`ld.const.f32 %f1,
//! [c+4];` → `mov.u64 %__gv0, 68719476740; ld.global.f32 %f1, [%__gv0];`: ptxas accepts
//! immediate addresses only for `.local`), each function body declares those registers, and
//! `.const` state spaces in instructions become `.global` (constant memory is read-only global
//! memory). This is a token-level rewrite over the text (the `ptx` crate's printer does not
//! cover every construct nvcc emits yet); its output is checked by parsing it again. The layout (offsets, alignment, initial bytes) is the `ptx` crate's, so one
//! allocation holds all of a module's variables and one copy initialises them.

/// The variables of a module and their initial image.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// (name, offset in the block, size), `.const` ones first.
    pub vars: Vec<(String, u64, u64)>,
    /// The block's initial contents (its length is the block's size).
    pub image: Vec<u8>,
}

/// The module's variables, `None` if it has none (or the text is outside the `ptx` crate's
/// subset: then the text is loaded as it is and its variables are not reachable).
pub fn layout(ptx: &str) -> Option<Layout> {
    let module = ptx::parse(ptx).ok()?;
    let vars: Vec<(String, u64, u64)> = module
        .variable_layout()
        .map(|(n, o, s)| (n.to_string(), o, s))
        .collect();
    if vars.is_empty() {
        return None;
    }
    Some(Layout {
        vars,
        image: module.variables_image().to_vec(),
    })
}

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '$' || c == '%'
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$'
}

/// A `+N` / `-N` (decimal or `0x` hex, spaces allowed) at the start of `rest`: the value and
/// the characters it took (0, 0 when there is none).
fn offset_after(rest: &[char]) -> (i64, usize) {
    let mut k = 0;
    let skip = |k: &mut usize| {
        while rest.get(*k).is_some_and(|c| *c == ' ' || *c == '\t') {
            *k += 1;
        }
    };
    skip(&mut k);
    let neg = match rest.get(k) {
        Some('+') => false,
        Some('-') => true,
        _ => return (0, 0),
    };
    k += 1;
    skip(&mut k);
    let start = k;
    while rest.get(k).is_some_and(|c| c.is_ascii_alphanumeric()) {
        k += 1;
    }
    let digits: String = rest[start..k].iter().collect();
    let value = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => digits.parse::<i64>().ok(),
    };
    match value {
        Some(v) => (if neg { v.wrapping_neg() } else { v }, k),
        None => (0, 0),
    }
}

/// `cvta[.to].global.uNN %r, <address>;` (a variable's name before the rewrite, an integer
/// now): a `mov` (a global address is its generic address).
fn cvta_of_immediate(line: &str) -> Option<String> {
    let t = line.trim();
    let body = t.strip_suffix(';')?;
    let (op, args) = body.split_once(char::is_whitespace)?;
    let size = op
        .strip_prefix("cvta.global.u")
        .or_else(|| op.strip_prefix("cvta.to.global.u"))?;
    let (dst, src) = args.split_once(',')?;
    src.trim().parse::<i64>().ok()?;
    let indent = &line[..line.len() - line.trim_start().len()];
    Some(format!(
        "{indent}mov.b{size} {}, {};",
        dst.trim(),
        src.trim()
    ))
}

/// The text with `layout`'s variables at `base` (see the module documentation).
pub fn rewrite(ptx: &str, layout: &Layout, base: u64) -> String {
    let text = rewrite_names(ptx, layout, base);
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        match cvta_of_immediate(body) {
            Some(m) => out.push_str(&m),
            None => out.push_str(body),
        }
        out.push_str(nl);
    }
    out
}

/// Address registers declared in each function body (an instruction has at most two memory
/// operands).
const GV_REGS: usize = 2;

fn rewrite_names(ptx: &str, layout: &Layout, base: u64) -> String {
    let addr = |name: &str| {
        layout
            .vars
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, off, _)| base + off)
    };
    let chars: Vec<char> = ptx.chars().collect();
    let mut out = String::with_capacity(ptx.len() + 64);
    let mut depth = 0usize;
    // Start (in `out`) of the current module-scope statement and whether it declares one of
    // the variables (then it is cut at its `;`).
    let mut stmt_start = 0usize;
    let mut stmt_is_var_decl = false;
    let mut stmt_tokens = 0usize;
    // A directive that ends at its line, not at a `;` (`.version`, `.target`...).
    let mut line_directive = false;
    // Inside a function: where (in `out`) the current instruction starts, how many tokens it
    // has so far, whether the scan is inside its `[...]`, and how many address registers it
    // has taken.
    let mut inst_start = 0usize;
    let mut inst_tokens = 0usize;
    let mut in_bracket = false;
    let mut inst_regs = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(chars[i]);
                i += 1;
            }
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'*') {
            out.push_str("/*");
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                out.push(chars[i]);
                i += 1;
            }
            if i < chars.len() {
                out.push_str("*/");
                i += 2;
            }
            continue;
        }
        if c == '"' {
            out.push(c);
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                out.push(chars[i]);
                i += 1;
            }
            if i < chars.len() {
                out.push('"');
                i += 1;
            }
            continue;
        }
        if c == '.' || ident_start(c) || c.is_ascii_digit() {
            let s = i;
            i += 1;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            let tok: String = chars[s..i].iter().collect();
            if depth == 0 {
                if stmt_tokens == 0 {
                    stmt_start = out.len();
                }
                stmt_tokens += 1;
                if matches!(
                    tok.as_str(),
                    ".version" | ".target" | ".address_size" | ".file" | ".loc"
                ) {
                    line_directive = true;
                }
                if !stmt_is_var_decl && (tok == ".global" || tok == ".const") {
                    stmt_is_var_decl = true;
                }
                out.push_str(&tok);
            } else if tok == ".const" {
                inst_tokens += 1;
                out.push_str(".global");
            } else if let Some(a) = (ident_start(c) && c != '%').then(|| addr(&tok)).flatten() {
                inst_tokens += 1;
                // `name+8` / `name-8` becomes one address: `[imm+imm]` is not PTX.
                let (off, used) = offset_after(&chars[i..]);
                i += used;
                let value = (a as i64).wrapping_add(off);
                if in_bracket {
                    let reg = format!("%__gv{}", inst_regs.min(GV_REGS - 1));
                    inst_regs += 1;
                    let rest = &out[inst_start..];
                    let at = inst_start + rest.len() - rest.trim_start().len();
                    out.insert_str(at, &format!("mov.u64 {reg}, {value}; "));
                    out.push_str(&reg);
                } else {
                    out.push_str(&value.to_string());
                }
            } else {
                inst_tokens += 1;
                out.push_str(&tok);
            }
            continue;
        }
        // A declaration's initializer braces are at module scope too: they stay in the
        // statement (they never hold code).
        if depth == 0 && stmt_is_var_decl && (c == '{' || c == '}') {
            out.push(c);
            i += 1;
            continue;
        }
        if c == '\n' && depth == 0 && line_directive {
            line_directive = false;
            stmt_tokens = 0;
        }
        // Instruction boundaries inside functions: `;`, a label's `:`, and block braces (a
        // brace after an instruction's first token is a vector operand's).
        if depth >= 1 {
            match c {
                '[' => in_bracket = true,
                ']' => in_bracket = false,
                ';' | ':' => {
                    out.push(c);
                    i += 1;
                    inst_start = out.len();
                    inst_tokens = 0;
                    inst_regs = 0;
                    in_bracket = false;
                    continue;
                }
                '{' | '}' if inst_tokens == 0 => {
                    if c == '}' {
                        depth -= 1;
                    } else {
                        depth += 1;
                    }
                    out.push(c);
                    i += 1;
                    inst_start = out.len();
                    continue;
                }
                _ => {}
            }
        }
        match c {
            '{' => {
                depth += 1;
                stmt_tokens = 0;
                stmt_is_var_decl = false;
                if depth == 1 {
                    // A function body: its address registers, then its first instruction.
                    out.push(c);
                    out.push_str(&format!(" .reg .b64 %__gv<{GV_REGS}>;"));
                    i += 1;
                    inst_start = out.len();
                    inst_tokens = 0;
                    inst_regs = 0;
                    in_bracket = false;
                    continue;
                }
            }
            '}' => depth = depth.saturating_sub(1),
            ';' if depth == 0 => {
                if stmt_is_var_decl && stmt_tokens > 0 {
                    out.truncate(stmt_start);
                    out.push_str("// (module variable placed in device memory)");
                    stmt_tokens = 0;
                    stmt_is_var_decl = false;
                    i += 1;
                    continue;
                }
                stmt_tokens = 0;
                stmt_is_var_decl = false;
            }
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.const .align 4 .b8 coef[8] = {1, 0, 0, 0, 2, 0, 0, 0};
.visible .global .align 4 .u32 counter = 7;
.visible .entry k(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [out];
    ld.const.u32 %r1, [coef+4];
    mov.u64 %rd2, counter; // the address
    cvta.global.u64 %rd2, counter;
    ld.global.u32 %r2, [%rd2];
    add.s32 %r3, %r1, %r2;
    st.global.u32 [%rd1], %r3;
    ret;
}
"#;

    #[test]
    fn variables_become_addresses_and_the_text_still_parses() {
        let l = layout(TEXT).unwrap();
        assert_eq!(l.vars[0], ("coef".to_string(), 0, 8));
        assert_eq!(l.vars[1].0, "counter");
        assert_eq!(&l.image[..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(&l.image[l.vars[1].1 as usize..][..4], &7u32.to_le_bytes());
        let base = 0x10_0000_0000u64;
        let t = rewrite(TEXT, &l, base);
        assert!(
            t.contains(&format!(
                "mov.u64 %__gv0, {}; ld.global.u32 %r1, [%__gv0]",
                base + 4
            )),
            "{t}"
        );
        assert!(t.contains(".reg .b64 %__gv<2>;"), "{t}");
        assert!(
            t.contains(&format!("mov.b64 %rd2, {};", base + l.vars[1].1)),
            "{t}"
        );
        assert!(
            t.contains(&format!("mov.u64 %rd2, {};", base + l.vars[1].1)),
            "{t}"
        );
        assert!(!t.contains(".const .align"), "{t}");
        let m = ptx::parse(&t).unwrap();
        assert_eq!(m.variable_layout().count(), 0);
        assert_eq!(m.entry("k").unwrap().param_size, 8);
        assert!(layout(".version 8.0\n.target sm_80\n.address_size 64\n").is_none());
    }

    /// NVIDIA's PTX assembler accepts the rewritten text (it refuses immediate addresses
    /// outside `.local`): checked with the pinned toolchain's ptxas when apps/build.sh has
    /// installed it (CI does), skipped with a note otherwise.
    #[test]
    fn rewritten_text_passes_nvidia_ptxas() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let Some(ptxas) = std::fs::read_dir(format!("{root}/target/cuda-toolchain/venv/lib"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.path().join("site-packages/nvidia/cu13/bin/ptxas"))
            .filter(|p| p.exists())
        else {
            eprintln!("no ptxas under target/cuda-toolchain (apps/build.sh): check skipped");
            return;
        };
        let kernels = std::fs::read_to_string(format!("{root}/cuda/tests/kernels.ptx")).unwrap();
        for (name, text) in [("TEXT", TEXT), ("kernels.ptx", kernels.as_str())] {
            let l = layout(text).unwrap();
            let t = rewrite(text, &l, 0x10_0000_0000);
            let dir = std::env::temp_dir().join(format!("gv-{}-{name}", std::process::id()));
            std::fs::write(&dir, &t).unwrap();
            let out = std::process::Command::new(&ptxas)
                .args(["-arch=sm_90", "-o", "/dev/null"])
                .arg(&dir)
                .output()
                .unwrap();
            let _ = std::fs::remove_file(&dir);
            assert!(
                out.status.success(),
                "{name}: {}\n{t}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
