//! Module cache of the sim engine: PTX text → parsed `ptx::Module`, keyed by the full text (so a
//! hash collision cannot alias two modules), with counted loads and ids that are never reused.

use std::collections::HashMap;
use std::sync::Arc;

use super::ckpt::CkModule;
use crate::engine::{EngineError, LoadedModule, ModuleId};

#[derive(Debug)]
struct Entry {
    module: Arc<ptx::Module>,
    text: Arc<str>,
    loads: u64,
    /// Host bytes held: the decoded module and its variables, and the text.
    host_bytes: u64,
    /// The transformed module (checkpoint method), if the transformation accepted the text.
    ck: Option<Arc<CkModule>>,
}

/// The cache.
#[derive(Debug, Default)]
pub struct Modules {
    by_id: HashMap<ModuleId, Entry>,
    by_text: HashMap<Arc<str>, ModuleId>,
    next_id: u64,
    /// Bytes of PTX text held.
    text_bytes: usize,
}

impl Modules {
    /// Already loaded `text`, counting one more load.
    pub fn lookup_and_count(&mut self, text: &str) -> Option<LoadedModule> {
        let id = *self.by_text.get(text)?;
        let e = self.by_id.get_mut(&id)?;
        e.loads = e.loads.saturating_add(1);
        Some(LoadedModule {
            id,
            host_bytes: e.host_bytes,
        })
    }

    /// Adds a parsed module holding `module_bytes` of host memory besides its text (or counts a
    /// load if `text` was added meanwhile), with its transformed form if any.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        text: &str,
        module: ptx::Module,
        module_bytes: u64,
        ck: Option<Arc<CkModule>>,
        max_modules: usize,
        max_text_bytes: usize,
    ) -> Result<LoadedModule, EngineError> {
        if let Some(m) = self.lookup_and_count(text) {
            return Ok(m);
        }
        if self.by_id.len() >= max_modules {
            return Err(EngineError::TooMany("modules"));
        }
        let total = self.text_bytes.saturating_add(text.len());
        if total > max_text_bytes {
            return Err(EngineError::TooMany("bytes of loaded PTX"));
        }
        self.text_bytes = total;
        self.next_id += 1;
        let id = ModuleId(self.next_id);
        let host_bytes = module_bytes.saturating_add(text.len() as u64);
        let text: Arc<str> = Arc::from(text);
        self.by_text.insert(text.clone(), id);
        self.by_id.insert(
            id,
            Entry {
                module: Arc::new(module),
                text,
                loads: 1,
                host_bytes,
                ck,
            },
        );
        Ok(LoadedModule { id, host_bytes })
    }

    /// Modules loaded now.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Host bytes held by all loaded modules.
    pub fn host_bytes(&self) -> u64 {
        self.by_id.values().map(|e| e.host_bytes).sum()
    }

    /// Drops one load; the module goes with the last.
    pub fn unload(&mut self, id: ModuleId) -> Result<(), EngineError> {
        let e = self
            .by_id
            .get_mut(&id)
            .ok_or(EngineError::UnknownModule(id))?;
        e.loads = e.loads.saturating_sub(1);
        if e.loads == 0
            && let Some(e) = self.by_id.remove(&id)
        {
            self.by_text.remove(&e.text);
            self.text_bytes = self.text_bytes.saturating_sub(e.text.len());
        }
        Ok(())
    }

    /// The transformed module, if `id` has one.
    pub fn ck(&self, id: ModuleId) -> Result<Option<Arc<CkModule>>, EngineError> {
        self.by_id
            .get(&id)
            .map(|e| e.ck.clone())
            .ok_or(EngineError::UnknownModule(id))
    }

    /// The parsed module.
    pub fn get(&self, id: ModuleId) -> Result<Arc<ptx::Module>, EngineError> {
        self.by_id
            .get(&id)
            .map(|e| e.module.clone())
            .ok_or(EngineError::UnknownModule(id))
    }
}
