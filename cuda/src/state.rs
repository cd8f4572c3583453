//! Process-global state of the driver API: made lazily at `cuInit`, behind one lock (calls
//! from several threads are serialised; work goes to each context's one in-order queue, so
//! every stream of a context is that queue: legal in CUDA, streams only *may* overlap).
//!
//! Handles given to the program (`CUcontext`, `CUmodule`, `CUfunction`, `CUstream`,
//! `CUevent`) are numbers from one counter, looked up in a table per kind: a handle of another
//! kind, a stale or a made-up one is `CUDA_ERROR_INVALID_HANDLE` / `INVALID_CONTEXT`, never a
//! dereference. Each thread has its own context stack (the top is its current context).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::backend::{self, BackendKind};
use crate::device::{DevPtr, Device, DeviceError, DeviceInfo, Marker, ModuleId};
use crate::result::*;

/// The one device this library shows (ordinal 0).
pub struct Init {
    pub kind: BackendKind,
    pub info: DeviceInfo,
    /// The device opened by `cuInit`, for the first context.
    pub spare: Option<Box<dyn Device>>,
}

/// A host buffer from `cuMemHostAlloc` / `cuMemAllocHost`.
#[derive(Clone, Copy, Debug)]
pub struct HostRec {
    pub dev: DevPtr,
    pub len: u64,
    pub flags: u32,
    /// `cuMemAllocManaged` memory (the host address is the device address).
    pub managed: bool,
}

/// One context.
pub struct Ctx {
    pub dev: Box<dyn Device>,
    /// The sticky error that ended the context, if any.
    pub sticky: Option<CUresult>,
    /// Device allocations: base → length.
    pub allocs: BTreeMap<DevPtr, u64>,
    /// Host buffers: host address → record.
    pub host: BTreeMap<usize, HostRec>,
    /// Module variables the program asked for (`cuModuleGetGlobal`): address → size.
    pub globals: BTreeMap<DevPtr, u64>,
    /// `cuMemHostRegister`ed ranges: start → length.
    pub registered: BTreeMap<usize, usize>,
    pub flags: u32,
    pub primary: bool,
}

impl Ctx {
    /// Runs a device call, recording a sticky error for the context.
    pub fn dev_call<T>(
        &mut self,
        f: impl FnOnce(&mut dyn Device) -> Result<T, DeviceError>,
    ) -> Result<T, CUresult> {
        if let Some(e) = self.sticky {
            return Err(e);
        }
        f(self.dev.as_mut()).map_err(|e| {
            let code = from_device(&e);
            if e.is_sticky() || is_sticky(code) {
                log::error!("libcuda: the context is lost: {e}");
                eprintln!("libcuda (vgpu): {e}");
                self.sticky = Some(code);
            } else {
                log::warn!("libcuda: {e}");
            }
            code
        })
    }

    /// The device range `[ptr, ptr + len)` lies in one allocation (device memory, or a host
    /// buffer's device mapping).
    pub fn check_dev(&self, ptr: DevPtr, len: u64) -> Result<(), CUresult> {
        let end = ptr.checked_add(len).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let within = |m: &BTreeMap<DevPtr, u64>| {
            m.range(..=ptr)
                .next_back()
                .is_some_and(|(&b, &l)| end <= b + l)
        };
        let in_alloc = within(&self.allocs) || within(&self.globals);
        let in_host = self
            .host
            .values()
            .any(|h| ptr >= h.dev && end <= h.dev + h.len);
        if in_alloc || in_host {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }

    /// The host buffer holding host address `p`: (its start, record).
    pub fn host_buf(&self, p: usize) -> Option<(usize, HostRec)> {
        self.host
            .range(..=p)
            .next_back()
            .filter(|(b, h)| p < *b + h.len as usize)
            .map(|(b, h)| (*b, *h))
    }
}

/// A loaded module.
pub struct ModuleRec {
    pub ctx: u64,
    pub id: ModuleId,
    pub entries: HashMap<String, ptx::EntryInfo>,
    /// Variables handed out by `cuModuleGetGlobal` (forgotten at unload).
    pub globals: Vec<DevPtr>,
}

/// A kernel of a module.
pub struct FuncRec {
    pub ctx: u64,
    pub module: u64,
    pub entry: String,
    pub info: ptx::EntryInfo,
    pub max_dynamic_shared: u32,
}

/// An event.
pub struct EventRec {
    pub ctx: u64,
    pub flags: u32,
    pub marker: Option<Marker>,
}

/// The primary context of the device.
#[derive(Default)]
pub struct Primary {
    pub ctx: Option<u64>,
    pub refs: u32,
    pub flags: u32,
}

/// Everything, behind [`lock`].
#[derive(Default)]
pub struct Global {
    pub init: Option<Result<Init, CUresult>>,
    pub contexts: HashMap<u64, Ctx>,
    pub modules: HashMap<u64, ModuleRec>,
    pub functions: HashMap<u64, FuncRec>,
    pub streams: HashMap<u64, u64>,
    /// Flags of the created streams (`cuStreamGetFlags`).
    pub stream_flags: HashMap<u64, u32>,
    pub events: HashMap<u64, EventRec>,
    pub primary: Primary,
    next: u64,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

thread_local! {
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The global state, locked (a panic that poisoned the lock does not stop later calls).
pub fn lock() -> MutexGuard<'static, Option<Global>> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// This thread's current context handle (0: none).
pub fn current() -> u64 {
    STACK.with(|s| s.borrow().last().copied().unwrap_or(0))
}

/// Replaces the top of this thread's stack (`cuCtxSetCurrent`); 0 pops it.
pub fn set_current(ctx: u64) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if ctx != 0 {
            s.push(ctx);
        }
    });
}

