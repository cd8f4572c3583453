//! The VM's module cache: PTX text (as the guest's launches hand it over) → the engine module
//! loaded for it, charged to the VM's host memory budget (the engine's bytes for the module
//! plus this cache's copy of the text). Least recently used modules not in use by the running
//! job are unloaded from the engine to make room; an evicted module's `.global` variables go
//! with it, and a later launch of the same text loads it afresh with the variables' initial
//! values (docs/hardware.md, "Host limits").
//!
//! Texts the device itself holds as `Arc<str>` (the write sets' bounds-checked twins, run at
//! every launch while a live copy logs) are also found by their allocation's address
//! ([`ModuleCache::lookup_shared`]), without hashing and comparing the whole text per launch
//! (issue 24: the guest's slowdown during a live copy).

use std::collections::HashMap;
use std::sync::Arc;

use pgpu::{Engine, ModuleId};

use crate::budget::{Class, HostBudget};

struct Cached {
    text: Arc<str>,
    /// `vgpu_proto::kernel::KernelKey::content_hash` of the text (the module part of a launch's
    /// identity on a shared GPU), computed once.
    hash: u64,
    /// Bytes charged for it.
    bytes: u64,
    /// Use stamp of the budget's clock.
    last_use: u64,
}

/// See the module documentation.
#[derive(Default)]
pub struct ModuleCache {
    by_id: HashMap<ModuleId, Cached>,
    by_text: HashMap<Arc<str>, ModuleId>,
    /// Shared texts by the address of their allocation, each with a clone that keeps that
    /// allocation (so its address) from being reused while it is here.
    by_ptr: HashMap<usize, (Arc<str>, ModuleId)>,
    /// The module of the job running now (never evicted).
    in_use: Option<ModuleId>,
    /// The modules suspended jobs resume in (never evicted: a context cannot resume in a
    /// module loaded again).
    kept: Vec<ModuleId>,
}

fn addr(text: &Arc<str>) -> usize {
    Arc::as_ptr(text).cast::<u8>() as usize
}

impl ModuleCache {
    /// The module cached for `text` and the text's content hash, marked as used now.
    pub fn lookup(&mut self, text: &str, budget: &mut HostBudget) -> Option<(ModuleId, u64)> {
        let id = *self.by_text.get(text)?;
        self.touch(id, budget)
    }

    /// The module cached for the shared text `text` once [`ModuleCache::alias`] named it (map
    /// look-ups by address and by id, the text neither hashed nor compared), marked as used
    /// now.
    pub fn lookup_shared(
        &mut self,
        text: &Arc<str>,
        budget: &mut HostBudget,
    ) -> Option<(ModuleId, u64)> {
        let (_, id) = self.by_ptr.get(&addr(text))?;
        let id = *id;
        self.touch(id, budget)
    }

    /// Lets [`ModuleCache::lookup_shared`] find module `id` by the shared text `text`, if `id`
    /// is cached for a text equal to it (compared once, here). The cache then keeps `text`
    /// itself as the module's text (no second copy). One alias per module: a newer one
    /// replaces it (so the texts held here stay bounded by the modules cached).
    pub fn alias(&mut self, text: &Arc<str>, id: ModuleId) {
        let Some(c) = self.by_id.get_mut(&id).filter(|c| *c.text == **text) else {
            return;
        };
        c.text = text.clone();
        self.by_text.remove(&**text);
        self.by_text.insert(text.clone(), id);
        self.by_ptr.retain(|_, (_, m)| *m != id);
        self.by_ptr.insert(addr(text), (text.clone(), id));
    }

    fn touch(&mut self, id: ModuleId, budget: &mut HostBudget) -> Option<(ModuleId, u64)> {
        let c = self.by_id.get_mut(&id)?;
        c.last_use = budget.tick();
        Some((id, c.hash))
    }

