//! Every CUDA driver call of ump-alloc, and nothing else.
//!
//! Types and enum values come from cudarc's driver bindings (`cudarc::driver::sys`). The
//! library itself is opened here rather than through cudarc's loader, for three reasons:
//! cudarc panics when libcuda is missing or a symbol is absent (no panic may cross our C ABI),
//! it tries `libcuda.so` before `libcuda.so.1` (so a toolkit stub on LD_LIBRARY_PATH wins), and
//! a driver older than 12.2 lacks the `_v2` prefetch and advise entry points, which must
//! degrade to "unavailable", not abort.
//!
//! Results are read as plain integers (`CuResult`), never as cudarc's `CUresult` enum: a driver
//! may return a code the enum does not list.

use crate::error::{Error, Result, Status};
use crate::mode::{DeviceCaps, MachineCaps};
use crate::prim::fork::lock;
use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUmem_advise, CUmemAccessDesc,
    CUmemAllocationGranularity_flags, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemLocation, CUmemLocationType, CUpointer_attribute, CUstream,
};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

mod managed;
mod vmm;
pub use managed::{discard, discard_and_prefetch, has_discard};
pub use vmm::{
    map_pieces, set_access, unmap_range, unreserve, vmm_granularity, vmm_release, vmm_reserve,
};

/// A driver return code.
pub type CuResult = c_int;

pub(crate) const CUDA_SUCCESS: CuResult = 0;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub(crate) const CUDA_ERROR_STUB_LIBRARY: CuResult = 34;
pub(crate) const CUDA_ERROR_INSUFFICIENT_DRIVER: CuResult = 35;
pub(crate) const CUDA_ERROR_NO_DEVICE: CuResult = 100;
pub(crate) const CUDA_ERROR_NOT_READY: CuResult = 600;