pub fn push_current(ctx: u64) {
    STACK.with(|s| s.borrow_mut().push(ctx));
}

pub fn pop_current() -> Option<u64> {
    STACK.with(|s| s.borrow_mut().pop())
}

impl Global {
    /// A new handle (never 0, never reused).
    pub fn handle(&mut self) -> u64 {
        self.next += 0x10;
        0x7600_0000 + self.next
    }

    /// `cuInit`: chooses the backend and opens the device once.
    pub fn initialize(&mut self) -> CUresult {
        if let Some(r) = &self.init {
            return r.as_ref().map(|_| CUDA_SUCCESS).unwrap_or_else(|e| *e);
        }
        let t = Instant::now();
        let r = backend::choose().and_then(|kind| {
            crate::stats::init_started(kind.name());
            backend::open(kind).map(|dev| Init {
                kind,
                info: dev.info().clone(),
                spare: Some(dev),
            })
        });
        let r = r.map_err(|e| {
            eprintln!("libcuda (vgpu): cuInit: {e}");
            from_device(&e)
        });
        log::debug!("cuInit took {:?}", t.elapsed());
        let code = r.as_ref().map(|_| CUDA_SUCCESS).unwrap_or_else(|e| *e);
        self.init = Some(r);
        code
    }

    /// The device, after a successful `cuInit`.
    pub fn inited(&self) -> Result<&Init, CUresult> {
        match &self.init {
            Some(Ok(i)) => Ok(i),
            Some(Err(_)) | None => Err(CUDA_ERROR_NOT_INITIALIZED),
        }
    }

    /// A new context on device 0.
    pub fn create_context(&mut self, flags: u32, primary: bool) -> Result<u64, CUresult> {
        let kind = self.inited()?.kind;
        let spare = self
            .init
            .as_mut()
            .and_then(|i| i.as_mut().ok()?.spare.take());
        let dev = match spare {
            Some(d) => d,
            None => backend::open(kind).map_err(|e| {
                eprintln!("libcuda (vgpu): context: {e}");
                match e {
                    DeviceError::NoDevice(_) => CUDA_ERROR_OUT_OF_MEMORY,
                    e => from_device(&e),
                }
            })?,
        };
        let h = self.handle();
        self.contexts.insert(
            h,
            Ctx {
                dev,
                sticky: None,
                allocs: BTreeMap::new(),
                host: BTreeMap::new(),
                globals: BTreeMap::new(),
                registered: BTreeMap::new(),
                flags,
                primary,
            },
        );
        crate::stats::context_ready();
        Ok(h)
    }

    /// Destroys a context and everything in it.
    pub fn destroy_context(&mut self, h: u64) -> Result<(), CUresult> {
        let ctx = self.contexts.remove(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        self.modules.retain(|_, m| m.ctx != h);
        self.functions.retain(|_, f| f.ctx != h);
        self.streams.retain(|_, c| *c != h);
        let streams = &self.streams;
        self.stream_flags.retain(|s, _| streams.contains_key(s));
        self.events.retain(|_, e| e.ctx != h);
        if self.primary.ctx == Some(h) {
            self.primary.ctx = None;
            self.primary.refs = 0;
        }
        drop(ctx);
        STACK.with(|s| s.borrow_mut().retain(|&c| c != h));
        if self.contexts.is_empty() {
            crate::stats::write();
        }
        Ok(())
    }

    /// The context a handle names (0: this thread's current one), checked for a sticky error.
    pub fn ctx(&mut self, h: u64) -> Result<(u64, &mut Ctx), CUresult> {
        self.inited()?;
        let h = if h == 0 { current() } else { h };
        let ctx = self
            .contexts
            .get_mut(&h)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if let Some(e) = ctx.sticky {
            return Err(e);
        }
        Ok((h, ctx))
    }

    /// The current context (`CUDA_ERROR_INVALID_CONTEXT` without one).
    pub fn cur(&mut self) -> Result<(u64, &mut Ctx), CUresult> {
        self.inited()?;
        if current() == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        self.ctx(0)
    }

    /// The context a stream belongs to (0 and the legacy/per-thread handles: the current
    /// context).
    pub fn stream_ctx(&mut self, stream: u64) -> Result<(u64, &mut Ctx), CUresult> {
        if matches!(stream, 0..=2) {
            return self.cur();
        }
        let c = *self.streams.get(&stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.ctx(c)
    }
}

/// Runs `f` on the global state, made on first use.
pub fn with<R>(f: impl FnOnce(&mut Global) -> R) -> R {
    let mut g = lock();
    f(g.get_or_insert_with(Global::default))
}

/// [`with`] for a body that returns a driver result (most API calls).
pub fn try_with<T>(f: impl FnOnce(&mut Global) -> Result<T, CUresult>) -> Result<T, CUresult> {
    with(f)
}
