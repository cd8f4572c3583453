//! docs/architecture.md must say what the workspace is: its crate table has a row for every
//! workspace crate and lists exactly the workspace crates each one depends on (its
//! `[dependencies]` and `[build-dependencies]` with a `path`), and every crate whose `lib.rs`
//! documentation lists its files names each module it declares (a file added without the map
//! following fails here, as docs/hardware.md's tables are checked by vgpu-hw's tests).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The names inside backticks in `s`.
fn ticked(s: &str) -> Vec<String> {
    s.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The workspace members' directories (the root Cargo.toml's `members = [...]`).
fn members() -> Vec<PathBuf> {
    let toml = read(&root().join("Cargo.toml"));
    let line = toml
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("members = [...] in Cargo.toml");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root().join(m))
        .collect()
}

/// A crate's package name and the path dependencies of its `[dependencies]` and
/// `[build-dependencies]` (the names before `=`; every path dependency is a workspace crate).
fn manifest(dir: &Path) -> (String, BTreeSet<String>) {
    let toml = read(&dir.join("Cargo.toml"));
    let mut name = None;
    let mut deps = BTreeSet::new();
    let mut section = String::new();
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        match section.as_str() {
            "[package]" if key == "name" && name.is_none() => {
                name = Some(value.trim().trim_matches('"').to_string());
            }
            "[dependencies]" | "[build-dependencies]" if value.contains("path") => {
                deps.insert(key.to_string());
            }
            _ => {}
        }
    }
    (name.expect("package name"), deps)
}

#[test]
fn crate_table_matches_the_manifests() {
    let doc = read(&root().join("docs/architecture.md"));
    let workspace: BTreeMap<String, BTreeSet<String>> =
        members().iter().map(|d| manifest(d)).collect();
    let rows: Vec<Vec<&str>> = doc
        .lines()
        .skip_while(|l| !l.starts_with("| crate | job | depends on |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let mut documented = BTreeSet::new();
    for row in &rows {
        assert_eq!(row.len(), 3, "{row:?}");
        let name = ticked(row[0]).pop().unwrap_or_default();
        let listed: BTreeSet<String> = ticked(row[2])
            .into_iter()
            .filter(|d| workspace.contains_key(d))
            .collect();
        let deps = workspace
            .get(&name)
            .unwrap_or_else(|| panic!("the crate table names {name:?}, not a workspace crate"));
        assert_eq!(
            &listed, deps,
            "docs/architecture.md's crate table: `{name}` depends on {deps:?}, the table says {listed:?}"
        );
        documented.insert(name);
    }
    let crates: BTreeSet<String> = workspace.keys().cloned().collect();
    assert_eq!(
        documented, crates,
        "docs/architecture.md's crate table must have one row per workspace crate"
    );
}

/// The modules `lib.rs` declares (`mod x;` / `pub mod x;`), test-only and fuzzing ones aside.
fn declared(lib: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut gated = false;
    for line in lib.lines().map(str::trim) {
        if line.starts_with("#[cfg(") && (line.contains("test") || line.contains("fuzzing")) {
            gated = true;
            continue;
        }
        if line.starts_with("#[") {
            continue;
        }
        let decl = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("pub(crate) mod "))
            .or_else(|| line.strip_prefix("mod "));
        if let Some(m) = decl.and_then(|d| d.strip_suffix(';'))
            && !gated
        {
            out.push(m.to_string());
        }
        gated = false;
    }
    out
}

#[test]
fn lib_rs_file_lists_name_every_module() {
    let mut checked = 0;
    for dir in members() {
        let path = dir.join("src/lib.rs");
        let Ok(lib) = std::fs::read_to_string(&path) else {
            continue;
        };
        let docs: String = lib
            .lines()
            .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        let listing = ["Files:", "Modules:", "Module map:"];
        let Some(at) = listing.iter().filter_map(|k| docs.find(k)).min() else {
            continue;
        };
        let named: BTreeSet<String> = ticked(&docs[at..]).into_iter().collect();
        for m in declared(&lib) {
            assert!(
                named.contains(&m),
                "{}: module `{m}` is missing from the crate documentation's file list",
                path.display()
            );
            assert!(
                dir.join(format!("src/{m}.rs")).exists()
                    || dir.join(format!("src/{m}/mod.rs")).exists(),
                "{}: module `{m}` has no file",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} crates list their files");
}
