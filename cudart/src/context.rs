//! The runtime's state over the driver: initialisation at the first call that needs the GPU
//! (never from a static constructor), one context per device (the device's primary context,
//! as NVIDIA's runtime uses, made current on each thread that calls; a created context where
//! the driver has no primary contexts), modules loaded lazily per fat binary and device at the
//! first launch or symbol access, and the handles the program was given (streams, events,
//! allocations) so that unknown ones are refused before they reach the driver.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_uint;
use std::sync::{Mutex, MutexGuard};

use crate::driver::{self, DevPtr, Driver, Handle};
use crate::error::*;
use crate::fatbin;
use crate::registry::Registry;

/// `cudaStreamLegacy` / `cudaStreamPerThread`: valid without being created.
pub const STREAM_LEGACY: usize = 1;
pub const STREAM_PER_THREAD: usize = 2;

/// What an address the program holds is, for `cudaMemcpyDefault` and `cudaPointerGetAttributes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Device,
    Host,
    Managed,
}

/// Per-device state.
#[derive(Default)]
struct Dev {
    /// The context (0 until first use).
    ctx: usize,
    /// Bumped by `cudaDeviceReset`, so threads bind the new context.
    generation: u64,
    /// `cudaSetDeviceFlags`.
    flags: c_uint,
    /// Loaded modules by fat binary index.
    modules: HashMap<usize, usize>,
    /// Resolved kernels by host stub address.
    functions: HashMap<usize, usize>,
}

#[derive(Default)]
struct State {
    /// The device count once initialised, or the initialisation error (kept, as NVIDIA's).
    init: Option<Result<i32, i32>>,
    devs: Vec<Dev>,
    /// Streams and events the program created, with their device.
    streams: HashMap<usize, i32>,
    events: HashMap<usize, i32>,
    /// Allocations the runtime made: start -> (length, kind).
    allocs: BTreeMap<u64, (u64, MemKind)>,
    /// Fat binaries whose "no usable code" line was already printed.
    told: Vec<usize>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static STATE: Mutex<Option<State>> = Mutex::new(None);

thread_local! {
    static CURRENT: Cell<i32> = const { Cell::new(0) };
    /// (device, generation, context) bound on this thread.
    static BOUND: Cell<(i32, u64, usize)> = const { Cell::new((-1, 0, 0)) };
}

/// Runs `f` on the registrations (a poisoned lock is taken over: the data stays consistent
/// because every update is a single insert/remove).
pub fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Registry::default))
}

fn state() -> StateGuard {
    StateGuard(STATE.lock().unwrap_or_else(|e| e.into_inner()))
}

struct StateGuard(MutexGuard<'static, Option<State>>);

impl StateGuard {
    fn get(&mut self) -> &mut State {
        self.0.get_or_insert_with(State::default)
    }
}

/// The driver, or `cudaErrorInsufficientDriver` when `libcuda.so.1` cannot be opened.
pub fn drv() -> Res<&'static Driver> {
    driver::driver().map_err(|_| CudaError(INSUFFICIENT_DRIVER))
}

/// Initialises the driver once; the number of devices.
pub fn device_count() -> Res<i32> {
    let mut g = state();
    let st = g.get();
    if st.init.is_none() {
        st.init = Some(init_driver());
        if let Some(Ok(n)) = st.init {
            st.devs = (0..n).map(|_| Dev::default()).collect();
        }
    }
    st.init.unwrap_or(Err(NO_DEVICE)).map_err(CudaError)
}

fn init_driver() -> Result<i32, i32> {
    let d = drv().map_err(|e| e.0)?;
    // SAFETY: cuInit takes flags 0.
    cu(unsafe { d.init(0) }).map_err(|e| e.0)?;
    let mut n = 0;
    // SAFETY: `n` is a valid int for the count.
    cu(unsafe { d.device_get_count(&mut n) }).map_err(|e| e.0)?;
    if n <= 0 { Err(NO_DEVICE) } else { Ok(n) }
}

/// The calling thread's device (`cudaGetDevice`).
pub fn current_device() -> i32 {
    CURRENT.with(|c| c.get())
}

