//! The CUDA driver itself: the symbol table, the loader, error codes, primary contexts, the
//! contexts other libraries made, and what a fork leaves of it. The typed calls over it are in
//! the sibling files; `mod.rs` only declares them and hands their names on.

use crate::error::{Error, Result, Status};
use crate::prim::fork::lock;
use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUmem_advise, CUmemAccessDesc,
    CUmemAllocationGranularity_flags, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemLocation, CUmemLocationType, CUpointer_attribute, CUstream,
};
use libloading::os::unix::Library;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

/// A driver return code.
pub type CuResult = c_int;

pub(crate) const CUDA_SUCCESS: CuResult = 0;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub(crate) const CUDA_ERROR_STUB_LIBRARY: CuResult = 34;
pub(crate) const CUDA_ERROR_INSUFFICIENT_DRIVER: CuResult = 35;
pub(crate) const CUDA_ERROR_NO_DEVICE: CuResult = 100;
pub(crate) const CUDA_ERROR_NOT_READY: CuResult = 600;

/// Library names tried, in order.
pub(crate) const LIB_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

macro_rules! driver_table {
    ($( $field:ident : fn($($arg:ty),*) ; )* ; optional: $( $ofield:ident : fn($($oarg:ty),*) ; )*) => {
        /// The resolved entry points. Required ones are plain function pointers; optional ones
        /// (absent from older drivers) are `Option`s.
        #[allow(non_snake_case)]
        pub(super) struct Driver {
            _lib: libloading::Library,
            /// The fork depth it was loaded at (`prim::fork::depth`): seen at another depth, it
            /// was loaded by an ancestor before a `fork()`, and CUDA is unusable here.
            depth: u32,
            $( pub(super) $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
            $( pub(super) $ofield: Option<unsafe extern "C" fn($($oarg),*) -> CuResult>, )*
        }

        impl Driver {
            #[allow(non_snake_case)]
            fn load(lib: libloading::Library) -> std::result::Result<Driver, String> {
                // SAFETY: each symbol is looked up by its documented C name and typed with the
                // signature from cuda.h (through cudarc's types); the pointer is copied out
                // while `lib` is kept alive in the same struct.
                unsafe {
                    $( let $field = *lib
                        .get::<unsafe extern "C" fn($($arg),*) -> CuResult>(concat!(stringify!($field), "\0").as_bytes())
                        .map_err(|e| format!("libcuda lacks {}: {e}", stringify!($field)))?; )*
                    $( let $ofield = lib
                        .get::<unsafe extern "C" fn($($oarg),*) -> CuResult>(concat!(stringify!($ofield), "\0").as_bytes())
                        .ok()
                        .map(|s| *s); )*
                    Ok(Driver { _lib: lib, depth: crate::prim::fork::depth(), $($field,)* $($ofield,)* })
                }
            }
        }
    };
}

driver_table! {
    cuInit: fn(c_uint);
    cuDriverGetVersion: fn(*mut c_int);
    cuDeviceGetCount: fn(*mut c_int);
    cuDeviceGet: fn(*mut CUdevice, c_int);
    cuDeviceGetName: fn(*mut c_char, c_int, CUdevice);
    cuDeviceGetAttribute: fn(*mut c_int, CUdevice_attribute, CUdevice);
    cuDeviceTotalMem_v2: fn(*mut usize, CUdevice);
    cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice);
    cuCtxPushCurrent_v2: fn(CUcontext);
    cuCtxPopCurrent_v2: fn(*mut CUcontext);
    cuMemAlloc_v2: fn(*mut CUdeviceptr, usize);
    cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint);
    cuMemFree_v2: fn(CUdeviceptr);
    cuMemHostRegister_v2: fn(*mut c_void, usize, c_uint);
    cuMemHostUnregister: fn(*mut c_void);
    cuMemGetInfo_v2: fn(*mut usize, *mut usize);
    cuStreamSynchronize: fn(CUstream);
    cuCtxSynchronize: fn();
    cuStreamWaitEvent: fn(CUstream, CUevent, c_uint);
    cuEventCreate: fn(*mut CUevent, c_uint);
    cuEventRecord: fn(CUevent, CUstream);
    cuEventQuery: fn(CUevent);
    cuEventSynchronize: fn(CUevent);
    cuEventDestroy_v2: fn(CUevent);
    cuPointerGetAttributes: fn(c_uint, *mut CUpointer_attribute, *mut *mut c_void, CUdeviceptr);
    cuGetErrorName: fn(CuResult, *mut *const c_char);
    cuStreamCreate: fn(*mut CUstream, c_uint);
    ;
    optional:
    cuCtxGetDevice: fn(*mut CUdevice);
    cuDevicePrimaryCtxGetState: fn(CUdevice, *mut c_uint, *mut c_int);
    cuDeviceCanAccessPeer: fn(*mut c_int, CUdevice, CUdevice);
    cuMemPrefetchAsync_v2: fn(CUdeviceptr, usize, CUmemLocation, c_uint, CUstream);
    cuMemAdvise_v2: fn(CUdeviceptr, usize, CUmem_advise, CUmemLocation);
    // Virtual memory management (CUDA 10.2+).
    cuMemGetAllocationGranularity: fn(*mut usize, *const CUmemAllocationProp, CUmemAllocationGranularity_flags);
    cuMemAddressReserve: fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
    cuMemAddressFree: fn(CUdeviceptr, usize);
    cuMemCreate: fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64);
    cuMemRelease: fn(CUmemGenericAllocationHandle);
    cuMemMap: fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64);
    cuMemUnmap: fn(CUdeviceptr, usize);
    cuMemSetAccess: fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize);
    // Managed-memory residency in batches (CUDA 13).
    cuMemDiscardBatchAsync: fn(*mut CUdeviceptr, *mut usize, usize, u64, CUstream);
    cuMemDiscardAndPrefetchBatchAsync: fn(*mut CUdeviceptr, *mut usize, usize, *mut CUmemLocation, *mut usize, usize, u64, CUstream);
}

