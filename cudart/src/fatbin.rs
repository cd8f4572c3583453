//! Just enough of the fat binary format for the runtime: finding the fat binary behind what
//! `__cudaRegisterFatBinary` receives (the `.nvFatBinSegment` wrapper, magic 0x466243B1, or a
//! bare fat binary, magic 0xBA55ED50), its size, and a summary of its entries for the one-line
//! message when the driver finds no code it can run. The driver parses the rest
//! (`cuModuleLoadData` takes the fat binary itself).

use std::ffi::c_void;

pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Entry kinds.
pub const KIND_PTX: u16 = 1;
pub const KIND_ELF: u16 = 2;
/// The largest fat binary summarised; and the most entries listed.
const MAX_LEN: usize = 1 << 30;
const MAX_ENTRIES: usize = 256;

/// The fat binary `arg` designates, if it is a wrapper or a fat binary.
///
/// # Safety
/// `arg` is null or points at readable memory of a wrapper (24 bytes) or a fat binary header
/// (16 bytes), as nvcc's registration code passes.
pub unsafe fn image_of(arg: *const c_void) -> Option<*const u8> {
    if arg.is_null() {
        return None;
    }
    // SAFETY: per the contract, at least 4 readable bytes at `arg`.
    let magic = unsafe { (arg as *const u32).read_unaligned() };
    let image = match magic {
        // SAFETY: a wrapper is { int magic; int version; const u64 *data; void *other; }.
        WRAPPER_MAGIC => unsafe {
            (arg as *const u8)
                .add(8)
                .cast::<*const u8>()
                .read_unaligned()
        },
        FATBIN_MAGIC => arg as *const u8,
        _ => return None,
    };
    if image.is_null() {
        return None;
    }
    // SAFETY: the wrapper's data pointer addresses the fat binary in the program's image.
    let magic = unsafe { (image as *const u32).read_unaligned() };
    (magic == FATBIN_MAGIC).then_some(image)
}

/// The whole length of the fat binary at `image` (header + entries), bounded by 1 GiB.
///
/// # Safety
/// `image` points at a fat binary header (as [`image_of`] returned).
pub unsafe fn image_len(image: *const u8) -> usize {
    // SAFETY: a fat binary header is 16 bytes: u32 magic, u16 version, u16 header size, u64 size.
    let (hsize, size) = unsafe {
        (
            image.add(6).cast::<u16>().read_unaligned(),
            image.add(8).cast::<u64>().read_unaligned(),
        )
    };
    (hsize as usize)
        .saturating_add(usize::try_from(size).unwrap_or(usize::MAX))
        .min(MAX_LEN)
}

/// One entry of a fat binary, as the summary needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: u16,
    /// `compute_XX` / `sm_XX` number (80, 90...).
    pub arch: u32,
    /// PTX ISA version (major, minor).
    pub isa: (u16, u16),
}

/// The entries of a fat binary held in `bytes` (header included); stops at the first entry
/// that does not fit.
pub fn entries(bytes: &[u8]) -> Vec<Entry> {
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let mut out = Vec::new();
    if u32_at(0) != Some(FATBIN_MAGIC) {
        return out;
    }
    let (Some(hsize), Some(size)) = (u16_at(6), u64_at(8)) else {
        return out;
    };
    let end = (hsize as u64).saturating_add(size).min(bytes.len() as u64) as usize;
    let mut at = hsize as usize;
    while out.len() < MAX_ENTRIES && at < end {
        let (Some(kind), Some(ehsize), Some(psize)) = (u16_at(at), u32_at(at + 4), u64_at(at + 8))
        else {
            break;
        };
        let (Some(minor), Some(major), Some(arch)) =
            (u16_at(at + 24), u16_at(at + 26), u32_at(at + 28))
        else {
            break;
        };
        out.push(Entry {
            kind,
            arch,
            isa: (major, minor),
        });
        let next = (at as u64)
            .saturating_add(ehsize as u64)
            .saturating_add(psize);
        if ehsize == 0 || next > end as u64 {
            break;
        }
        at = next as usize;
    }
    out
}