/// Checks `dev` against the device count.
pub fn check_device(dev: i32) -> Res {
    if dev < 0 || dev >= device_count()? {
        fail(INVALID_DEVICE)
    } else {
        Ok(())
    }
}

/// Makes `dev` the calling thread's device and initialises its context (`cudaSetDevice`).
pub fn set_device(dev: i32) -> Res {
    check_device(dev)?;
    CURRENT.with(|c| c.set(dev));
    ctx().map(|_| ())
}

/// Ensures the calling thread's device has a context, current on this thread; the driver.
pub fn ctx() -> Res<&'static Driver> {
    let dev = current_device();
    check_device(dev)?;
    let d = drv()?;
    let mut g = state();
    let st = g.get();
    let ds = &mut st.devs[dev as usize];
    let fresh = ds.ctx == 0;
    if fresh {
        let mut c: Handle = std::ptr::null_mut();
        if d.has("cuDevicePrimaryCtxRetain") {
            // SAFETY: `c` receives the context; `dev` was checked against the count.
            cu(unsafe { d.primary_ctx_retain(&mut c, dev) })?;
        } else {
            // SAFETY: as above; no creation parameters (null), the program's flags.
            cu(unsafe { d.ctx_create(&mut c, std::ptr::null_mut(), ds.flags, dev) })?;
        }
        ds.ctx = c as usize;
    }
    let want = (dev, ds.generation, ds.ctx);
    if BOUND.with(|b| b.get()) != want {
        // SAFETY: `ds.ctx` is a live context of this driver.
        cu(unsafe { d.ctx_set_current(ds.ctx as Handle) })?;
        BOUND.with(|b| b.set(want));
    }
    drop(g);
    if fresh && eager_loading() {
        // A failure here is reported where the module is used (its kernel's launch), as with
        // lazy loading; the one line about unusable code is printed once either way.
        for idx in with_registry(|r| r.fatbins_with_kernels()) {
            let _ = module(d, idx);
        }
    }
    Ok(d)
}

/// Whether a new context loads every registered module with kernels at once (CUDA's
/// `CUDA_MODULE_LOADING=EAGER`, this runtime's default, so that JIT compilation is paid at
/// initialisation and not inside a program's first timed launch) or at first use (`LAZY`).
fn eager_loading() -> bool {
    static EAGER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EAGER.get_or_init(|| {
        std::env::var("CUDA_MODULE_LOADING").map_or(true, |v| !v.eq_ignore_ascii_case("lazy"))
    })
}

/// `cudaSetDeviceFlags`: remembered for the device and given to its primary context.
pub fn set_flags(flags: c_uint) -> Res {
    let dev = current_device();
    check_device(dev)?;
    let d = drv()?;
    if d.has("cuDevicePrimaryCtxSetFlags_v2") {
        // CU_CTX_MAP_HOST (8) is always on and not a scheduling flag the driver needs.
        // SAFETY: plain values.
        cu(unsafe { d.primary_ctx_set_flags(dev, flags & !8) })?;
    }
    state().get().devs[dev as usize].flags = flags;
    Ok(())
}

/// `cudaGetDeviceFlags`.
pub fn flags() -> Res<c_uint> {
    let dev = current_device();
    check_device(dev)?;
    Ok(state().get().devs[dev as usize].flags | 8)
}

/// `cudaDeviceReset`: the device's context goes (primary reset, or destroyed), with its modules,
/// kernels, streams, events and allocations; the next call makes a fresh one.
pub fn reset() -> Res {
    let dev = current_device();
    check_device(dev)?;
    let d = drv()?;
    let mut g = state();
    let st = g.get();
    let ds = &mut st.devs[dev as usize];
    if ds.ctx != 0 {
        if d.has("cuDevicePrimaryCtxRetain") {
            // SAFETY: plain device ordinal.
            cu(unsafe { d.primary_ctx_reset(dev) })?;
        } else {
            // SAFETY: the context this runtime created.
            cu(unsafe { d.ctx_destroy(ds.ctx as Handle) })?;
        }
    }
    ds.ctx = 0;
    ds.generation += 1;
    ds.modules.clear();
    ds.functions.clear();
    st.streams.retain(|_, d| *d != dev);
    st.events.retain(|_, d| *d != dev);
    st.allocs.retain(|_, (_, k)| *k == MemKind::Host);
    Ok(())
}

