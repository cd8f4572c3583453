//! The difference between installed and wanted engine mappings: which VA ranges to unmap and
//! which (clipped) mappings to map, page by page, so a changed PTE touches only its page.

use pgpu::{MapTarget, Mapping, PageSize};

/// What to change to go from `old` to `new`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Diff {
    /// VA ranges `(va, len)` to unmap (each covers only installed pages that change or go;
    /// 2 MiB pages wholly).
    pub unmap: Vec<(u64, u64)>,
    /// Bytes to unmap in 4 KiB pages and in 2 MiB pages.
    pub unmap_bytes: [u64; 2],
    /// Mappings to make after the unmaps.
    pub map: Vec<Mapping>,
}

pub(crate) fn advance(target: MapTarget, d: u64) -> MapTarget {
    match target {
        MapTarget::Vram { pa } => MapTarget::Vram {
            pa: pa.wrapping_add(d),
        },
        MapTarget::Host { region, offset } => MapTarget::Host {
            region,
            offset: offset.wrapping_add(d),
        },
    }
}

pub(crate) fn end(m: &Mapping) -> u64 {
    m.va.saturating_add(m.len)
}

/// `m` clipped to `[a, b)` (which must lie inside it).
pub(crate) fn clip(m: &Mapping, a: u64, b: u64) -> Mapping {
    Mapping {
        va: a,
        len: b - a,
        target: advance(m.target, a - m.va),
        ..*m
    }
}

/// Appends `m`, merging it into the last mapping when it continues it exactly.
pub(crate) fn push_merged(out: &mut Vec<Mapping>, m: Mapping) {
    if let Some(last) = out.last_mut()
        && end(last) == m.va
        && last.perm == m.perm
        && last.page_size == m.page_size
        && advance(last.target, last.len) == m.target
    {
        last.len += m.len;
        return;
    }
    out.push(m);
}

/// The mapping of `list` (sorted, non-overlapping) covering `va`, advancing `idx` (monotone).
fn covering<'a>(list: &'a [Mapping], idx: &mut usize, va: u64) -> Option<&'a Mapping> {
    while list.get(*idx).is_some_and(|m| end(m) <= va) {
        *idx += 1;
    }
    list.get(*idx).filter(|m| m.va <= va)
}

/// Same translation of the byte at `va` (target, permission, page size).
fn same_at(a: &Mapping, b: &Mapping, va: u64) -> bool {
    a.perm == b.perm
        && a.page_size == b.page_size
        && advance(a.target, va - a.va) == advance(b.target, va - b.va)
}

/// Diffs `old` against `new` (both sorted by VA, non-overlapping).
///
/// Compared per segment between consecutive mapping boundaries of either list; a 2 MiB page
/// either matches exactly or differs in every segment (page size is compared), so unmap ranges
/// and new mappings always cover 2 MiB pages wholly.
pub(crate) fn diff(old: &[Mapping], new: &[Mapping]) -> Diff {
    let mut bounds: Vec<u64> = old.iter().chain(new).flat_map(|m| [m.va, end(m)]).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut d = Diff::default();
    let (mut io, mut inew) = (0, 0);
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        let o = covering(old, &mut io, a);
        let n = covering(new, &mut inew, a);
        let same = match (o, n) {
            (None, None) => true,
            (Some(o), Some(n)) => same_at(o, n, a),
            _ => false,
        };
        if same {
            continue;
        }
        if let Some(o) = o {
            match d.unmap.last_mut() {
                Some((va, len)) if *va + *len == a => *len += b - a,
                _ => d.unmap.push((a, b - a)),
            }
            let i = usize::from(o.page_size == PageSize::Size2M);
            d.unmap_bytes[i] += b - a;
        }
        if let Some(n) = n {
            push_merged(&mut d.map, clip(n, a, b));
        }
    }
    d
}

/// `list` (sorted, non-overlapping) without the bytes of `[va, va + len)`.
pub(crate) fn remove_range(list: &[Mapping], va: u64, len: u64) -> Vec<Mapping> {
    let stop = va.saturating_add(len);
    let mut out = Vec::with_capacity(list.len() + 1);
    for m in list {
        if end(m) <= va || m.va >= stop {
            out.push(*m);
            continue;
        }
        if m.va < va {
            out.push(clip(m, m.va, va));
        }
        if end(m) > stop {
            out.push(clip(m, stop, end(m)));
        }
    }
    out
}
