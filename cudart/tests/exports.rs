//! The built `libcudart.so.13` exports every function NVIDIA's exports (the committed list
//! gen/nvidia-exports.txt, from `nm -D` of the CUDA 13.0 wheel's library), with the soname and
//! symbol version node nvcc-built programs import from, under its real file name.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

fn lib() -> std::path::PathBuf {
    // Where cargo leaves the cdylib for `cargo test` and `cargo build` alike.
    common::profile_dir().join("deps/libcudart.so")
}

#[test]
fn every_nvidia_export_is_exported() {
    let Some(out) = common::output(Command::new("nm").args(["-D", "--defined-only"]).arg(lib()))
    else {
        eprintln!("skipped: nm is not installed");
        return;
    };
    assert!(
        out.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[1] == "T").then(|| f[2].split('@').next().unwrap_or("").to_string())
        })
        .collect();
    let theirs: Vec<&str> = include_str!("../gen/nvidia-exports.txt").lines().collect();
    assert!(
        theirs.len() > 400,
        "the committed list has {} names",
        theirs.len()
    );
    let missing: Vec<&&str> = theirs.iter().filter(|n| !ours.contains(**n)).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    // Nothing of the runtime's own leaks out as a C symbol beyond CUDA's names.
    let extra: Vec<&String> = ours
        .iter()
        .filter(|n| !theirs.contains(&n.as_str()))
        .collect();
    assert!(extra.is_empty(), "exported beyond NVIDIA's list: {extra:?}");
}

#[test]
fn soname_version_node_and_file_name() {
    let Some(out) = common::output(Command::new("readelf").args(["-d", "-V", "-W"]).arg(lib()))
    else {
        eprintln!("skipped: readelf is not installed");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libcudart.so.13]"), "{text}");
    let verdef = text
        .split("Version definition section")
        .nth(1)
        .unwrap_or("");
    assert!(
        verdef.contains("Name: libcudart.so.13"),
        "no libcudart.so.13 version node: {text}"
    );
    let link = std::fs::read_link(common::profile_dir().join("libcudart.so.13"))
        .expect("target/<profile>/libcudart.so.13");
    assert_eq!(link, std::path::Path::new("deps/libcudart.so"));
}
