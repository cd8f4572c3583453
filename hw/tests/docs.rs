//! docs/hardware.md must say what this crate defines: every register, method, para-virtual
//! register and fault kind in its tables has the offset/code given here, and nothing here is
//! missing from them.

use std::collections::BTreeMap;

use vgpu_hw::{FaultKind, method, para, regs};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/hardware.md");
    std::fs::read_to_string(path).expect("docs/hardware.md")
}

/// The rows of the first table after the heading line starting with `heading`: cells trimmed.
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(heading));
    assert!(lines.next().is_some(), "no heading {heading:?}");
    lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

fn hex(s: &str) -> u32 {
    u32::from_str_radix(
        s.trim().trim_start_matches("0x").replace('_', "").as_str(),
        16,
    )
    .unwrap_or_else(|_| panic!("not a hex offset: {s:?}"))
}

/// Expands "0x0008 / 0x000c" + "VRAM_SIZE_LO / _HI" into (VRAM_SIZE_LO, 8), (VRAM_SIZE_HI, 0xc).
fn expand(offsets: &str, names: &str) -> Vec<(String, u32)> {
    let offs: Vec<u32> = offsets.split(" / ").map(hex).collect();
    let parts: Vec<&str> = names.split(" / ").map(str::trim).collect();
    assert_eq!(offs.len(), parts.len(), "{offsets:?} vs {names:?}");
    let first = parts[0];
    let stem = &first[..first.rfind('_').unwrap_or(first.len())];
    parts
        .iter()
        .zip(offs)
        .map(|(p, o)| {
            let name = if p.starts_with('_') {
                format!("{stem}{p}")
            } else {
                p.to_string()
            };
            (name, o)
        })
        .collect()
}

fn check(section: &str, rows: Vec<(String, u32)>, defined: &[(&str, u32)], alias: &[(&str, &str)]) {
    let documented: BTreeMap<String, u32> = rows.into_iter().collect();
    let defined: BTreeMap<String, u32> = defined.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let rename = |n: &str| {
        alias
            .iter()
            .find(|(d, _)| *d == n)
            .map_or(n.to_string(), |(_, c)| c.to_string())
    };
    for (name, off) in &documented {
        let c = rename(name);
        assert_eq!(
            defined.get(&c),
            Some(off),
            "{section}: docs say {name} = {off:#x}; vgpu-hw defines {:?}",
            defined.get(&c)
        );
    }
    let documented: Vec<String> = documented.keys().map(|n| rename(n)).collect();
    for name in defined.keys() {
        assert!(
            documented.contains(name),
            "{section}: vgpu-hw defines {name}, docs/hardware.md does not list it"
        );
    }
}

#[test]
fn registers_match_the_docs() {
    let doc = doc();
    let mut rows = Vec::new();
    for r in table(&doc, "### Registers (BAR0)") {
        if let Some((base, _)) = r[0].split_once(" + ") {
            let name = r[1].trim_end_matches("[n]");
            let array = regs::ARRAYS.iter().find(|a| a.0 == name);
            assert_eq!(array.map(|a| a.1), Some(hex(base)), "array register {name}");
            assert!(
                r[0].ends_with(&format!("{}n", regs::CHAN_STRIDE)),
                "{name} stride"
            );
        } else {
            rows.extend(expand(&r[0], &r[1]));
        }
    }
    check("Registers (BAR0)", rows, regs::ALL, &[]);
}

#[test]
fn methods_match_the_docs() {
    let doc = doc();
    let rows = table(&doc, "### Methods")
        .into_iter()
        .flat_map(|r| expand(&r[0], &r[1]))
        .collect();
    check("Methods", rows, method::ALL, &[]);
}

#[test]
fn para_registers_match_the_docs() {
    let doc = doc();
    let rows = table(&doc, "### Para-virtual interface")
        .into_iter()
        .flat_map(|r| expand(&r[0], &r[1]))
        .collect();
    check(
        "Para-virtual interface",
        rows,
        para::ALL,
        &[("MAX_BATCH", "MAX_BATCH_REG")],
    );
}

#[test]
fn fault_kinds_match_the_docs() {
    let doc = doc();
    let rows = table(&doc, "### Fault kinds");
    let documented: Vec<(u8, String)> = rows
        .iter()
        .map(|r| (r[0].parse().expect("kind number"), r[1].clone()))
        .collect();
    let defined: Vec<(u8, String)> = FaultKind::ALL
        .iter()
        .map(|k| (k.code(), k.name().to_string()))
        .collect();
    assert_eq!(
        documented, defined,
        "docs/hardware.md 'Fault kinds' vs vgpu-hw"
    );
}

#[test]
fn doorbell_page_matches_the_docs() {
    let doc = doc();
    let rows = table(&doc, "Page layout (u32 fields");
    let documented: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            let off = r[0].split(" + ").next().unwrap_or_default();
            (
                r[1].trim_end_matches("[n]").to_string(),
                u64::from(hex(off)),
            )
        })
        .collect();
    let defined = vec![
        ("PUT".to_string(), vgpu_hw::bell::PUT),
        ("GET".to_string(), vgpu_hw::bell::GET),
        ("STATUS".to_string(), vgpu_hw::bell::STATUS),
        ("WAKE".to_string(), vgpu_hw::bell::WAKE),
    ];
    assert_eq!(
        documented, defined,
        "docs/hardware.md doorbell page vs vgpu-hw"
    );
    for (name, _) in &documented[..3] {
        let row = rows.iter().find(|r| r[1].starts_with(name.as_str()));
        assert!(
            row.is_some_and(|r| r[0].ends_with(" + 4n")),
            "{name}[n]: stride 4"
        );
    }
}
