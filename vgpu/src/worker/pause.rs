//! The worker's side of pausing for a snapshot (`crate::snapshot`): the state it exports when
//! it parks between turns (per-channel pushbuffer and method state, cached modules, the job a
//! pause preempted) and the restored state it takes back before its next turn.

use std::time::Duration;

use pgpu::{Job, ModuleId};

use super::{ChanRt, Worker};
use crate::budget::Class;
use crate::snapshot::image::{ChanImage, ModuleImage, SuspendedImage, WorkerImage};
use crate::state::Regs;

/// A job preempted by a pause: resumed when its channel replays the method that started it.
#[derive(Debug)]
pub(super) struct Suspended {
    pub context: pgpu::SavedContext,
    /// Engine time it used so far (counts against the job's limit).
    pub gpu: Duration,
    /// The module of a launch (its text is among the exported modules).
    pub module: Option<ModuleId>,
}

impl Suspended {
    /// `job`, preempted after `gpu` of engine time with its `context`.
    pub(super) fn of(context: pgpu::SavedContext, gpu: Duration, job: &Job) -> Self {
        let module = match job {
            Job::Launch(l) => Some(l.module),
            Job::Copy(_) => None,
        };
        Suspended {
            context,
            gpu,
            module,
        }
    }
}

impl Worker {
    /// The worker's state, for a snapshot (called parked, under the register lock).
    pub(super) fn export(&self, r: &Regs) -> WorkerImage {
        let modules: Vec<ModuleImage> = self
            .modules
            .texts()
            .into_iter()
            .map(|(text, id)| ModuleImage {
                text,
                id,
                host_bytes: 0,
            })
            .collect();
        let mut suspended = Vec::new();
        let chans = self
            .chans
            .iter()
            .enumerate()
            .map(|(ch, rt)| {
                if r.chans.get(ch).map(|c| c.binding) != Some(rt.binding) {
                    // Belongs to an older binding: the next turn would drop it.
                    return None;
                }
                if let Some(s) = &rt.suspended {
                    suspended.push(SuspendedImage {
                        channel: ch as u32,
                        backend: self.engine.info().name.clone(),
                        gpu_ns: s.gpu.as_nanos() as u64,
                        module: s
                            .module
                            .and_then(|m| modules.iter().position(|x| x.id == m))
                            .map(|i| i as u32),
                        context: pgpu::SavedContext::from_bytes(s.context.to_bytes()),
                    });
                }
                // Outside a segment the position is stale (the next fetch resets it).
                let (calls, pos) = match rt.in_segment {
                    true => (rt.calls.clone(), rt.pos as u32),
                    false => (Vec::new(), 0),
                };
                Some(ChanImage {
                    methods: rt.methods.clone(),
                    calls,
                    pos,
                    in_segment: rt.in_segment,
                    decode_error: rt.decode_error,
                })
            })
            .collect();
        WorkerImage {
            seen_epoch: self.seen_epoch,
            next: self.next as u32,
            chans,
            modules,
            suspended,
        }
    }

    /// Takes back a restored state (validated by `snapshot`; modules already loaded).
    pub(super) fn import(&mut self, image: WorkerImage, r: &Regs) {
        self.seen_epoch = image.seen_epoch;
        self.next = image.next as usize % self.chans.len().max(1);
        for (ch, c) in image.chans.into_iter().enumerate().take(self.chans.len()) {
            let binding = r.chans.get(ch).map_or(0, |c| c.binding);
            self.chans[ch] = match c {
                Some(c) => ChanRt {
                    binding,
                    methods: c.methods,
                    calls: c.calls,
                    pos: c.pos as usize,
                    in_segment: c.in_segment,
                    decode_error: c.decode_error,
                    ..ChanRt::default()
                },
                None => ChanRt {
                    binding,
                    ..ChanRt::default()
                },
            };
        }
        let mut ids = Vec::with_capacity(image.modules.len());
        for m in image.modules {
            let bytes = m.host_bytes.saturating_add(m.text.len() as u64);
            if self.modules.text_of(m.id).is_some_and(|t| *t == *m.text) {
                // Cached already (a warm cache): the engine's extra load goes back, the entry
                // and its charge stay, and a suspended job in it keeps it (no second charge
                // that a tight budget could refuse).
                if let Err(e) = self.engine.unload_module(m.id) {
                    log::warn!("vgpu: unload module {:?}: {e}", m.id);
                }
                ids.push(Some(m.id));
            } else if self.budget.charge(Class::Module, bytes) {
                self.modules
                    .insert(&*self.engine, &m.text, m.id, bytes, &mut self.budget);
                self.budget.count(|s| &mut s.module_loads);
                ids.push(Some(m.id));
            } else {
                // Checked against the budget at restore; a later launch loads it again.
                if let Err(e) = self.engine.unload_module(m.id) {
                    log::warn!("vgpu: unload module {:?}: {e}", m.id);
                }
                ids.push(None);
            }
        }
        for s in image.suspended {
            if let Some(rt) = self.chans.get_mut(s.channel as usize) {
                rt.suspended = Some(Suspended {
                    context: s.context,
                    gpu: Duration::from_nanos(s.gpu_ns),
                    module: s
                        .module
                        .and_then(|i| ids.get(i as usize).copied().flatten()),
                });
            }
        }
        self.keep_suspended_modules();
    }
}