const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 1;
const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 2;
const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)` values.
pub(crate) const CU_MEMORYTYPE_HOST: u32 = 1;

/// Library names tried, in order.
pub(crate) const LIB_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

macro_rules! driver_table {
    ($( $field:ident : fn($($arg:ty),*) ; )* ; optional: $( $ofield:ident : fn($($oarg:ty),*) ; )*) => {
        /// The resolved entry points. Required ones are plain function pointers; optional ones
        /// (absent from older drivers) are `Option`s.
        #[allow(non_snake_case)]
        struct Driver {
            _lib: libloading::Library,
            /// The fork depth it was loaded at (`prim::fork::depth`): seen at another depth, it
            /// was loaded by an ancestor before a `fork()`, and CUDA is unusable here.
            depth: u32,
            $( $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
            $( $ofield: Option<unsafe extern "C" fn($($oarg),*) -> CuResult>, )*
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

/// Serialises loading the driver and retaining primary contexts, so that no initialisation is
/// half done when the process forks (`fork_lock_load`).
static LOAD: Mutex<()> = Mutex::new(());

/// Fork: the loader lock (early in the order: probing nests it inside the allocator's init).
pub(crate) fn fork_lock_load(held: &mut crate::prim::fork::Held) {
    held.push(lock(&LOAD));
}

/// Fork: the event cache (late in the order: events are recorded under pool locks).
pub(crate) fn fork_lock_events(held: &mut crate::prim::fork::Held) {
    held.push(lock(&EVENT_CACHE));
}

fn open_driver() -> std::result::Result<Driver, String> {
    if std::env::var_os("UMP_ALLOC_NO_CUDA").is_some_and(|v| v.to_str().map(str::trim) == Some("1"))
    {
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

fn driver() -> Result<&'static Driver> {
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

fn err_name(d: &Driver, rc: CuResult) -> String {
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

fn check(d: &Driver, rc: CuResult, what: &str) -> Result<()> {
    match rc {
        CUDA_SUCCESS => Ok(()),
        CUDA_ERROR_OUT_OF_MEMORY => Err(Error::oom(format!("{what}: {}", err_name(d, rc)))),
        _ => Err(Error::new(
            Status::UMP_ERR_CUDA,
            format!("{what}: {}", err_name(d, rc)),
        )),
    }
}

fn device_attr(d: &Driver, dev: CUdevice, attr: CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; an unknown attribute only returns an error code.
    let rc = unsafe { (d.cuDeviceGetAttribute)(&mut v, attr, dev) };
    if rc == CUDA_SUCCESS { v } else { 0 }
}

/// Probe the machine: driver version, and per device the capabilities that decide modes.
pub fn probe() -> MachineCaps {
    let d = match driver() {
        Ok(d) => d,
        Err(e) => return MachineCaps::no_cuda(e.msg.trim_start_matches("CUDA is not available: ")),
    };
    let mut version = 0;
    // SAFETY: valid out-pointer.
    unsafe { (d.cuDriverGetVersion)(&mut version) };
    let mut count = 0;
    // SAFETY: valid out-pointer.
    if unsafe { (d.cuDeviceGetCount)(&mut count) } != CUDA_SUCCESS || count <= 0 {
        return MachineCaps::no_cuda("the CUDA driver reports no device");
    }
    let mut devices = Vec::new();
    for i in 0..count {
        let mut dev: CUdevice = 0;
        // SAFETY: valid out-pointer, ordinal in range.
        if unsafe { (d.cuDeviceGet)(&mut dev, i) } != CUDA_SUCCESS {
            continue;
        }
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and the driver writes at most that, NUL included.
        unsafe { (d.cuDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, dev) };
        // SAFETY: NUL-terminated by the driver (or all zero).
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut total = 0usize;
        // SAFETY: valid out-pointer.
        unsafe { (d.cuDeviceTotalMem_v2)(&mut total, dev) };
        use CUdevice_attribute as A;
        devices.push(DeviceCaps {
            ordinal: i,
            name,
            pageable_memory_access: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
            ) != 0,
            uses_host_page_tables: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
            ) != 0,
            concurrent_managed_access: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
            ) != 0,
            host_register_supported: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
            ) != 0,
            host_pointer_for_registered_mem: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            ) != 0,
            virtual_memory: vmm::supported(d)
                && device_attr(
                    d,
                    dev,
                    A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                ) != 0,
            total_memory: total as u64,
        });
    }
    MachineCaps {
        cuda_unavailable: None,
        driver_version: version,
        has_prefetch_v2: d.cuMemPrefetchAsync_v2.is_some() && d.cuMemAdvise_v2.is_some(),
        devices,
    }
}

/// Primary contexts, retained once per device and kept for the life of the process (CuPy and
/// PyTorch use the same ones through the runtime API).
static CONTEXTS: OnceLock<Vec<OnceLock<usize>>> = OnceLock::new();

fn primary_context(d: &Driver, device: i32) -> Result<CUcontext> {
    let slots = CONTEXTS.get_or_init(|| {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        unsafe { (d.cuDeviceGetCount)(&mut n) };
        (0..n.max(0)).map(|_| OnceLock::new()).collect()
    });
    let slot = usize::try_from(device)
        .ok()
        .and_then(|i| slots.get(i))
        .ok_or_else(|| {
            Error::invalid(format!(
                "no CUDA device {device} (this machine has {})",
                slots.len()
            ))
        })?;
    if let Some(&c) = slot.get() {
        return Ok(c as CUcontext);
    }
    let _g = lock(&LOAD);
    if let Some(&c) = slot.get() {
        return Ok(c as CUcontext);
    }
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
    Ok(*slot.get_or_init(|| ctx as usize) as CUcontext)
}

/// Run `f` with device `device`'s primary context current, restoring the caller's afterwards.
fn with_device<T>(device: i32, f: impl FnOnce(&'static Driver) -> Result<T>) -> Result<T> {
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

fn location(device: i32) -> CUmemLocation {
    let (type_, id) = if device < 0 {
        (CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, 0)
    } else {
        (CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, device)
    };
    CUmemLocation { type_, id }
}

/// cuMemAllocManaged (attached globally), made in `device`'s context.
pub fn alloc_managed(size: usize, device: i32) -> Result<usize> {
    with_device(device.max(0), |d| {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the driver validates the size.
        check(
            d,
            unsafe { (d.cuMemAllocManaged)(&mut p, size, CU_MEM_ATTACH_GLOBAL) },
            "cuMemAllocManaged",
        )?;
        Ok(p as usize)
    })
}

/// cuMemAlloc on `device`.
pub fn alloc_device(size: usize, device: i32) -> Result<usize> {
    with_device(device, |d| {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the driver validates the size.
        check(d, unsafe { (d.cuMemAlloc_v2)(&mut p, size) }, "cuMemAlloc")?;
        Ok(p as usize)
    })
}

/// cuMemFree of managed or device memory.
///
/// # Safety
/// `ptr` came from [`alloc_managed`] or [`alloc_device`] and is used by no queued work.
pub unsafe fn free(ptr: usize, device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        // SAFETY: forwarded from the caller.
        check(
            d,
            unsafe { (d.cuMemFree_v2)(ptr as CUdeviceptr) },
            "cuMemFree",
        )
    })
}

/// Register host memory, portable and mapped: the device sees it at the same address.
///
/// # Safety
/// `[ptr, ptr+size)` is host memory that stays mapped until [`unregister`].
pub unsafe fn register(ptr: usize, size: usize, device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        let flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: forwarded from the caller.
        check(
            d,
            unsafe { (d.cuMemHostRegister_v2)(ptr as *mut c_void, size, flags) },
            "cuMemHostRegister",
        )
    })
}

/// Undo [`register`].
///
/// # Safety
/// `ptr` was registered and no queued work uses it.
pub unsafe fn unregister(ptr: usize, device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        // SAFETY: forwarded from the caller.
        check(
            d,
            unsafe { (d.cuMemHostUnregister)(ptr as *mut c_void) },
            "cuMemHostUnregister",
        )
    })
}

/// Advise the preferred location of managed memory (`device < 0`: the host). Returns false
/// when the driver lacks cuMemAdvise_v2 (advice is optional).
pub fn advise_preferred(ptr: usize, size: usize, device: i32) -> Result<bool> {
    advise(
        ptr,
        size,
        CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        device,
    )
}

/// Advise that `device` (or the host) accesses managed memory, so it is mapped there.
pub fn advise_accessed_by(ptr: usize, size: usize, device: i32) -> Result<bool> {
    advise(
        ptr,
        size,
        CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY,
        device,
    )
}

fn advise(ptr: usize, size: usize, advice: CUmem_advise, device: i32) -> Result<bool> {
    let d = driver()?;
    let Some(f) = d.cuMemAdvise_v2 else {
        return Ok(false);
    };
    // SAFETY: the driver validates the range; advice never invalidates memory.
    check(
        d,
        unsafe { f(ptr as CUdeviceptr, size, advice, location(device)) },
        "cuMemAdvise",
    )?;
    Ok(true)
}

/// Prefetch managed memory to `device` (`< 0`: the host) in `stream`'s order, with
/// `ctx_device`'s context current (the stream's). Returns false when the driver lacks
/// cuMemPrefetchAsync_v2.
pub fn prefetch(
    ptr: usize,
    size: usize,
    device: i32,
    stream: usize,
    ctx_device: i32,
) -> Result<bool> {
    with_device(ctx_device.max(0), |d| {
        let Some(f) = d.cuMemPrefetchAsync_v2 else {
            return Ok(false);
        };
        // SAFETY: the driver validates the range and the stream handle.
        check(
            d,
            unsafe {
                f(
                    ptr as CUdeviceptr,
                    size,
                    location(device),
                    0,
                    stream as CUstream,
                )
            },
            "cuMemPrefetchAsync",
        )?;
        Ok(true)
    })
}

/// A new non-blocking stream on `device` (for ump-alloc's own background work; never
/// destroyed).
pub fn stream_create(device: i32) -> Result<usize> {
    const CU_STREAM_NON_BLOCKING: c_uint = 1;
    with_device(device.max(0), |d| {
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device's context is current.
        check(
            d,
            unsafe { (d.cuStreamCreate)(&mut s, CU_STREAM_NON_BLOCKING) },
            "cuStreamCreate",
        )?;
        Ok(s as usize)
    })
}

/// Wait for all work queued on `stream` (0: the legacy default stream) in `device`'s context.
pub fn stream_synchronize(stream: usize, device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        // SAFETY: the driver validates the stream handle.
        check(
            d,
            unsafe { (d.cuStreamSynchronize)(stream as CUstream) },
            "cuStreamSynchronize",
        )
    })
}

/// Free and total memory of `device`.
pub fn mem_info(device: i32) -> Result<(usize, usize)> {
    with_device(device, |d| {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check(
            d,
            unsafe { (d.cuMemGetInfo_v2)(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free, total))
    })
}

/// The device of the context current on this thread (the one the CUDA runtime made current
/// for `cudaSetDevice`), or None when no context is current.
pub fn current_device() -> Option<i32> {
    let get = driver().ok()?.cuCtxGetDevice?;
    let mut dev: CUdevice = 0;
    // SAFETY: valid out-pointer; with no current context the driver returns an error code.
    (unsafe { get(&mut dev) } == CUDA_SUCCESS).then_some(dev)
}

/// Wait for all work queued on every stream of `device`'s primary context (the last resort
/// of stream-ordered reuse when a stream handle is no longer valid).
pub fn device_synchronize(device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        // SAFETY: no arguments; the context is current.
        check(d, unsafe { (d.cuCtxSynchronize)() }, "cuCtxSynchronize")
    })
}

/// Events kept for reuse, per device: creating one costs a driver call, recording one is
/// cheap, and stream-ordered reuse records one each time a chunk falls idle.
static EVENT_CACHE: Mutex<Vec<(i32, usize)>> = Mutex::new(Vec::new());
/// Events kept at most (beyond this they are destroyed).
const EVENT_CACHE_MAX: usize = 256;

fn cached_event(d: &Driver, device: i32) -> Result<usize> {
    {
        let mut c = lock(&EVENT_CACHE);
        if let Some(i) = c.iter().rposition(|&(dev, _)| dev == device) {
            return Ok(c.swap_remove(i).1);
        }
    }
    let mut ev: CUevent = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the device's context is current (caller).
    check(
        d,
        unsafe { (d.cuEventCreate)(&mut ev, CU_EVENT_DISABLE_TIMING) },
        "cuEventCreate",
    )?;
    Ok(ev as usize)
}

fn uncache_event(d: &Driver, device: i32, ev: usize) {
    let mut c = lock(&EVENT_CACHE);
    if c.len() < EVENT_CACHE_MAX {
        c.push((device, ev));
    } else {
        drop(c);
        // SAFETY: `ev` is a live event nobody else holds.
        unsafe { (d.cuEventDestroy_v2)(ev as CUevent) };
    }
}

/// An event recorded on a stream: what stream-ordered reuse waits for.
#[derive(Debug)]
pub struct Event {
    ev: usize,
    device: i32,
}

impl Event {
    /// Record an event on `stream` of `device` (events are reused from a cache).
    pub fn record(stream: usize, device: i32) -> Result<Event> {
        with_device(device.max(0), |d| {
            let ev = cached_event(d, device)?;
            // SAFETY: `ev` is a live event; the driver validates the stream.
            if let Err(e) = check(
                d,
                unsafe { (d.cuEventRecord)(ev as CUevent, stream as CUstream) },
                "cuEventRecord",
            ) {
                uncache_event(d, device, ev);
                return Err(e);
            }
            Ok(Event { ev, device })
        })
    }

    /// Whether all work before the event has finished.
    pub fn done(&self) -> Result<bool> {
        with_device(self.device.max(0), |d| {
            // SAFETY: `ev` is a live event.
            match unsafe { (d.cuEventQuery)(self.ev as CUevent) } {
                CUDA_SUCCESS => Ok(true),
                CUDA_ERROR_NOT_READY => Ok(false),
                rc => check(d, rc, "cuEventQuery").map(|_| false),
            }
        })
    }

    /// Block until the event completes.
    pub fn wait(&self) -> Result<()> {
        with_device(self.device.max(0), |d| {
            // SAFETY: `ev` is a live event.
            check(
                d,
                unsafe { (d.cuEventSynchronize)(self.ev as CUevent) },
                "cuEventSynchronize",
            )
        })
    }

    /// Make `stream` wait for the event on the device (no host wait).
    pub fn wait_on(&self, stream: usize) -> Result<()> {
        with_device(self.device.max(0), |d| {
            // SAFETY: live event; the driver validates the stream.
            check(
                d,
                unsafe { (d.cuStreamWaitEvent)(stream as CUstream, self.ev as CUevent, 0) },
                "cuStreamWaitEvent",
            )
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // A recorded event may be re-recorded at once: waiters already captured it.
            uncache_event(d, self.device, self.ev);
        }
    }
}

/// What the driver knows of an address that is not ours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PointerInfo {
    /// CU_MEMORYTYPE_* (0: unknown to CUDA).
    pub memory_type: u32,
    pub is_managed: bool,
    pub device: i32,
    pub range_start: usize,
    pub range_size: usize,
}

/// Ask the driver about `ptr`. None when there is no driver or the driver does not know it.
pub fn pointer_info(ptr: usize) -> Option<PointerInfo> {
    let d = driver().ok()?;
    let mut memory_type: u32 = 0;
    let mut is_managed: u32 = 0;
    let mut device: c_int = -1;
    let mut start: CUdeviceptr = 0;
    let mut size: usize = 0;
    use CUpointer_attribute as P;
    let mut attrs = [
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        P::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        P::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 5] = [
        (&mut memory_type as *mut u32).cast(),
        (&mut is_managed as *mut u32).cast(),
        (&mut device as *mut c_int).cast(),
        (&mut start as *mut CUdeviceptr).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: five attributes, five out-pointers of the sizes cuda.h documents for them.
    let rc = unsafe {
        (d.cuPointerGetAttributes)(5, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr as CUdeviceptr)
    };
    if rc != CUDA_SUCCESS || memory_type == 0 {
        return None;
    }
    Some(PointerInfo {
        memory_type,
        is_managed: is_managed != 0,
        device,
        range_start: start as usize,
        range_size: size,
    })
}