/// The driver, or why there is none.
static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// Serialises loading the driver, so that it is never half loaded when the process forks
/// (`fork_lock_load`). Primary contexts are retained without it (see `primary_context`).
static LOAD: Mutex<()> = Mutex::new(());

/// Fork: the loader lock (early in the order: probing nests it inside the allocator's init).
pub(crate) fn fork_lock_load(held: &mut crate::prim::fork::Held) {
    held.push(lock(&LOAD));
}

/// Whether the configuration says to behave as if no CUDA driver were installed
/// (`UMP_ALLOC_NO_CUDA=1`), asked each time the driver would be loaded. The crate root sets it
/// when the library loads (its `.init_array` constructor, which runs in the shared library and
/// in every test binary built from this crate), to the configuration table's reading of the
/// variable: this layer reads no setting itself. A build whose constructor did not run would
/// leave it unset and load the driver: debug builds stop there.
static DISABLED: OnceLock<fn() -> bool> = OnceLock::new();

/// Set the question [`DISABLED`] asks (once; later calls change nothing).
pub fn set_disabled_check(check: fn() -> bool) {
    let _ = DISABLED.set(check);
}

fn open_driver() -> std::result::Result<Driver, String> {
    debug_assert!(
        DISABLED.get().is_some(),
        "the crate root's load-time constructor did not run (UMP_ALLOC_NO_CUDA unread)"
    );
    if DISABLED.get().is_some_and(|disabled| disabled()) {
        return Err("UMP_ALLOC_NO_CUDA=1".into());
    }
    let mut tried = Vec::new();
    let lib = LIB_NAMES.iter().find_map(|name| {
        // SAFETY: loading libcuda runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(*name) } {
            Ok(l) => Some(l),
            Err(e) => {
                tried.push(format!("{name}: {e}"));
                None
            }
        }
    });
    let lib = lib.ok_or_else(|| format!("no CUDA driver library ({})", tried.join("; ")))?;
    let d = Driver::load(lib)?;
    // libcuda may register fork handlers of its own: ours must run first (see
    // fork::at_fork_again).
    crate::prim::fork::at_fork_again();
    // SAFETY: cuInit has no preconditions.
    let rc = unsafe { (d.cuInit)(0) };
    match rc {
        CUDA_SUCCESS => Ok(d),
        CUDA_ERROR_STUB_LIBRARY => {
            Err("libcuda is the toolkit's stub library, not a driver".into())
        }
        CUDA_ERROR_NO_DEVICE => Err("the CUDA driver reports no device".into()),
        CUDA_ERROR_INSUFFICIENT_DRIVER => Err("the CUDA driver is too old".into()),
        other => Err(format!("cuInit failed with CUDA error {other}")),
    }
}

