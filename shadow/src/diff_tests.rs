//! Randomized check of `diff`: applying its unmaps and maps to the old tables, page by page,
//! must give exactly the new tables, never split a 2 MiB page and only touch what changed.

use std::collections::BTreeMap;

use pgpu::{HostRegionId, MapTarget, Mapping, PageSize, Perm};

use super::diff::{advance, diff, end, remove_range};

const K4: u64 = 4096;
const M2: u64 = 2 << 20;
/// Test window: 16 MiB.
const SPAN: u64 = 16 << 20;

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random sorted, non-overlapping mappings inside `[0, SPAN)`, from a small set of targets so
/// that old and new often agree.
fn random_list(r: &mut Rng) -> Vec<Mapping> {
    let mut out = Vec::new();
    let mut va = 0;
    while va < SPAN {
        va += r.below(4) * K4;
        if r.below(3) == 0 {
            va = va.next_multiple_of(M2);
        }
        let big = va.is_multiple_of(M2) && r.below(2) == 0;
        let (page, page_size) = if big {
            (M2, PageSize::Size2M)
        } else {
            (K4, PageSize::Size4K)
        };
        let len = page * (1 + r.below(3));
        if va + len > SPAN {
            break;
        }
        let base = r.below(2) * M2;
        let target = if r.below(4) == 0 {
            MapTarget::Host {
                region: HostRegionId(1),
                offset: base + va,
            }
        } else {
            MapTarget::Vram { pa: base + va }
        };
        let perm = if r.below(5) == 0 {
            Perm::ReadOnly
        } else {
            Perm::ReadWrite
        };
        out.push(Mapping {
            va,
            len,
            target,
            perm,
            page_size,
        });
        va += len;
    }
    out
}

type Model = BTreeMap<u64, (MapTarget, Perm, PageSize)>;

fn model(list: &[Mapping]) -> Model {
    let mut m = Model::new();
    for x in list {
        for off in (0..x.len).step_by(K4 as usize) {
            m.insert(x.va + off, (advance(x.target, off), x.perm, x.page_size));
        }
    }
    m
}

#[test]
fn applying_the_diff_gives_the_new_tables() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..400 {
        let old = random_list(&mut r);
        let new = if round % 4 == 0 {
            old.clone()
        } else {
            random_list(&mut r)
        };
        let d = diff(&old, &new);
        let mut tables = model(&old);
        let mut unmapped = [0u64; 2];
        for &(va, len) in &d.unmap {
            // No unmap range splits an installed 2 MiB page.
            for x in old.iter().filter(|x| x.page_size == PageSize::Size2M) {
                for p in (x.va..end(x)).step_by(M2 as usize) {
                    let inside = va <= p && p + M2 <= va + len;
                    let apart = va + len <= p || p + M2 <= va;
                    assert!(inside || apart, "round {round}: unmap {va:#x}+{len:#x}");
                }
            }
            for p in (va..va + len).step_by(K4 as usize) {
                if let Some((_, _, ps)) = tables.remove(&p) {
                    unmapped[usize::from(ps == PageSize::Size2M)] += K4;
                }
            }
        }
        assert_eq!(unmapped, d.unmap_bytes, "round {round}");
        for x in &d.map {
            assert!(
                x.va.is_multiple_of(x.page_size.bytes()),
                "round {round}: {x:?}"
            );
            assert!(
                x.len.is_multiple_of(x.page_size.bytes()),
                "round {round}: {x:?}"
            );
            for off in (0..x.len).step_by(K4 as usize) {
                let prev = tables.insert(x.va + off, (advance(x.target, off), x.perm, x.page_size));
                assert!(prev.is_none(), "round {round}: {x:?} overlaps");
            }
        }
        assert_eq!(tables, model(&new), "round {round}");
        // Only changed pages are touched: unchanged tables give an empty diff.
        if old == new {
            assert!(d.unmap.is_empty() && d.map.is_empty());
        }
    }
}

#[test]
fn one_changed_page_changes_one_page() {
    let run = Mapping {
        va: 0,
        len: 16 * K4,
        target: MapTarget::Vram { pa: 0x10_0000 },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size4K,
    };
    let mut new = remove_range(&[run], 5 * K4, K4);
    new.insert(
        1,
        Mapping {
            va: 5 * K4,
            len: K4,
            target: MapTarget::Vram { pa: 0x90_0000 },
            ..run
        },
    );
    assert_eq!(new.len(), 3);
    let d = diff(&[run], &new);
    assert_eq!(d.unmap, [(5 * K4, K4)]);
    assert_eq!(d.map, [new[1]]);
    assert_eq!(d.unmap_bytes, [K4, 0]);
}

#[test]
fn remove_range_clips() {
    let a = Mapping {
        va: 0,
        len: 4 * K4,
        target: MapTarget::Vram { pa: 0 },
        perm: Perm::ReadOnly,
        page_size: PageSize::Size4K,
    };
    let b = Mapping { va: 8 * K4, ..a };
    let out = remove_range(&[a, b], 2 * K4, 7 * K4);
    assert_eq!(out.len(), 2);
    assert_eq!((out[0].va, out[0].len), (0, 2 * K4));
    assert_eq!((out[1].va, out[1].len), (9 * K4, 3 * K4));
    assert_eq!(out[1].target, MapTarget::Vram { pa: K4 });
    assert_eq!(remove_range(&[a, b], 100 * K4, K4), [a, b]);
}
