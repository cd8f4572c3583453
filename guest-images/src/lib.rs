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
}
