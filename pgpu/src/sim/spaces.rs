//! Address-space table of the sim engine and the rule that mappings do not change while a job
//! runs: a job (or a host copy) holds a [`SpaceUse`], which counts as "running" and carries an
//! `Arc` of the immutable page table; `map`/`unmap`/`destroy` are refused while any use lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::engine::{EngineError, SpaceId, VaWindow};

use super::dirty::{RunPin, SimDirtyLog};
use super::flags::FlagPage;
use super::mmu::Mmu;
use crate::sync::lock;

#[derive(Debug)]
struct State {
    mmu: Arc<Mmu>,
    running: u32,
    destroyed: bool,
}

#[derive(Debug)]
struct Slot {
    id: SpaceId,
    state: Mutex<State>,
}

/// All address spaces of an engine.
#[derive(Debug, Default)]
pub struct Spaces {
    table: Mutex<HashMap<SpaceId, Arc<Slot>>>,
    next_id: Mutex<u64>,
    /// The engine's dirty log, shared by every page table.
    log: Arc<SimDirtyLog>,
    /// The engine's flag words, seen by every page table (`sim::flags`).
    flags: Arc<FlagPage>,
}

/// A running job's hold on an address space: the page table it translates with.
#[derive(Debug)]
pub struct SpaceUse {
    slot: Arc<Slot>,
    mmu: Arc<Mmu>,
    /// Keeps the pages this use translates for writing dirty until it ends (`sim::dirty`).
    _pin: RunPin,
}

impl SpaceUse {
    /// The page table (immutable while this use lives).
    pub fn mmu(&self) -> &Mmu {
        &self.mmu
    }
    /// The space.
    pub fn id(&self) -> SpaceId {
        self.slot.id
    }
}

impl Drop for SpaceUse {
    fn drop(&mut self) {
        let mut st = lock(&self.slot.state);
        st.running = st.running.saturating_sub(1);
    }
}

impl Spaces {
    /// The flag words of every space.
    pub fn flags(&self) -> &Arc<FlagPage> {
        &self.flags
    }

    /// The dirty log of every space.
    pub fn log(&self) -> &Arc<SimDirtyLog> {
        &self.log
    }

    /// Creates a space with an empty page table (the window was validated by the caller).
    pub fn create(&self, window: VaWindow, max_spaces: usize) -> Result<SpaceId, EngineError> {
        let mut table = lock(&self.table);
        if table.len() >= max_spaces {
            return Err(EngineError::TooMany("address spaces"));
        }
        let id = {
            let mut next = lock(&self.next_id);
            *next += 1;
            SpaceId(*next)
        };
        let state = State {
            mmu: Arc::new(Mmu::with_log(
                window,
                self.log.clone(),
                self.flags.clone(),
                id.0,
            )),
            running: 0,
            destroyed: false,
        };
        table.insert(
            id,
            Arc::new(Slot {
                id,
                state: Mutex::new(state),
            }),
        );
        Ok(id)
    }

    fn slot(&self, id: SpaceId) -> Result<Arc<Slot>, EngineError> {
        lock(&self.table)
            .get(&id)
            .cloned()
            .ok_or(EngineError::UnknownSpace(id))
    }

    /// Destroys a space; refused while a job uses it.
    pub fn destroy(&self, id: SpaceId) -> Result<(), EngineError> {
        let mut table = lock(&self.table);
        let slot = table.get(&id).ok_or(EngineError::UnknownSpace(id))?;
        let mut st = lock(&slot.state);
        if st.running > 0 {
            return Err(EngineError::SpaceBusy(id));
        }
        st.destroyed = true;
        drop(st);
        table.remove(&id);
        Ok(())
    }

    /// Starts a use (a job or host copy) of the space.
    pub fn begin(&self, id: SpaceId) -> Result<SpaceUse, EngineError> {
        let slot = self.slot(id)?;
        let mut st = lock(&slot.state);
        if st.destroyed {
            return Err(EngineError::UnknownSpace(id));
        }
        st.running = st.running.saturating_add(1);
        let mmu = st.mmu.clone();
        drop(st);
        Ok(SpaceUse {
            slot,
            mmu,
            _pin: self.log.run_started(),
        })
    }

    /// Changes the page table with `f`; refused while a job uses the space.
    pub fn update<R>(
        &self,
        id: SpaceId,
        f: impl FnOnce(&mut Mmu) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        let slot = self.slot(id)?;
        let mut st = lock(&slot.state);
        if st.destroyed {
            return Err(EngineError::UnknownSpace(id));
        }
        if st.running > 0 {
            return Err(EngineError::SpaceBusy(id));
        }
        // No use lives, so no other `Arc` of the table does: this never copies.
        f(Arc::make_mut(&mut st.mmu))
    }

    /// Reads the page table of a space (for inspection).
    pub fn inspect<R>(&self, id: SpaceId, f: impl FnOnce(&Mmu) -> R) -> Result<R, EngineError> {
        let slot = self.slot(id)?;
        let st = lock(&slot.state);
        Ok(f(&st.mmu))
    }

    /// Whether any space maps target `slot`.
    pub fn any_maps_slot(&self, target_slot: u16) -> bool {
        let slots: Vec<Arc<Slot>> = lock(&self.table).values().cloned().collect();
        slots
            .iter()
            .any(|s| lock(&s.state).mmu.bytes_on_slot(target_slot) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{PageSize, Perm};
    use crate::sim::mmu::TargetMem;

    const W: VaWindow = VaWindow {
        base: 1 << 30,
        size: 1 << 30,
    };

    fn map_one(s: &Spaces, id: SpaceId) -> Result<(), EngineError> {
        let t = TargetMem {
            slot: 0,
            host_base: 0x7000_0000_0000,
            size: 1 << 30,
        };
        s.update(id, |m| {
            Ok(m.map(1 << 30, 4096, t, 0, Perm::ReadWrite, PageSize::Size4K)?)
        })
    }

    #[test]
    fn mappings_frozen_while_in_use() {
        let s = Spaces::default();
        let a = s.create(W, 4).unwrap();
        let b = s.create(W, 4).unwrap();
        let using = s.begin(a).unwrap();
        let using2 = s.begin(a).unwrap();
        assert_eq!(map_one(&s, a), Err(EngineError::SpaceBusy(a)));
        assert_eq!(s.destroy(a), Err(EngineError::SpaceBusy(a)));
        map_one(&s, b).unwrap();
        drop(using);
        assert_eq!(
            map_one(&s, a),
            Err(EngineError::SpaceBusy(a)),
            "one use still lives"
        );
        drop(using2);
        map_one(&s, a).unwrap();
        assert_eq!(using_bytes(&s, a), 4096);
        assert!(s.any_maps_slot(0));
        s.destroy(a).unwrap();
        assert_eq!(s.begin(a).unwrap_err(), EngineError::UnknownSpace(a));
        assert_eq!(s.destroy(a), Err(EngineError::UnknownSpace(a)));
    }

    fn using_bytes(s: &Spaces, id: SpaceId) -> u64 {
        s.inspect(id, Mmu::mapped_bytes).unwrap()
    }

    #[test]
    fn space_limit() {
        let s = Spaces::default();
        let a = s.create(W, 1).unwrap();
        assert_eq!(s.create(W, 1), Err(EngineError::TooMany("address spaces")));
        s.destroy(a).unwrap();
        let b = s.create(W, 1).unwrap();
        assert_ne!(a, b);
    }
}