/// Whether this is a `fork()` child of a process that had loaded the CUDA driver (CUDA is
/// unusable here). CUDA state does not survive fork (a child touching managed memory dies, and
/// driver calls fail), so no call reaches the driver there. A child of a process that never
/// loaded it may, as a new process would.
pub fn fork_poisoned() -> bool {
    matches!(DRIVER.get(), Some(Ok(d)) if d.depth != crate::prim::fork::depth())
}

pub(super) fn driver() -> Result<&'static Driver> {
    if fork_poisoned() {
        return Err(Error::unsupported(
            "CUDA cannot be used in a fork() child of a process that used it; start workers \
             with multiprocessing's 'spawn' or 'forkserver' method (or torch's)",
        ));
    }
    let d = match DRIVER.get() {
        Some(d) => d,
        None => {
            let _g = lock(&LOAD);
            DRIVER.get_or_init(open_driver)
        }
    };
    d.as_ref()
        .map_err(|why| Error::unsupported(format!("CUDA is not available: {why}")))
}

/// Whether a CUDA driver with at least one device is loaded and initialised (and this is not
/// a `fork()` child).
pub fn available() -> bool {
    driver().is_ok()
}

pub(super) fn err_name(d: &Driver, rc: CuResult) -> String {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or fails for unknown codes.
    let ok = unsafe { (d.cuGetErrorName)(rc, &mut p) } == CUDA_SUCCESS && !p.is_null();
    if ok {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("CUDA error {rc}")
    }
}

pub(super) fn check(d: &Driver, rc: CuResult, what: &str) -> Result<()> {
    match rc {
        CUDA_SUCCESS => Ok(()),
        CUDA_ERROR_OUT_OF_MEMORY => Err(Error::oom(format!("{what}: {}", err_name(d, rc)))),
        _ => Err(Error::new(
            Status::UMP_ERR_CUDA,
            format!("{what}: {}", err_name(d, rc)),
        )),
    }
}

/// Primary contexts, retained once per device and kept for the life of the process (CuPy and
/// PyTorch use the same ones through the runtime API).
static CONTEXTS: OnceLock<Vec<OnceLock<usize>>> = OnceLock::new();

fn primary_context(d: &Driver, device: i32) -> Result<CUcontext> {
    let slots = CONTEXTS.get_or_init(|| (0..device_count(d)).map(|_| OnceLock::new()).collect());
    let slot = crate::error::device_slot(slots, device)?;
    if let Some(&c) = slot.get() {
        return Ok(c as CUcontext);
    }
    // No lock of ours is held here, and none is waited for: pools call this with their own
    // locks held (a chunk is mapped under them), and `fork`'s prepare takes those after the
    // loader lock, so taking the loader lock here could deadlock with a fork. Two threads may
    // both retain the context; the second reference is kept, as the first is, for the life of
    // the process. A fork in the middle leaves nothing half done that its child uses: a fork
    // child of a process with the driver loaded makes no driver call (`fork_poisoned`).
    let mut dev: CUdevice = 0;
    // SAFETY: valid out-pointer; ordinal checked above.
    check(
        d,
        unsafe { (d.cuDeviceGet)(&mut dev, device) },
        "cuDeviceGet",
    )?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer and device handle.
    check(
        d,
        unsafe { (d.cuDevicePrimaryCtxRetain)(&mut ctx, dev) },
        "cuDevicePrimaryCtxRetain",
    )?;
    let _ = slot.set(ctx as usize);
    Ok(slot.get().map_or(ctx, |&c| c as CUcontext))
}

