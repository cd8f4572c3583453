//! The structures the runtime fills (`cudaDeviceProp`, `cudaFuncAttributes`,
//! `cudaPointerAttributes`) have CUDA 13's layout: every field's offset and each size equal
//! what gcc computes from the wheel's own `driver_types.h`. Skipped (with the reason) where gcc
//! or the wheel is missing.

mod common;

use std::process::Command;

use cudart::gen_structs::LAYOUT;

#[test]
fn structures_match_the_cuda_13_header() {
    let Some(wheel) = common::cuda_wheel() else {
        eprintln!("skipped: no CUDA 13 wheel (set C=<site-packages>/nvidia/cu13)");
        return;
    };
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <driver_types.h>\nint main(void) {\n",
    );
    for (s, f, _) in LAYOUT {
        if *f == "sizeof" {
            c += &format!("  printf(\"%zu\\n\", sizeof(struct {s}));\n");
        } else {
            c += &format!("  printf(\"%zu\\n\", offsetof(struct {s}, {f}));\n");
        }
    }
    c += "  return 0;\n}\n";
    let dir = common::profile_dir().join("cudart-layout-test");
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, c).unwrap();
    let Some(cc) = common::output(
        Command::new("gcc")
            .arg("-I")
            .arg(wheel.join("include"))
            .arg(&src)
            .arg("-o")
            .arg(&exe),
    ) else {
        eprintln!("skipped: gcc is not installed");
        return;
    };
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let theirs: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(theirs.len(), LAYOUT.len());
    let wrong: Vec<String> = LAYOUT
        .iter()
        .zip(&theirs)
        .filter(|((_, _, ours), c)| ours != *c)
        .map(|((s, f, ours), c)| format!("{s}.{f}: ours {ours}, gcc {c}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(
        LAYOUT
            .iter()
            .any(|(s, f, n)| *s == "cudaDeviceProp" && *f == "sizeof" && *n > 1000)
    );
}