    /// Caches a module just loaded for `text` (its `bytes` already charged); returns the text's
    /// content hash. The engines give a text one module id and count its loads: a text cached
    /// already under `id` (a GPU image imported into a warm cache) was loaded once more, and
    /// that load is given back to `engine` at once, with the earlier charge, so that the
    /// entry holds one load and one charge. Another id for a cached text (no engine makes
    /// one) replaces it: the old module is unloaded unless a job runs or resumes in it, and
    /// its charge is given back either way.
    pub fn insert(
        &mut self,
        engine: &dyn Engine,
        text: &str,
        id: ModuleId,
        bytes: u64,
        budget: &mut HostBudget,
    ) -> u64 {
        let last_use = budget.tick();
        let hash = vgpu_proto::kernel::KernelKey::content_hash(text.as_bytes());
        let text: Arc<str> = Arc::from(text);
        if let Some(&old) = self.by_text.get(&text).filter(|&&old| old != id) {
            debug_assert!(false, "module {old:?} and {id:?} for one text");
            let busy = Some(old) == self.in_use || self.kept.contains(&old);
            if let Some(c) = self.forget(old) {
                if busy {
                    log::warn!("vgpu: module {old:?} replaced by {id:?} while in use: kept loaded");
                } else if let Err(e) = engine.unload_module(old) {
                    log::warn!("vgpu: unload module {old:?}: {e}");
                }
                budget.release(Class::Module, c.bytes);
            }
        }
        if let Some(c) = self.forget(id) {
            if *c.text == *text
                && let Err(e) = engine.unload_module(id)
            {
                log::warn!("vgpu: unload module {id:?} (loaded twice): {e}");
            }
            budget.release(Class::Module, c.bytes);
        }
        self.by_text.insert(text.clone(), id);
        self.by_id.insert(
            id,
            Cached {
                text,
                hash,
                bytes,
                last_use,
            },
        );
        hash
    }

    /// Drops `id` from the indexes (its entry in `by_id` goes with the caller).
    fn forget(&mut self, id: ModuleId) -> Option<Cached> {
        let c = self.by_id.remove(&id)?;
        if self.by_text.get(&c.text) == Some(&id) {
            self.by_text.remove(&c.text);
        }
        self.by_ptr.retain(|_, (_, m)| *m != id);
        Some(c)
    }

    /// The cached texts and their modules, least recently used first (snapshot).
    pub fn texts(&self) -> Vec<(Arc<str>, ModuleId)> {
        let mut v: Vec<_> = self.by_id.iter().collect();
        v.sort_by_key(|(_, c)| c.last_use);
        v.into_iter().map(|(id, c)| (c.text.clone(), *id)).collect()
    }

    /// The text cached for engine module `id`.
    pub fn text_of(&self, id: ModuleId) -> Option<Arc<str>> {
        self.by_id.get(&id).map(|c| c.text.clone())
    }

    /// Marks the module of the job about to run (`None` when it ended).
    pub fn set_in_use(&mut self, id: Option<ModuleId>) {
        self.in_use = id;
    }

    /// The modules of the jobs a pause suspended (replaces the last set).
    pub fn keep(&mut self, ids: impl IntoIterator<Item = ModuleId>) {
        self.kept.clear();
        self.kept.extend(ids);
    }

    /// Unloads the least recently used module not in use nor kept, if it was used before `older_than`
    /// (any, if `None`), and gives back its charge; returns whether one was evicted.
    pub fn evict_older(
        &mut self,
        engine: &dyn Engine,
        budget: &mut HostBudget,
        older_than: Option<u64>,
    ) -> bool {
        let victim = self
            .by_id
            .iter()
            .filter(|(id, _)| Some(**id) != self.in_use && !self.kept.contains(id))
            .filter(|(_, c)| older_than.is_none_or(|t| c.last_use < t))
            .min_by_key(|(_, c)| c.last_use)
            .map(|(id, _)| *id);
        let Some((id, c)) = victim.and_then(|id| Some((id, self.forget(id)?))) else {
            return false;
        };
        log::debug!(
            "vgpu: evicting module {:?} ({} bytes; host memory budget)",
            id,
            c.bytes
        );
        if let Err(e) = engine.unload_module(id) {
            log::warn!("vgpu: unload module {:?}: {e}", id);
        }
        budget.release(Class::Module, c.bytes);
        budget.count(|s| &mut s.modules_evicted);
        true
    }