/// Whether this machine has NVIDIA GPU device nodes (`/dev/nvidiactl`), asked without loading
/// the driver: a process that may use a GPU, but need not load CUDA until it does.
pub fn device_nodes_present() -> bool {
    std::path::Path::new("/dev/nvidiactl").exists()
}

type CountFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type GetFn = unsafe extern "C" fn(*mut CUdevice, c_int) -> CuResult;
type StateFn = unsafe extern "C" fn(CUdevice, *mut c_uint, *mut c_int) -> CuResult;

/// The three calls asked of a driver another library loaded, kept once found (the library
/// stays loaded: `lib` holds a reference), so that each question costs no look into the
/// dynamic loader's tables.
struct Foreign {
    _lib: Library,
    /// The fork depth it was found at (`prim::fork::depth`): a fork child does not ask it.
    depth: u32,
    count: CountFn,
    get: GetFn,
    state: StateFn,
}

static FOREIGN: OnceLock<Foreign> = OnceLock::new();

/// The driver another library loaded in this process, found without loading it; None where
/// none is loaded yet (asked again next time), or in a fork child of the process that found
/// it (CUDA is unusable there).
fn foreign_driver() -> Option<&'static Foreign> {
    if let Some(f) = FOREIGN.get() {
        return (f.depth == crate::prim::fork::depth()).then_some(f);
    }
    let lib = LIB_NAMES.iter().find_map(|name| {
        // SAFETY: RTLD_NOLOAD only looks the library up: nothing is loaded or initialised.
        unsafe { Library::open(Some(*name), libc::RTLD_NOLOAD | libc::RTLD_LAZY) }.ok()
    })?;
    // SAFETY: the driver's documented C names, typed as in cuda.h; the pointers are used only
    // while `lib`, kept with them, holds its reference.
    let (count, get, state) = unsafe {
        (
            *lib.get::<CountFn>(b"cuDeviceGetCount\0").ok()?,
            *lib.get::<GetFn>(b"cuDeviceGet\0").ok()?,
            *lib.get::<StateFn>(b"cuDevicePrimaryCtxGetState\0").ok()?,
        )
    };
    let depth = crate::prim::fork::depth();
    // A racing thread's find is as good: the one not kept drops its reference.
    Some(FOREIGN.get_or_init(|| Foreign {
        _lib: lib,
        depth,
        count,
        get,
        state,
    }))
}

/// The first device whose primary context another library (PyTorch, CuPy, Numba) made, asked
/// of the driver that library loaded without initialising it: `cuInit` is the one call that
/// must not happen here, since a fork child of a process that called it cannot use CUDA
/// (PyTorch's `test_is_pinned_no_context`: a parent that only asked `is_pinned` must leave its
/// fork children a working GPU). Before anyone's `cuInit` the driver answers
/// `CUDA_ERROR_NOT_INITIALIZED`, and no context can exist. None: the driver is not loaded, not
/// initialised, or no primary context is active.
fn foreign_context_device() -> Option<i32> {
    let f = foreign_driver()?;
    // Not initialised (no count): no context can exist.
    (0..count_devices(f.count)?).find(|&i| primary_state(f.get, f.state, i) == Some(true))
}

/// The first device whose primary context is active (made by anyone in this process: CuPy,
/// PyTorch, ump-alloc), read without making one and without initialising the driver. None
/// when none is, without a driver, in a fork child, or when the driver cannot tell. Where
/// ump-alloc has not loaded the driver, another library's driver is asked as it is (see
/// [`foreign_context_device`]): where nobody loaded or initialised it, no context can exist,
/// and ump-alloc neither loads it (about half a second on the lent machines) nor calls
/// `cuInit` (fork children could not use CUDA).
pub fn active_context_device() -> Option<i32> {
    if DRIVER.get().is_none() {
        // Another library's context: initialising ours now changes nothing for fork children.
        foreign_context_device()?;
    }
    contexts_active()
}

