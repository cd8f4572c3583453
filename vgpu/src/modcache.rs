//! The VM's module cache: PTX text (as the guest's launches hand it over) → the engine module
//! loaded for it, charged to the VM's host memory budget (the engine's bytes for the module
//! plus this cache's copy of the text). Least recently used modules not in use by the running
//! job are unloaded from the engine to make room; an evicted module's `.global` variables go
//! with it, and a later launch of the same text loads it afresh with the variables' initial
//! values (docs/hardware.md, "Host limits").

use std::collections::HashMap;
use std::sync::Arc;

use pgpu::{Engine, ModuleId};

use crate::budget::{Class, HostBudget};

struct Cached {
    id: ModuleId,
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
    by_text: HashMap<Arc<str>, Cached>,
    /// The module of the job running now (never evicted).
    in_use: Option<ModuleId>,
    /// The modules suspended jobs resume in (never evicted: a context cannot resume in a
    /// module loaded again).
    kept: Vec<ModuleId>,
}

impl ModuleCache {
    /// The module cached for `text` and the text's content hash, marked as used now.
    pub fn lookup(&mut self, text: &str, budget: &mut HostBudget) -> Option<(ModuleId, u64)> {
        let c = self.by_text.get_mut(text)?;
        c.last_use = budget.tick();
        Some((c.id, c.hash))
    }

    /// Caches a module just loaded for `text` (its `bytes` already charged); returns the text's
    /// content hash.
    pub fn insert(&mut self, text: &str, id: ModuleId, bytes: u64, budget: &mut HostBudget) -> u64 {
        let last_use = budget.tick();
        let hash = vgpu_proto::kernel::KernelKey::content_hash(text.as_bytes());
        self.by_text.insert(
            Arc::from(text),
            Cached {
                id,
                hash,
                bytes,
                last_use,
            },
        );
        hash
    }

    /// The cached texts and their modules, least recently used first (snapshot).
    pub fn texts(&self) -> Vec<(Arc<str>, ModuleId)> {
        let mut v: Vec<_> = self.by_text.iter().collect();
        v.sort_by_key(|(_, c)| c.last_use);
        v.into_iter().map(|(t, c)| (t.clone(), c.id)).collect()
    }

    /// The text cached for engine module `id` (a scan: for rare callers).
    pub fn text_of(&self, id: ModuleId) -> Option<Arc<str>> {
        self.by_text
            .iter()
            .find(|(_, c)| c.id == id)
            .map(|(t, _)| t.clone())
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
            .by_text
            .iter()
            .filter(|(_, c)| Some(c.id) != self.in_use && !self.kept.contains(&c.id))
            .filter(|(_, c)| older_than.is_none_or(|t| c.last_use < t))
            .min_by_key(|(_, c)| c.last_use)
            .map(|(t, _)| t.clone());
        let Some(c) = victim.and_then(|t| self.by_text.remove(&t)) else {
            return false;
        };
        log::debug!(
            "vgpu: evicting module {:?} ({} bytes; host memory budget)",
            c.id,
            c.bytes
        );
        if let Err(e) = engine.unload_module(c.id) {
            log::warn!("vgpu: unload module {:?}: {e}", c.id);
        }
        budget.release(Class::Module, c.bytes);
        budget.count(|s| &mut s.modules_evicted);
        true
    }

    /// Unloads everything (device teardown).
    pub fn clear(&mut self, engine: &dyn Engine, budget: &mut HostBudget) {
        for (_, c) in self.by_text.drain() {
            if let Err(e) = engine.unload_module(c.id) {
                log::warn!("vgpu: unload module {:?}: {e}", c.id);
            }
            budget.release(Class::Module, c.bytes);
        }
    }
}
