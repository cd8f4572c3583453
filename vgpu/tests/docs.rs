//! README.md must say what the `--gpu` keys' declarations say (`vgpu::config::keys`): its
//! `vgpu-vmm --help` listing carries the `--gpu` help made from them, word for word, so a key
//! added, renamed or given another default without the README following fails here.

use vgpu::config::keys;

/// Text with every run of whitespace made one space.
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `--gpu` entry of the README's help listing: from its line to the next option's.
fn readme_entry() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let mut lines = readme.lines().skip_while(|l| !l.starts_with("  --gpu "));
    let first = lines.next().expect("README.md has no `  --gpu` help entry");
    let rest: Vec<&str> = lines
        .take_while(|l| !l.trim_start().starts_with("--"))
        .collect();
    words(&format!("{first} {}", rest.join(" ")))
}

#[test]
fn readme_gpu_help_is_the_declared_one() {
    let entry = readme_entry();
    let help = words(&keys::help());
    assert!(
        entry.contains(&help),
        "README.md's --gpu entry differs from the keys' help (paste `vgpu-vmm --help`):\n\
         README: {entry}\nkeys:   {help}"
    );
    for k in keys::KEYS {
        assert!(
            entry.contains(&format!("{}={}", k.name, k.values)),
            "{}",
            k.name
        );
    }
}