/// The loaded module of fat binary `idx` on the current device, loading it at first use.
pub fn module(d: &Driver, idx: usize) -> Res<Handle> {
    let dev = current_device() as usize;
    if let Some(&m) = state().get().devs[dev].modules.get(&idx) {
        return Ok(m as Handle);
    }
    let image =
        with_registry(|r| r.fatbin(idx).map(|f| f.image)).ok_or(CudaError(INVALID_KERNEL_IMAGE))?;
    if image == 0 {
        return fail(INVALID_KERNEL_IMAGE);
    }
    let mut m: Handle = std::ptr::null_mut();
    let (r, log) = load(d, &mut m, image);
    if let Err(e) = cu(r) {
        tell_no_code(idx, image, e.0, &log);
        return Err(e);
    }
    let mut g = state();
    let st = g.get();
    // Another thread may have loaded it meanwhile: keep one, unload ours.
    if let Some(&other) = st.devs[dev].modules.get(&idx) {
        // SAFETY: `m` was just loaded and is not used elsewhere.
        unsafe { d.module_unload(m) };
        return Ok(other as Handle);
    }
    st.devs[dev].modules.insert(idx, m as usize);
    Ok(m)
}

/// Loads a fat binary: with the driver's error log where it takes load options (what a JIT
/// refused, say), else plainly. The result and the log's text.
fn load(d: &Driver, m: &mut Handle, image: usize) -> (driver::CuResult, String) {
    if !d.has("cuModuleLoadDataEx") {
        // SAFETY: `image` is the registered fat binary in the program's image (checked magic).
        return (
            unsafe { d.module_load_data(m, image as *const _) },
            String::new(),
        );
    }
    let mut log = vec![0u8; 4096];
    let mut options = [
        driver::CU_JIT_ERROR_LOG_BUFFER,
        driver::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut std::ffi::c_void; 2] =
        [log.as_mut_ptr().cast(), (log.len() - 1) as *mut _];
    // SAFETY: as above; the log buffer outlives the call and its size is passed (one byte kept
    // for the NUL), the option arrays hold two entries.
    let r = unsafe {
        d.module_load_data_ex(
            m,
            image as *const _,
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    (
        r,
        String::from_utf8_lossy(&log[..end])
            .trim()
            .replace('\n', "; "),
    )
}

/// The one line for a program whose GPU code the driver cannot use.
fn tell_no_code(idx: usize, image: usize, code: i32, log: &str) {
    if ![
        NO_KERNEL_IMAGE_FOR_DEVICE,
        INVALID_PTX,
        UNSUPPORTED_PTX_VERSION,
        INVALID_KERNEL_IMAGE,
    ]
    .contains(&code)
    {
        return;
    }
    {
        let mut g = state();
        let st = g.get();
        if st.told.contains(&idx) {
            return;
        }
        st.told.push(idx);
    }
    // SAFETY: `image` is a registered fat binary (magic checked at registration).
    let bytes = unsafe {
        std::slice::from_raw_parts(image as *const u8, fatbin::image_len(image as *const u8))
    };
    let prog = std::fs::read_link("/proc/self/exe")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "this program".into());
    let log = if log.is_empty() {
        format!(": {}", message(code))
    } else {
        format!(": {log}")
    };
    crate::error::say!(
        "libcudart: {prog}: the GPU has no usable code in this program (found: {}; the driver says {}{log}); rebuild it with PTX the driver accepts, e.g. nvcc -gencode arch=compute_80,code=compute_80",
        fatbin::describe(&fatbin::entries(bytes)),
        name(code),
    );
}

/// The driver's kernel for a registered host stub on the current device.
pub fn function(d: &Driver, host: usize) -> Res<Handle> {
    let dev = current_device() as usize;
    if let Some(&f) = state().get().devs[dev].functions.get(&host) {
        return Ok(f as Handle);
    }
    let (idx, name) = with_registry(|r| r.function(host).map(|f| (f.fatbin, f.name.clone())))
        .ok_or(CudaError(INVALID_DEVICE_FUNCTION))?;
    let m = module(d, idx)?;
    let mut f: Handle = std::ptr::null_mut();
    // SAFETY: `m` is a loaded module, `name` a C string.
    cu(unsafe { d.module_get_function(&mut f, m, name.as_ptr()) })?;
    state().get().devs[dev].functions.insert(host, f as usize);
    Ok(f)
}

/// The device address and size of a registered variable (by its host shadow address).
pub fn symbol(d: &Driver, host: usize) -> Res<(DevPtr, usize)> {
    let (idx, name) = with_registry(|r| r.var(host).map(|v| (v.fatbin, v.name.clone())))
        .ok_or(CudaError(INVALID_SYMBOL))?;
    let m = module(d, idx)?;
    let (mut p, mut n) = (0, 0);
    // SAFETY: `m` is a loaded module, `name` a C string, outputs are locals.
    cu(unsafe { d.module_get_global(&mut p, &mut n, m, name.as_ptr()) })?;
    Ok((p, n))
}

/// Records a stream or event the program was given.
pub fn add_handle(stream: bool, h: Handle) {
    let dev = current_device();
    let mut g = state();
    let st = g.get();
    if stream {
        st.streams.insert(h as usize, dev)
    } else {
        st.events.insert(h as usize, dev)
    };
}

/// Forgets a stream or event; `cudaErrorInvalidResourceHandle` if it was not known.
pub fn remove_handle(stream: bool, h: Handle) -> Res {
    let mut g = state();
    let st = g.get();
    let set = if stream {
        &mut st.streams
    } else {
        &mut st.events
    };
    set.remove(&(h as usize))
        .map(|_| ())
        .ok_or(CudaError(INVALID_RESOURCE_HANDLE))
}

/// Checks a stream the program passes: the default streams or one it created.
pub fn check_stream(h: Handle) -> Res<Handle> {
    let s = h as usize;
    if s == 0
        || s == STREAM_LEGACY
        || s == STREAM_PER_THREAD
        || state().get().streams.contains_key(&s)
    {
        Ok(h)
    } else {
        fail(INVALID_RESOURCE_HANDLE)
    }
}

/// Checks an event the program passes.
pub fn check_event(h: Handle) -> Res<Handle> {
    if state().get().events.contains_key(&(h as usize)) {
        Ok(h)
    } else {
        fail(INVALID_RESOURCE_HANDLE)
    }
}

/// Records an allocation.
pub fn add_alloc(start: u64, len: u64, kind: MemKind) {
    state().get().allocs.insert(start, (len.max(1), kind));
}

/// Forgets an allocation by its start; its kind, if it was one.
pub fn remove_alloc(start: u64) -> Option<MemKind> {
    state().get().allocs.remove(&start).map(|(_, k)| k)
}

/// What the runtime knows of `addr`: (allocation start, kind), if inside one of its allocations.
pub fn find_alloc(addr: u64) -> Option<(u64, MemKind)> {
    let mut g = state();
    let (&start, &(len, kind)) = g.get().allocs.range(..=addr).next_back()?;
    (addr - start < len).then_some((start, kind))
}

/// Where `addr` lives: the runtime's own allocations first, then the driver's pointer
/// attributes (symbols, memory the program got elsewhere), else host memory.
pub fn classify(d: &Driver, addr: u64) -> MemKind {
    if let Some((_, k)) = find_alloc(addr) {
        return k;
    }
    let mut t: c_uint = 0;
    // SAFETY: `t` receives a CUmemorytype (unsigned int).
    match unsafe {
        d.pointer_get_attribute(
            (&mut t as *mut c_uint).cast(),
            driver::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            addr,
        )
    } {
        0 if t == driver::CU_MEMORYTYPE_DEVICE => MemKind::Device,
        0 if t == driver::CU_MEMORYTYPE_UNIFIED => MemKind::Managed,
        _ => MemKind::Host,
    }
}
