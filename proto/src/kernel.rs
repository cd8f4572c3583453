//! A kernel's identity (`KernelKey`): what a VM process sends with its `want` (docs/architecture.md,
//! "Filling") and the scheduler learns kernels' GPU time and gaps under. Defined here, with the
//! protocol that carries it, so that both sides of the VM–daemon contract compute the same
//! hash without the device model depending on the scheduler.

/// A kernel's identity for filling: a stable 64-bit hash of (module content hash, entry name,
/// grid, block, dynamic shared memory size). Two launches with the same identity are expected
/// to take about the same GPU time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelKey(pub u64);

impl KernelKey {
    /// The identity of a launch (FNV-1a over the fields, little-endian; stable across builds and
    /// machines, so a VM process and the daemon compute the same key). `module` is the module's
    /// [`KernelKey::content_hash`].
    pub fn of(module: u64, entry: &str, grid: [u32; 3], block: [u32; 3], shared: u32) -> Self {
        let mut h = Fnv::default();
        h.eat(&module.to_le_bytes());
        h.eat(&(entry.len() as u64).to_le_bytes());
        h.eat(entry.as_bytes());
        for v in grid.into_iter().chain(block).chain([shared]) {
            h.eat(&v.to_le_bytes());
        }
        Self(h.0)
    }

    /// The stable content hash of a module's text (FNV-1a, like [`KernelKey::of`]): the
    /// `module` argument of `of`. A VM process computes it once per loaded module.
    pub fn content_hash(bytes: &[u8]) -> u64 {
        let mut h = Fnv::default();
        h.eat(bytes);
        h.0
    }
}

/// 64-bit FNV-1a.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(PRIME);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_tell_launches_apart() {
        // FNV-1a of nothing is its offset basis: the hash is the documented one.
        assert_eq!(KernelKey::content_hash(b""), 0xcbf2_9ce4_8422_2325);
        let m = KernelKey::content_hash(b".entry k {}");
        let a = KernelKey::of(m, "k", [1, 1, 1], [32, 1, 1], 0);
        assert_eq!(a, KernelKey::of(m, "k", [1, 1, 1], [32, 1, 1], 0));
        assert_ne!(a, KernelKey::of(m, "k", [2, 1, 1], [32, 1, 1], 0));
        assert_ne!(a, KernelKey::of(m, "k", [1, 1, 1], [32, 1, 1], 4));
        assert_ne!(a, KernelKey::of(m ^ 1, "k", [1, 1, 1], [32, 1, 1], 0));
    }
}
