//! Bounds-checked twins made before a live copy's first round (issue 24: the guest's slowdown
//! during a live snapshot or migration). Without this, the first launch of each kernel after
//! the write-set log starts has its write set analysed, its module transformed
//! (`ptx::ckpt::bounds`) and the twin loaded (on cuda: the PTX JIT) by the GPU worker, between
//! the guest's jobs: the guest's queue waits for it, once per module and VM.
//!
//! So the worker notes which modules, entries and address spaces the guest launches
//! ([`WriteSetLog::note_launch`]: a map lookup per launch), and the start of a live copy with
//! write sets, on the caller's thread and with the log still off, does that work for all of them
//! ([`WriteSetLog::prepare`]): write sets analysed, twins made and loaded into the engine (the
//! preparation holds that load until the log stops), each checked entry's run prepared in the
//! engine with the shape of the guest's first launch of it (`Engine::prepare`: on cuda its
//! functions resolved and loaded onto the device, streams and a save area made, which the
//! worker would otherwise do before the twin's first run), flag words taken. The first checked
//! launch then finds its twin analysed, and the worker's load of it into the VM's module cache
//! gets the prepared module back from the engine's content cache (`twin_loads_ready`; a twin
//! the preparation did not make is loaded at the launch as before: `twin_loads_cold`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use pgpu::{EngineSnapshot, Job, LaunchJob, LoadLimits, ModuleId, SpaceId};

use super::{Inner, MAX_CACHED, MAX_FLAGS, Twin, WriteSetLog};

/// Most entries noted per module.
const MAX_ENTRIES: usize = 64;
/// How long the preparation's load of one twin may take.
const LOAD_WAIT: Duration = Duration::from_secs(5);
/// Host bytes one prepared twin may take in the engine (it is charged to the VM's budget only
/// when a launch loads it into the VM's module cache).
const MAX_TWIN_HOST_BYTES: u64 = 64 << 20;

/// The space and shape of an entry's first launch (what its twin's run is prepared for).
#[derive(Debug, Clone, Copy)]
struct Shape {
    space: SpaceId,
    grid: [u32; 3],
    block: [u32; 3],
    dynamic_shared: u32,
}

/// What the guest launched: modules (their text, and their entries with the shape of their
/// first launch) and address spaces.
#[derive(Debug, Default)]
pub(super) struct Seen {
    modules: HashMap<ModuleId, (Arc<str>, BTreeMap<String, Shape>)>,
    spaces: BTreeSet<SpaceId>,
}

impl WriteSetLog {
    /// Notes launch `l` (of a module of PTX `text`); call for every launch, the log on or off
    /// (after the first launch of an entry: one lookup).
    pub fn note_launch(&self, l: &LaunchJob, text: &str) {
        let shape = Shape {
            space: l.space,
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.dynamic_shared,
        };
        let mut s = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if s.spaces.len() < MAX_FLAGS {
            s.spaces.insert(l.space);
        }
        if let Some((_, entries)) = s.modules.get_mut(&l.module) {
            if entries.len() < MAX_ENTRIES && !entries.contains_key(&l.entry) {
                entries.insert(l.entry.clone(), shape);
            }
            return;
        }
        if s.modules.len() >= MAX_CACHED {
            s.modules.clear();
        }
        s.modules.insert(
            l.module,
            (Arc::from(text), BTreeMap::from([(l.entry.clone(), shape)])),
        );
    }

    /// Prepares the checked launches of everything the guest launched so far (see the
    /// module's comment); call with the log off, before starting it, on a thread other than
    /// the GPU worker. Failures only leave the work to the launches, as without it.
    pub fn prepare(&self, engine: &dyn EngineSnapshot) {
        let t = Instant::now();
        let (modules, spaces): (Vec<_>, BTreeSet<SpaceId>) = {
            let s = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            (
                s.modules
                    .iter()
                    .map(|(m, (text, entries))| (*m, text.clone(), entries.clone()))
                    .collect(),
                s.spaces.clone(),
            )
        };
        let mut loaded = 0u64;
        for (module, text, entries) in modules {
            let missing: Vec<String> = {
                let i = self.lock();
                entries
                    .keys()
                    .filter(|e| !i.sets.contains_key(&(module, (*e).clone())))
                    .cloned()
                    .collect()
            };
            let parsed = (!missing.is_empty())
                .then(|| ptx::parse(&text).ok())
                .flatten();
            let twin = (!self.lock().checked.contains_key(&module)).then(|| Twin::of(&text));
            let twin = {
                let mut i = self.lock();
                for e in missing {
                    if i.sets.len() >= MAX_CACHED {
                        i.sets.clear();
                    }
                    let ws = parsed.as_ref().and_then(|m| m.write_set(&e)).map(Arc::new);
                    i.sets.insert((module, e), ws);
                }
                if let Some(tw) = twin {
                    if i.checked.len() >= MAX_CACHED {
                        i.checked.clear();
                    }
                    i.checked.insert(module, tw);
                }
                i.checked.get(&module).cloned().flatten()
            };
            let Some(tw) = twin else {
                continue;
            };
            let id = match tw.prepared() {
                Some(id) => id,
                None => {
                    let limits = LoadLimits {
                        max_host_bytes: MAX_TWIN_HOST_BYTES,
                        deadline: Some(Instant::now() + LOAD_WAIT),
                        cancel: None,
                    };
                    match engine.load_module(&tw.ptx, &limits) {
                        Ok(m) => {
                            *tw.prepared.lock().unwrap_or_else(PoisonError::into_inner) =
                                Some(m.id);
                            self.lock().twin_loads.push(tw.clone());
                            loaded += 1;
                            m.id
                        }
                        Err(e) => {
                            log::info!(
                                "vgpu: write sets: twin not prepared ({e}): loaded at its launch"
                            );
                            continue;
                        }
                    }
                }
            };
            // Each checked entry's run, as the worker would prepare it before the twin's
            // first run (an error leaves that to the worker).
            for (entry, sh) in &entries {
                if tw.checked.entry(entry).is_none() {
                    continue;
                }
                let job = Job::Launch(LaunchJob {
                    space: sh.space,
                    module: id,
                    entry: entry.clone(),
                    grid: sh.grid,
                    block: sh.block,
                    dynamic_shared: sh.dynamic_shared,
                    params: Vec::new(),
                });
                if !engine.prepared(&job)
                    && let Err(e) = engine.prepare(&job)
                {
                    log::debug!("vgpu: write sets: twin run of {entry} not prepared: {e}");
                }
            }
        }
        for space in spaces {
            self.flag(engine, space);
        }
        self.lock().prepared = (loaded, t.elapsed().as_nanos() as u64);
    }

    /// Gives back the engine modules the preparation loaded (the log stops: a twin the
    /// worker loaded stays in the VM's module cache under its own load).
    pub(super) fn unload_prepared(&self, i: &mut Inner, engine: &dyn EngineSnapshot) {
        for tw in std::mem::take(&mut i.twin_loads) {
            let id = tw
                .prepared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(id) = id
                && let Err(e) = engine.unload_module(id)
            {
                log::warn!("vgpu: write sets: unload prepared twin {id:?}: {e}");
            }
        }
    }

    /// A launch loaded `twin` into the VM's module cache as engine module `module`.
    pub fn note_twin_load(&self, twin: &Twin, module: ModuleId) {
        let ready = twin.prepared() == Some(module);
        let mut i = self.lock();
        if ready {
            i.stats.twin_loads_ready += 1;
        } else {
            i.stats.twin_loads_cold += 1;
        }
    }
}
