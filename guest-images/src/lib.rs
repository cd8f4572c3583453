//! The bare-metal guest images bundled with vgpu-vmm, selected by name (`--guest NAME`).
//!
//! The programs live in `guests/programs/src/bin/`, the runtime they share in `guests/rt/`,
//! and the VMM–guest contract in the `guest-abi` crate. `build.rs` builds them on every
//! `cargo build`; there is no manual step.

include!(concat!(env!("OUT_DIR"), "/images.rs"));

/// The ELF image of the bundled guest `name`.
pub fn get(name: &str) -> Option<&'static [u8]> {
    IMAGES.iter().find(|(n, _)| *n == name).map(|(_, elf)| *elf)
}

/// Names of all bundled guests, sorted.
pub fn names() -> impl Iterator<Item = &'static str> {
    IMAGES.iter().map(|(n, _)| *n)
}

/// What each bundled guest does (`vgpu-vmm --list-guests`; README.md's "Bundled guests" table
/// says the same, with code in backticks: a test keeps the two equal).
pub const DESCRIPTIONS: &[(&str, &str)] = &[
    (
        "hello",
        "prints hello, what the VMM reported at boot, and every PCI function with its BARs; exits 0",
    ),
    ("exit", "exits with code=N from the command line"),
    (
        "fault",
        "crashes on purpose: mode=ud, pf, panic (reported by the runtime, exit 102/101) or triple (CPU shutdown, VMM exit 3); exit 10 if it did not crash",
    ),
    (
        "pcitest",
        "with --testdev: checks BAR sizing, relocation and decode gating from inside the guest",
    ),
    (
        "exits",
        "with --testdev: n= MMIO reads and port reads of a test register, prints ns per trap",
    ),
    (
        "workloads",
        "with --gpu: runs the workload suite (size=small|medium|large|xl; large needs --memory 512, xl --memory 3072 and --gpu vram=512M and is for real GPUs) through the guest GPU driver, checks each result in the guest, prints RESULT name=.. ok=.. gpu_us=.. lines",
    ),
    (
        "attack",
        "with --gpu: tries to escape its partition in 20+ ways, prints ATTACK name=.. contained=.., exits 0 only if all were contained",
    ),
    (
        "fairness",
        "with --gpu: load generator of the fairness experiment: keeps depth= lcg_spin kernels (iters=, threads=, blocks=) in flight on one channel, sleeps on the GPU's interrupt, checks every result, stops after ms=; prints FAIRNESS start .., FAIRNESS t_ms=.. done=.. every report_ms=, FAIRNESS end t_ms=.. done=.. ok=.. (exit 10 mismatch, 11 bad argument, 13 GPU fault)",
    ),
    (
        "infer",
        "with --gpu: latency-sensitive side of the priority experiment: requests of kernels= lcg_spin launches (iters=, threads=, blocks=) waited for on the GPU's interrupt and checked, then think_us= of guest CPU think time, until ms=; prints INFER start .., INFER req=.. lat_us=.. for the first lines= requests, INFER end t_ms=.. requests=.. ok=.. p50_us=.. p99_us=.. max_us=.. (exit 10 mismatch, 11 bad argument, 13 GPU fault)",
    ),
    (
        "decode",
        "with --gpu: hostile: turns PCI memory decode off and on toggles= times while each of rounds= copy jobs (mib= MiB, reps= VRAM copies) runs, checks BAR0 silent/answering and the bytes, then runs the workload suite turning decode off and on at each of the driver's waits (suite=0: not); prints DECODE round=.. ok=.. during=.. and DECODE suite name=.. ok=.., exits 0 only if every round and workload was right",
    ),
    ("idle", "halts forever (for timeout and signal tests)"),
    (
        "count",
        "deterministic long run for snapshot and pause tests: steps= steps (default 40) that check and refill a mib= MiB buffer, print COUNT step=.. sum=.. f=.., and sleep ms= ms on the APIC timer; exits 0 (10 if memory or the TSC came back wrong)",
    ),
    ("echo", "echoes console input lines (quit ends it)"),
];

/// The description of the bundled guest `name` (empty if it has none).
pub fn description(name: &str) -> &'static str {
    DESCRIPTIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, d)| *d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn images_are_static_x86_64_elf_executables() {
        for name in [
            "hello",
            "exit",
            "fault",
            "pcitest",
            "exits",
            "idle",
            "echo",
            "workloads",
            "attack",
            "fairness",
            "infer",
            "count",
            "decode",
        ] {
            let elf = super::get(name).unwrap_or_else(|| panic!("{name} is bundled"));
            assert_eq!(&elf[..4], b"\x7fELF", "{name}");
            assert_eq!(elf[4], 2, "{name}: 64-bit");
            assert_eq!(u16::from_le_bytes([elf[16], elf[17]]), 2, "{name}: ET_EXEC");
            assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 62, "{name}: x86-64");
            let entry = u64::from_le_bytes(elf[24..32].try_into().unwrap());
            assert!(
                (0x10_0000..0x20_0000).contains(&entry),
                "{name}: entry {entry:#x}"
            );
        }
        assert!(super::get("nope").is_none());
    }

    /// Every guest has a description, and README.md's table says the same (backticks aside).
    #[test]
    fn descriptions_cover_every_guest_and_match_the_readme() {
        let readme = include_str!("../../README.md");
        for name in super::names() {
            let d = super::description(name);
            assert!(!d.is_empty(), "{name} has no description");
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{name}` |")))
                .unwrap_or_else(|| panic!("README.md has no row for {name}"));
            let text = row.split(" | ").nth(1).unwrap().trim_end_matches(" |");
            assert_eq!(text.replace('`', ""), d, "README row of {name}");
        }
        assert_eq!(super::DESCRIPTIONS.len(), super::names().count());
    }
}
