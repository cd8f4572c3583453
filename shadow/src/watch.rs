//! The watch set: guest pages (aperture, 4 KiB page) holding page directories, page tables and
//! instance blocks, so that the device model notices guest writes to them.

use std::collections::BTreeSet;

use crate::types::{Aperture, PAGE_4K};

/// One watched guest page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    /// The memory the page is in.
    pub aperture: Aperture,
    /// The page's address (4 KiB aligned).
    pub page: u64,
}

impl WatchKey {
    /// The key of the page holding `addr`.
    pub const fn of(aperture: Aperture, addr: u64) -> Self {
        Self {
            aperture,
            page: addr & !(PAGE_4K - 1),
        }
    }
}

/// A set of watched guest pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchSet {
    pages: BTreeSet<WatchKey>,
}

impl WatchSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds every page touching `[addr, addr + len)` (nothing for `len` 0; clipped at the top
    /// of the address space).
    pub fn insert_range(&mut self, aperture: Aperture, addr: u64, len: u64) {
        if len == 0 {
            return;
        }
        let last = addr.saturating_add(len - 1) & !(PAGE_4K - 1);
        let mut page = addr & !(PAGE_4K - 1);
        loop {
            self.pages.insert(WatchKey { aperture, page });
            match page.checked_add(PAGE_4K) {
                Some(next) if next <= last => page = next,
                _ => break,
            }
        }
    }

    /// Adds one page.
    pub fn insert(&mut self, key: WatchKey) {
        self.pages.insert(key);
    }

    /// Whether the page holding `addr` is watched.
    pub fn contains(&self, aperture: Aperture, addr: u64) -> bool {
        self.pages.contains(&WatchKey::of(aperture, addr))
    }

    /// Whether a write of `len` bytes at `addr` touches a watched page.
    pub fn hits(&self, aperture: Aperture, addr: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let first = WatchKey::of(aperture, addr);
        let last = WatchKey::of(aperture, addr.saturating_add(len - 1));
        self.pages.range(first..=last).next().is_some()
    }

    /// Adds all pages of `other`.
    pub fn extend(&mut self, other: &WatchSet) {
        self.pages.extend(other.pages.iter().copied());
    }

    /// The pages, sorted.
    pub fn iter(&self) -> impl Iterator<Item = WatchKey> + '_ {
        self.pages.iter().copied()
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether no page is watched.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }
}
