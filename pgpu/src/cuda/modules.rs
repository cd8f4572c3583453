//! Loaded modules of the cuda engine: PTX rewritten for sliced launches, loaded with
//! `cuModuleLoadDataEx` (the JIT error log becomes `EngineError::ModuleLoad { log }`), cached by
//! content (hash, then full-text compare), with the functions and parameter layouts resolved
//! once per entry.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::ffi::{CString, c_void};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use super::sys;

use super::driver::{Ctx, ck};
use super::rewrite::{SLICE_PARAMS, rewrite};
use crate::ckpt::CkParams;
use crate::engine::{EngineError, LoadedModule, ModuleId};
use crate::sync::lock;

/// A resolved entry: the function and where its parameters go.
#[derive(Debug, Clone, Copy)]
pub struct Func {
    pub f: sys::CUfunction,
    /// End of the entry's own parameters (the guest buffer must reach it).
    pub own_end: usize,
    /// Offset of the slice parameters (sliced modules) or the parameter buffer size.
    pub slice_off: usize,
    /// Where the checkpoint parameters go (transformed modules).
    pub ck: Option<CkParams>,
}

// SAFETY: a CUfunction handle is usable from any thread with the context current.
unsafe impl Send for Func {}

/// One CUDA module (unloaded when the last `Arc` goes: jobs keep it alive).
#[derive(Debug)]
pub struct Loaded {
    ctx: Ctx,
    module: sys::CUmodule,
    /// Whether the entries take the slice parameters.
    pub sliced: bool,
    /// Whether the entries take the checkpoint parameters (`ptx::ckpt::PARAMS`).
    pub ck: bool,
    funcs: Mutex<HashMap<String, Func>>,
}

// SAFETY: the module handle is used with the context current; `funcs` is behind a mutex.
unsafe impl Send for Loaded {}
// SAFETY: as above.
unsafe impl Sync for Loaded {}

impl Drop for Loaded {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded by `load`, unloaded once; no job holds it any more.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

impl Loaded {
    /// Whether `entry` was resolved already (`func`).
    pub fn resolved(&self, entry: &str) -> bool {
        lock(&self.funcs).contains_key(entry)
    }

    /// The function of `entry`, resolved once.
    pub fn func(&self, entry: &str) -> Result<Func, EngineError> {
        if let Some(f) = lock(&self.funcs).get(entry) {
            return Ok(*f);
        }
        let bad = |m: String| EngineError::BadLaunch(m);
        let name = CString::new(entry).map_err(|_| bad("entry name contains NUL".into()))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: out-pointer to a local, NUL-terminated name, live module.
        ck("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, self.module, name.as_ptr())
        })
        .map_err(|e| bad(format!("no entry {entry:?} ({e})")))?;
        // With CUDA's lazy loading the kernel reaches the device at its first launch unless
        // loaded here: resolving it before a run (`Engine::prepare`) keeps that out of the
        // run. Optional (CUDA 12.4+): a driver without it, or a failure, leaves it lazy.
        // SAFETY: a function handle of this live module.
        let _ = unsafe { sys::cuFuncLoad(f) };
        let mut params = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: out-pointers to locals; an index past the last parameter is an error.
            let r = unsafe { sys::cuFuncGetParamInfo(f, params.len(), &mut off, &mut size) };
            if r != sys::CUresult::CUDA_SUCCESS {
                break;
            }
            params.push((off, size));
        }
        let extra = if self.sliced {
            SLICE_PARAMS.len()
        } else if self.ck {
            ptx::ckpt::PARAMS.len()
        } else {
            0
        };
        if params.len() < extra {
            return Err(bad(format!("entry {entry:?}: slice parameters missing")));
        }
        let own = &params[..params.len() - extra];
        let own_end = own.last().map_or(0, |&(o, s)| o + s);
        let slice_off = if self.sliced {
            params[own.len()].0
        } else {
            own_end
        };
        let ck = self.ck.then(|| {
            let o = |k: usize| params[own.len() + k].0;
            let end = params.last().map_or(0, |&(o, s)| o + s);
            CkParams::new([o(0), o(1), o(2), o(3)], end)
        });
        let func = Func {
            f,
            own_end,
            slice_off: if self.ck { own_end } else { slice_off },
            ck,
        };
        lock(&self.funcs).insert(entry.to_string(), func);
        Ok(func)
    }
}

