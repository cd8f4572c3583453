//! What a [`super::SwitchEngine`] remembers of the state it built on its engine, so that the
//! same state can be built again on another engine: each address space's window and mappings
//! (kept as the caller made them, split on unmaps), each module's text and load count, each
//! host region's memory, with the id the current engine gave each. Replaying it on a new engine
//! gives new real ids; the callers' (virtual) ids never change.

use std::collections::{BTreeMap, HashMap};

use crate::engine::{
    EngineError, EngineSnapshot, HostRegionId, LoadLimits, MapTarget, Mapping, ModuleId, SpaceId,
    VaWindow,
};

/// One address space: its real id on the current engine, window and mappings (by VA).
#[derive(Debug, Clone)]
pub(crate) struct SpaceRec {
    pub real: SpaceId,
    pub window: VaWindow,
    pub maps: BTreeMap<u64, Mapping>,
}

/// One module: its real id, text, and how many loads the callers hold.
#[derive(Debug, Clone)]
pub(crate) struct ModuleRec {
    pub real: ModuleId,
    pub ptx: String,
    pub loads: u32,
    /// What the load reported (the engine's bytes plus this copy of the text).
    pub host_bytes: u64,
}

/// One host region: its real id and how it came to be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegionRec {
    pub real: HostRegionId,
    /// Caller memory (`register_host_region`): registered again on a new engine. Engine-owned
    /// memory (`alloc_host_region`) cannot be: the new engine must adopt it (`Handover`).
    pub registered: Option<(usize, usize)>,
}

/// Everything recorded, by virtual id.
#[derive(Debug, Default)]
pub(crate) struct Record {
    pub spaces: HashMap<SpaceId, SpaceRec>,
    pub modules: HashMap<ModuleId, ModuleRec>,
    pub regions: HashMap<HostRegionId, RegionRec>,
    pub next: u64,
}

impl Record {
    /// A fresh virtual id (never reused).
    pub fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The real id of virtual space `v`.
    pub fn space(&self, v: SpaceId) -> Result<SpaceId, EngineError> {
        self.spaces
            .get(&v)
            .map(|s| s.real)
            .ok_or(EngineError::UnknownSpace(v))
    }

    /// The real id of virtual module `v`.
    pub fn module(&self, v: ModuleId) -> Result<ModuleId, EngineError> {
        self.modules
            .get(&v)
            .map(|m| m.real)
            .ok_or(EngineError::UnknownModule(v))
    }

    /// The real target of a virtual one.
    pub fn target(&self, t: MapTarget) -> Result<MapTarget, EngineError> {
        Ok(match t {
            MapTarget::Vram { .. } => t,
            MapTarget::Host { region, offset } => MapTarget::Host {
                region: self
                    .regions
                    .get(&region)
                    .map(|r| r.real)
                    .ok_or(EngineError::UnknownHostRegion(region))?,
                offset,
            },
        })
    }

    /// The virtual target of a real one (`lookup`).
    pub fn virtual_target(&self, t: MapTarget) -> MapTarget {
        match t {
            MapTarget::Vram { .. } => t,
            MapTarget::Host { region, offset } => MapTarget::Host {
                region: self
                    .regions
                    .iter()
                    .find(|(_, r)| r.real == region)
                    .map_or(region, |(v, _)| *v),
                offset,
            },
        }
    }

    /// A mapping with a real target.
    pub fn real_mapping(&self, m: &Mapping) -> Result<Mapping, EngineError> {
        Ok(Mapping {
            target: self.target(m.target)?,
            ..*m
        })
    }
}

/// Removes `va..va+len` from a space's recorded mappings (after the engine unmapped it):
/// mappings inside go, mappings that overlap an end keep their outside parts (the engine
/// refused the unmap if that split a large page, so the cut is on a page boundary).
pub(crate) fn cut(maps: &mut BTreeMap<u64, Mapping>, va: u64, len: u64) {
    let end = va.saturating_add(len);
    let hit: Vec<u64> = maps
        .range(..end)
        .filter(|(_, m)| m.va.saturating_add(m.len) > va)
        .map(|(k, _)| *k)
        .collect();
    for k in hit {
        let Some(m) = maps.remove(&k) else { continue };
        let m_end = m.va + m.len;
        if m.va < va {
            maps.insert(
                m.va,
                Mapping {
                    len: va - m.va,
                    ..m
                },
            );
        }
        if m_end > end {
            let skip = end - m.va;
            let target = match m.target {
                MapTarget::Vram { pa } => MapTarget::Vram { pa: pa + skip },
                MapTarget::Host { region, offset } => MapTarget::Host {
                    region,
                    offset: offset + skip,
                },
            };
            maps.insert(
                end,
                Mapping {
                    va: end,
                    len: m_end - end,
                    target,
                    ..m
                },
            );
        }
    }
}

/// Loads every recorded module on `engine` (virtual → real), skipping those in `have`.
/// Each gets one load there whatever the callers' count (the switch holds it).
pub(crate) fn load_modules(
    engine: &dyn EngineSnapshot,
    rec: &Record,
    limits: &LoadLimits,
    have: &mut HashMap<ModuleId, ModuleId>,
) -> Result<(), EngineError> {
    for (v, m) in &rec.modules {
        if have.contains_key(v) {
            continue;
        }
        let real = engine.load_module(&m.ptx, limits)?.id;
        have.insert(*v, real);
    }
    Ok(())
}

/// Creates every recorded space on `engine` with its mappings, host targets translated with
/// `regions` (virtual → real on `engine`). On error what was made is destroyed again.
pub(crate) fn build_spaces(
    engine: &dyn EngineSnapshot,
    rec: &Record,
    regions: &HashMap<HostRegionId, HostRegionId>,
) -> Result<HashMap<SpaceId, SpaceId>, EngineError> {
    let mut made = HashMap::new();
    let r = (|| {
        for (v, s) in &rec.spaces {
            let real = engine.create_space(s.window)?;
            made.insert(*v, real);
            let maps = s
                .maps
                .values()
                .map(|m| {
                    let target = match m.target {
                        MapTarget::Host { region, offset } => MapTarget::Host {
                            region: *regions
                                .get(&region)
                                .ok_or(EngineError::UnknownHostRegion(region))?,
                            offset,
                        },
                        t => t,
                    };
                    Ok(Mapping { target, ..*m })
                })
                .collect::<Result<Vec<_>, EngineError>>()?;
            if !maps.is_empty() {
                engine.map_batch(real, &maps)?;
            }
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(made),
        Err(e) => {
            for real in made.values() {
                let _ = engine.destroy_space(*real);
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{PageSize, Perm};

    fn m(va: u64, len: u64, pa: u64) -> Mapping {
        Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size4K,
        }
    }

    #[test]
    fn cut_keeps_the_outside_parts_with_their_targets() {
        let mut maps = BTreeMap::new();
        maps.insert(0x1000, m(0x1000, 0x4000, 0x10_0000));
        maps.insert(0x8000, m(0x8000, 0x1000, 0x20_0000));
        cut(&mut maps, 0x2000, 0x2000);
        let got: Vec<_> = maps.values().copied().collect();
        assert_eq!(
            got,
            vec![
                m(0x1000, 0x1000, 0x10_0000),
                m(0x4000, 0x1000, 0x10_3000),
                m(0x8000, 0x1000, 0x20_0000)
            ]
        );
        cut(&mut maps, 0, 0x10_0000);
        assert!(maps.is_empty());
    }
}