    /// Unloads everything (device teardown).
    pub fn clear(&mut self, engine: &dyn Engine, budget: &mut HostBudget) {
        self.by_text.clear();
        self.by_ptr.clear();
        for (id, c) in self.by_id.drain() {
            if let Err(e) = engine.unload_module(id) {
                log::warn!("vgpu: unload module {:?}: {e}", id);
            }
            budget.release(Class::Module, c.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> HostBudget {
        HostBudget::new(1 << 30)
    }

    fn sim() -> pgpu::sim::SimEngine {
        pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 4 << 20,
            workers: 1,
            ..Default::default()
        })
        .unwrap()
    }

    const PTX: &str =
        ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry k() { ret; }\n";

    /// A text cached again under its module (an image imported into a warm cache: the engine
    /// loaded it once more, under the same id): the extra load and the earlier charge are
    /// given back, so that clearing the cache leaves the engine with nothing loaded.
    #[test]
    fn a_module_cached_twice_holds_one_load_and_one_charge() {
        let engine = sim();
        let mut b = budget();
        let mut c = ModuleCache::default();
        let limits = pgpu::LoadLimits::default();
        let m = engine.load_module(PTX, &limits).unwrap().id;
        assert!(b.charge(Class::Module, 100));
        c.insert(&engine, PTX, m, 100, &mut b);
        assert_eq!(
            engine.load_module(PTX, &limits).unwrap().id,
            m,
            "one id per text"
        );
        assert!(b.charge(Class::Module, 70));
        c.insert(&engine, PTX, m, 70, &mut b);
        assert_eq!(b.used(), 70, "one charge");
        assert_eq!(c.lookup(PTX, &mut b).map(|f| f.0), Some(m));
        c.clear(&engine, &mut b);
        assert_eq!(b.used(), 0);
        assert!(
            engine.unload_module(m).is_err(),
            "the second load was given back: nothing is left loaded"
        );
    }

    #[test]
    fn a_shared_text_is_found_by_address_once_aliased_and_forgotten_with_its_module() {
        let engine = sim();
        let mut b = budget();
        let mut c = ModuleCache::default();
        let shared: Arc<str> = Arc::from(".version 7.0 // twin");
        c.insert(&engine, &shared, ModuleId(7), 10, &mut b);
        // Not aliased yet: only the look-up by text finds it.
        assert!(c.lookup_shared(&shared, &mut b).is_none());
        assert_eq!(c.lookup(&shared, &mut b).map(|f| f.0), Some(ModuleId(7)));
        c.alias(&shared, ModuleId(7));
        assert_eq!(
            c.lookup_shared(&shared, &mut b).map(|f| f.0),
            Some(ModuleId(7))
        );
        // The cache keeps the shared text itself, found by text as before.
        assert!(Arc::ptr_eq(&c.text_of(ModuleId(7)).unwrap(), &shared));
        assert_eq!(c.lookup(&shared, &mut b).map(|f| f.0), Some(ModuleId(7)));
        // An equal text in another allocation is not the alias.
        let other: Arc<str> = Arc::from(&*shared);
        assert!(c.lookup_shared(&other, &mut b).is_none());
        // A text that differs is never aliased to the module.
        let wrong: Arc<str> = Arc::from(".version 7.0 // other");
        c.alias(&wrong, ModuleId(7));
        assert!(c.lookup_shared(&wrong, &mut b).is_none());
        // A newer alias replaces the older one.
        c.alias(&other, ModuleId(7));
        assert!(c.lookup_shared(&shared, &mut b).is_none());
        assert_eq!(
            c.lookup_shared(&other, &mut b).map(|f| f.0),
            Some(ModuleId(7))
        );
        assert_eq!(c.text_of(ModuleId(7)).as_deref(), Some(&*shared));
    }

    #[test]
    fn eviction_drops_every_index_of_the_module() {
        let engine = sim();
        let mut b = budget();
        let mut c = ModuleCache::default();
        let a: Arc<str> = Arc::from("a");
        let z: Arc<str> = Arc::from("z");
        c.insert(&engine, &a, ModuleId(1), 10, &mut b);
        c.insert(&engine, &z, ModuleId(2), 10, &mut b);
        c.alias(&a, ModuleId(1));
        c.set_in_use(Some(ModuleId(2)));
        assert!(c.evict_older(&engine, &mut b, None));
        assert!(c.lookup_shared(&a, &mut b).is_none());
        assert!(c.lookup(&a, &mut b).is_none());
        assert!(c.text_of(ModuleId(1)).is_none());
        assert_eq!(c.texts().len(), 1);
        // Module 2 is in use: nothing else to evict.
        assert!(!c.evict_older(&engine, &mut b, None));
    }
}