/// [`active_context_device`] where ump-alloc has the driver loaded already, else None: no look
/// into the dynamic loader's tables, whose lock must not be taken under a pool's lock (a thread
/// inside `dlopen` holds it and may allocate).
pub fn active_context_device_if_loaded() -> Option<i32> {
    DRIVER.get()?;
    contexts_active()
}

fn contexts_active() -> Option<i32> {
    let d = driver().ok()?;
    let n = CONTEXTS
        .get()
        .map_or_else(|| device_count(d), |v| v.len() as c_int);
    (0..n).find(|&i| primary_active(d, i) == Some(true))
}

/// Whether `device`'s primary context is active (see [`active_context_device`]); true where
/// the driver cannot tell, so that callers that skip work for an inactive context never skip
/// it wrongly.
pub fn context_active(device: i32) -> bool {
    let Ok(d) = driver() else { return false };
    primary_active(d, device) != Some(false)
}

/// Whether device `ordinal`'s primary context is active, read without making one; None where
/// the driver cannot tell (no `cuDevicePrimaryCtxGetState`, a bad ordinal).
fn primary_active(d: &Driver, ordinal: i32) -> Option<bool> {
    primary_state(d.cuDeviceGet, d.cuDevicePrimaryCtxGetState?, ordinal)
}

/// Whether device `ordinal`'s primary context is active, through a driver's `cuDeviceGet` and
/// `cuDevicePrimaryCtxGetState` (ump-alloc's, or one another library loaded); None where the
/// driver does not answer.
fn primary_state(get: GetFn, state: StateFn, ordinal: i32) -> Option<bool> {
    let mut dev: CUdevice = 0;
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-pointers; a bad ordinal or an uninitialised driver only returns an
    // error code.
    let read = unsafe {
        get(&mut dev, ordinal) == CUDA_SUCCESS
            && state(dev, &mut flags, &mut active) == CUDA_SUCCESS
    };
    read.then_some(active != 0)
}

/// The device count a driver's `cuDeviceGetCount` answers; None where it does not (an
/// uninitialised driver).
fn count_devices(count: CountFn) -> Option<c_int> {
    let mut n = 0;
    // SAFETY: valid out-pointer.
    (unsafe { count(&mut n) } == CUDA_SUCCESS).then_some(n.max(0))
}

/// The driver's device count (0 where it cannot tell).
pub(super) fn device_count(d: &Driver) -> c_int {
    count_devices(d.cuDeviceGetCount).unwrap_or(0)
}

/// Run `f` with device `device`'s primary context current, restoring the caller's afterwards.
pub(super) fn with_device<T>(
    device: i32,
    f: impl FnOnce(&'static Driver) -> Result<T>,
) -> Result<T> {
    let d = driver()?;
    let ctx = primary_context(d, device)?;
    // SAFETY: `ctx` is a retained primary context.
    check(
        d,
        unsafe { (d.cuCtxPushCurrent_v2)(ctx) },
        "cuCtxPushCurrent",
    )?;
    let r = f(d);
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops exactly the context pushed above.
    unsafe { (d.cuCtxPopCurrent_v2)(&mut popped) };
    r
}

pub(super) fn location(device: i32) -> CUmemLocation {
    let (type_, id) = if device < 0 {
        (CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, 0)
    } else {
        (CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, device)
    };
    CUmemLocation { type_, id }
}

/// The device of the context current on this thread (the one the CUDA runtime made current
/// for `cudaSetDevice`), or None when no context is current.
pub fn current_device() -> Option<i32> {
    let get = driver().ok()?.cuCtxGetDevice?;
    let mut dev: CUdevice = 0;
    // SAFETY: valid out-pointer; with no current context the driver returns an error code.
    (unsafe { get(&mut dev) } == CUDA_SUCCESS).then_some(dev)
}