/// "PTX 9.0 for compute_80, SASS for sm_90" (or "nothing").
pub fn describe(entries: &[Entry]) -> String {
    let parts: Vec<String> = entries
        .iter()
        .map(|e| match e.kind {
            KIND_PTX => format!("PTX {}.{} for compute_{}", e.isa.0, e.isa.1, e.arch),
            KIND_ELF => format!("SASS for sm_{}", e.arch),
            k => format!("an entry of kind {k} for arch {}", e.arch),
        })
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fat binary of the given (kind, arch, ISA major, minor) entries, each with a payload.
    pub fn build(list: &[(u16, u32, u16, u16)]) -> Vec<u8> {
        let mut body = Vec::new();
        for &(kind, arch, major, minor) in list {
            let mut h = vec![0u8; 80];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[4..8].copy_from_slice(&80u32.to_le_bytes());
            h[8..16].copy_from_slice(&8u64.to_le_bytes());
            h[24..26].copy_from_slice(&minor.to_le_bytes());
            h[26..28].copy_from_slice(&major.to_le_bytes());
            h[28..32].copy_from_slice(&arch.to_le_bytes());
            body.extend(h);
            body.extend([0xAA; 8]);
        }
        let mut out = Vec::new();
        out.extend(FATBIN_MAGIC.to_le_bytes());
        out.extend(1u16.to_le_bytes());
        out.extend(16u16.to_le_bytes());
        out.extend((body.len() as u64).to_le_bytes());
        out.extend(body);
        out
    }

    #[test]
    fn lists_entries_and_describes_them() {
        let fb = build(&[(KIND_PTX, 80, 9, 0), (KIND_ELF, 90, 0, 0)]);
        let e = entries(&fb);
        assert_eq!(
            e,
            vec![
                Entry {
                    kind: 1,
                    arch: 80,
                    isa: (9, 0)
                },
                Entry {
                    kind: 2,
                    arch: 90,
                    isa: (0, 0)
                }
            ]
        );
        assert_eq!(describe(&e), "PTX 9.0 for compute_80, SASS for sm_90");
        assert_eq!(describe(&[]), "nothing");
        // SAFETY: `fb` is a fat binary built above.
        assert_eq!(unsafe { image_len(fb.as_ptr()) }, fb.len());
        // SAFETY: as above; a bare fat binary designates itself.
        assert_eq!(unsafe { image_of(fb.as_ptr().cast()) }, Some(fb.as_ptr()));
    }

    #[test]
    fn wrapper_points_at_the_fat_binary() {
        let fb = build(&[(KIND_PTX, 90, 9, 0)]);
        let mut w = [0u8; 24];
        w[0..4].copy_from_slice(&WRAPPER_MAGIC.to_le_bytes());
        w[8..16].copy_from_slice(&(fb.as_ptr() as usize).to_le_bytes());
        // SAFETY: `w` is a 24-byte wrapper pointing at `fb`.
        assert_eq!(unsafe { image_of(w.as_ptr().cast()) }, Some(fb.as_ptr()));
        w[0] ^= 1;
        // SAFETY: as above, now with a wrong magic.
        assert_eq!(unsafe { image_of(w.as_ptr().cast()) }, None);
        // SAFETY: null is refused before any read.
        assert_eq!(unsafe { image_of(std::ptr::null()) }, None);
    }

    #[test]
    fn truncated_or_hostile_binaries_stop_cleanly() {
        let fb = build(&[(KIND_PTX, 80, 9, 0), (KIND_PTX, 90, 9, 0)]);
        for cut in 0..fb.len() {
            assert!(entries(&fb[..cut]).len() <= 2);
        }
        let mut bad = fb.clone();
        bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(entries(&bad).len(), 2);
        let mut zero = fb;
        zero[16 + 4..16 + 8].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(entries(&zero).len(), 1);
    }
}