/// Loads PTX text with the JIT error log captured.
pub(crate) fn load(ctx: Ctx, text: &str, log_bytes: usize) -> Result<sys::CUmodule, EngineError> {
    let image = CString::new(text).map_err(|_| EngineError::ModuleLoad {
        log: "PTX text contains NUL".into(),
    })?;
    let mut log = vec![0u8; log_bytes];
    let mut opts = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut vals: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log_bytes as *mut c_void];
    let mut m: sys::CUmodule = std::ptr::null_mut();
    ctx.bind()?;
    // SAFETY: NUL-terminated image; option arrays of length 2 with a log buffer of the size told.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut m,
            image.as_ptr().cast(),
            2,
            opts.as_mut_ptr(),
            vals.as_mut_ptr(),
        )
    };
    if let Err(e) = ck("cuModuleLoadDataEx", r) {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let mut text = String::from_utf8_lossy(&log[..end]).trim().to_string();
        if text.is_empty() {
            text = e.to_string();
        }
        return Err(EngineError::ModuleLoad { log: text });
    }
    Ok(m)
}

struct Entry {
    text: String,
    loaded: Arc<Loaded>,
    loads: u32,
    /// Host bytes charged for it: the text kept here, plus the size of the text the driver
    /// loaded (an estimate of the driver's own copy of the module).
    host_bytes: u64,
    /// The transformed module (checkpoint method), if the transformation was accepted.
    ck: Option<Arc<CkLoaded>>,
    /// Its checkpoint form, where `ck` has restarting entries (`restart`/`auto`): a stalled
    /// restarting launch continues in it.
    ck_save: Option<Arc<CkLoaded>>,
}

/// A transformed module loaded in the driver and its plans.
#[derive(Debug)]
pub struct CkLoaded {
    pub loaded: Loaded,
    pub plans: Vec<ptx::ckpt::EntryPlan>,
}

impl CkLoaded {
    /// Wraps a loaded transformed module.
    pub fn new(ctx: Ctx, module: sys::CUmodule, plans: Vec<ptx::ckpt::EntryPlan>) -> CkLoaded {
        CkLoaded {
            loaded: Loaded {
                ctx,
                module,
                sliced: false,
                ck: true,
                funcs: Mutex::new(HashMap::new()),
            },
            plans,
        }
    }

    /// The plan of `entry` and its index.
    pub fn plan(&self, entry: &str) -> Option<(usize, &ptx::ckpt::EntryPlan)> {
        self.plans.iter().enumerate().find(|(_, p)| p.name == entry)
    }
}

/// A module loaded by [`Modules::build`], not in the table yet (unloaded if dropped).
pub struct Built {
    loaded: Loaded,
    /// Bytes of the rewritten text (0: loaded as it was).
    rewrite_bytes: usize,
}

/// The module table.
#[derive(Default)]
pub struct Modules {
    by_id: HashMap<ModuleId, Entry>,
    by_hash: HashMap<u64, Vec<ModuleId>>,
    next: u64,
    bytes: usize,
}

fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl Modules {
    /// A cached module with exactly this text, counted as one more load.
    pub fn lookup_and_count(&mut self, text: &str) -> Option<LoadedModule> {
        let ids = self.by_hash.get(&hash(text))?;
        let id = *ids.iter().find(|id| self.by_id[id].text == text)?;
        let e = self.by_id.get_mut(&id)?;
        e.loads = e.loads.saturating_add(1);
        Some(LoadedModule {
            id,
            host_bytes: e.host_bytes,
        })
    }

    /// Refuses a module of `len` bytes of text that would take the table past its limits.
    pub fn room(
        &self,
        len: usize,
        max_modules: usize,
        max_total: usize,
    ) -> Result<(), EngineError> {
        if self.by_id.len() >= max_modules {
            return Err(EngineError::TooMany("modules"));
        }
        if self.bytes + len > max_total {
            return Err(EngineError::TooMany("bytes of loaded PTX"));
        }
        Ok(())
    }

    /// Rewrites `text` for sliced launches (if `slice`) and loads it: the JIT, which takes
    /// milliseconds, so callers run it without the table's lock (launches look modules up
    /// in the table meanwhile). Dropping the result unloads it.
    pub fn build(ctx: Ctx, text: &str, slice: bool) -> Result<Built, EngineError> {
        let rw = if slice {
            rewrite(text)
        } else {
            super::rewrite::Rewritten {
                text: text.to_string(),
                sliced: false,
                reason: String::new(),
            }
        };
        if slice && !rw.sliced {
            log::warn!(
                "cuda: module runs unsliced (not preemptible): {}",
                rw.reason
            );
        }
        let (module, sliced, rewrite_bytes) = match load(ctx, &rw.text, 64 << 10) {
            Ok(m) => (m, rw.sliced, rw.text.len()),
            // A rewrite the JIT refuses (it should not happen): fall back to the original text.
            Err(EngineError::ModuleLoad { .. }) if rw.sliced => {
                let m = load(ctx, text, 64 << 10)?;
                log::warn!("cuda: rewritten PTX refused by the JIT, module runs unsliced");
                (m, false, 0)
            }
            Err(e) => return Err(e),
        };
        Ok(Built {
            loaded: Loaded {
                ctx,
                module,
                sliced,
                ck: false,
                funcs: Mutex::new(HashMap::new()),
            },
            rewrite_bytes,
        })
    }

    /// Records `built`, the module of `text` (not in the table: the caller looked it up under
    /// the same lock), within the table's limits.
    pub fn insert(
        &mut self,
        text: &str,
        built: Built,
        max_modules: usize,
        max_total: usize,
    ) -> Result<LoadedModule, EngineError> {
        self.room(text.len(), max_modules, max_total)?;
        self.next += 1;
        let id = ModuleId(self.next);
        let host_bytes = (text.len() + built.rewrite_bytes) as u64;
        self.by_id.insert(
            id,
            Entry {
                text: text.to_string(),
                loaded: Arc::new(built.loaded),
                loads: 1,
                host_bytes,
                ck: None,
                ck_save: None,
            },
        );
        self.by_hash.entry(hash(text)).or_default().push(id);
        self.bytes += text.len();
        Ok(LoadedModule { id, host_bytes })
    }

    /// Drops one load.
    pub fn unload(&mut self, id: ModuleId) -> Result<(), EngineError> {
        let e = self
            .by_id
            .get_mut(&id)
            .ok_or(EngineError::UnknownModule(id))?;
        e.loads -= 1;
        if e.loads == 0 {
            let e = self
                .by_id
                .remove(&id)
                .ok_or(EngineError::UnknownModule(id))?;
            self.bytes -= e.text.len();
            let h = hash(&e.text);
            if let Some(v) = self.by_hash.get_mut(&h) {
                v.retain(|&x| x != id);
                if v.is_empty() {
                    self.by_hash.remove(&h);
                }
            }
        }
        Ok(())
    }

    /// Attaches the transformed form of `id`, charging `bytes` more host bytes for it.
    pub fn set_ck(&mut self, id: ModuleId, ck: CkLoaded, bytes: u64) -> Option<u64> {
        let e = self.by_id.get_mut(&id)?;
        e.ck = Some(Arc::new(ck));
        e.host_bytes += bytes;
        Some(e.host_bytes)
    }

    /// Attaches the checkpoint form of `id` (beside a restarting `ck`), charging `bytes`.
    pub fn set_ck_save(&mut self, id: ModuleId, ck: CkLoaded, bytes: u64) -> Option<u64> {
        let e = self.by_id.get_mut(&id)?;
        e.ck_save = Some(Arc::new(ck));
        e.host_bytes += bytes;
        Some(e.host_bytes)
    }

    /// The checkpoint form of `id` beside a restarting one, if any.
    pub fn ck_save(&self, id: ModuleId) -> Result<Option<Arc<CkLoaded>>, EngineError> {
        self.by_id
            .get(&id)
            .map(|e| e.ck_save.clone())
            .ok_or(EngineError::UnknownModule(id))
    }

    /// The transformed form of `id`, if any.
    pub fn ck(&self, id: ModuleId) -> Result<Option<Arc<CkLoaded>>, EngineError> {
        self.by_id
            .get(&id)
            .map(|e| e.ck.clone())
            .ok_or(EngineError::UnknownModule(id))
    }

    /// The text `id` was loaded from.
    pub fn text(&self, id: ModuleId) -> Result<String, EngineError> {
        self.by_id
            .get(&id)
            .map(|e| e.text.clone())
            .ok_or(EngineError::UnknownModule(id))
    }

    /// The module (kept alive by the caller while a job uses it).
    pub fn get(&self, id: ModuleId) -> Result<Arc<Loaded>, EngineError> {
        self.by_id
            .get(&id)
            .map(|e| e.loaded.clone())
            .ok_or(EngineError::UnknownModule(id))
    }

    /// Drops every module (engine teardown).
    pub fn clear(&mut self) {
        self.by_id.clear();
        self.by_hash.clear();
    }
}
