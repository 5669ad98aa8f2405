//! PyTorch's contracts. Two routes:
//!
//! - **Segments** (the default, `ump_torch_hook_segments`): PyTorch keeps its own caching
//!   allocator, with all of its machinery (statistics, snapshots, `record_stream`,
//!   `empty_cache`, CUDA graphs, its out-of-memory retry), and ump-alloc supplies the segments
//!   it caches: the `cudaMalloc`/`cudaFree` import slots of `libc10_cuda.so` (see
//!   `crate::prim::elf`) point at [`segment_malloc`] and [`segment_free`], which serve every
//!   device, thread and stream from the device side's pools and hand anything else (a pointer
//!   of PyTorch's own, a request ump-alloc cannot serve) to CUDA's own functions.
//! - **Swap** (`torch.cuda.memory.change_current_allocator(CUDAPluggableAllocator(path,
//!   "ump_torch_malloc", "ump_torch_free"))`): every tensor allocation calls ump-alloc, with the
//!   device and the current stream, and PyTorch does no caching of its own on top. After
//!   `change_current_allocator`, `ump_torch_attach` gives PyTorch's pluggable allocator the
//!   hooks its native allocator has (`record_stream`, `empty_cache`, the memory fraction) and
//!   turns a failed allocation into `torch.OutOfMemoryError` instead of a tensor at address 0
//!   (see `crate::prim::torch`). The same operations are exported for C as
//!   `ump_torch_record_stream`, `ump_torch_empty_cache` and `ump_torch_set_memory_fraction`.

use super::{guard, path_arg, status};
use crate::allocator;
use crate::error::{self, Error, ErrorClass};
use crate::integrations::torch as segments;
use crate::prim::torch as cxx;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

/// Allocate `size` bytes for PyTorch on `device`, to be used on `stream` (a `cudaStream_t`;
/// NULL is the legacy default stream). On failure returns NULL with a message in
/// `ump_last_error()`, never aborts; once `ump_torch_attach` has succeeded (PyTorch calls this
/// function), a failure is thrown to PyTorch as a C++ exception instead: `c10::OutOfMemoryError`
/// when memory or the limit ran out (Python sees `torch.OutOfMemoryError`), `c10::Error`
/// otherwise (`RuntimeError`). Before failing, what every stream of the device caches is given
/// back and the allocation tried again.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn ump_torch_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let mut failure: Option<(String, bool)> = None;
    let p = guard("ump_torch_malloc", || {
        match allocator::device_malloc(size, device, stream as usize) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                let e = e.context("ump_torch_malloc");
                error::report(&e);
                if cxx::attached() {
                    let oom = matches!(e.class, ErrorClass::Oom | ErrorClass::Limit);
                    failure = Some((format!("ump-alloc: {}", e.msg), oom));
                }
                null_mut()
            }
        }
    });
    if let Some((msg, oom)) = failure {
        // Outside the panic boundary, in a `C-unwind` function PyTorch called.
        // SAFETY: attached: PyTorch's allocator calls this function from C++ that expects
        // exceptions, and no Rust frame between here and there catches unwinding.
        unsafe { cxx::throw(&msg, oom) };
    }
    p
}

/// Free a block from `ump_torch_malloc`; `size`, `device` and `stream` are what PyTorch passes.
/// NULL is a no-op; a foreign pointer or a double free is ignored and counted. A block that
/// `ump_torch_record_stream` recorded on other streams is reused only after their work queued
/// until now.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = size;
    guard("ump_torch_free", || {
        if let Err(e) = allocator::device_free(ptr as usize, device, Some(stream as usize)) {
            error::report(&e.context("ump_torch_free"));
        }
    })
}

/// The block at `ptr` (from `ump_torch_malloc` or `ump_cupy_malloc`) is used on `stream` as well
/// as on the stream it was allocated for (`tensor.record_stream(stream)`): when it is freed, it
/// is reused only once the work queued on `stream` until the free has completed. Returns
/// `UMP_OK`, or `UMP_ERR_INVALID` / `UMP_ERR_NOT_OURS` for NULL or a pointer that is not a
/// live block of ours.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    status("ump_torch_record_stream", || {
        if ptr.is_null() {
            return Err(Error::invalid("ptr is NULL"));
        }
        allocator::device_record_stream(ptr as usize, stream as usize)
    })
}

/// Give back the memory the device side caches, on every device and stream
/// (`torch.cuda.empty_cache()`), after waiting for frees deferred by
/// `ump_torch_record_stream`. Returns the bytes given back.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_empty_cache() -> usize {
    guard("ump_torch_empty_cache", allocator::device_trim)
}

/// Limit the device side on `device` to `fraction` (in (0, 1]) of the device's memory, as
/// `torch.cuda.set_per_process_memory_fraction` does; `UMP_ALLOC_LIMIT` still applies. An
/// allocation that would map more first gives back cached memory, then fails as out of
/// memory. Returns `UMP_OK` or `UMP_ERR_INVALID` (a fraction out of range, no such device).
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_set_memory_fraction(fraction: f64, device: c_int) -> c_int {
    status("ump_torch_set_memory_fraction", || {
        allocator::set_device_fraction(device, fraction)
    })
}

fn hook_record_stream(ptr: usize, stream: usize) {
    ump_torch_record_stream(ptr as *mut c_void, stream as *mut c_void);
}

fn hook_reset() {
    ump_torch_empty_cache();
}

fn hook_memory_fraction(fraction: f64, device: i32) {
    ump_torch_set_memory_fraction(fraction, device);
}

fn hook_init(_device_count: i32) {
    guard("ump_torch_attach: init", || {
        if let Err(e) = allocator::init() {
            error::report(&e);
        }
    })
}

/// Attach to PyTorch after `torch.cuda.memory.change_current_allocator` installed a
/// `CUDAPluggableAllocator` over `ump_torch_malloc`/`ump_torch_free`. `libtorch_cuda` is the
/// path of the `libtorch_cuda.so` that `import torch` loaded (it is not loaded here). Sets the
/// allocator's hooks (`record_stream`, `empty_cache`, `set_per_process_memory_fraction`,
/// `init`) and makes `ump_torch_malloc` throw PyTorch's out-of-memory error on failure.
/// `*oom_error`, if not NULL, is set to 1 when failures raise `torch.OutOfMemoryError` and 0
/// when they raise `RuntimeError`. Returns `UMP_OK`; `UMP_ERR_UNSUPPORTED` when that library is
/// not loaded or lacks a symbol; `UMP_ERR_INVALID` when PyTorch's current
/// allocator is not a `CUDAPluggableAllocator`; `UMP_ERR_NULL` for a NULL path.
///
/// # Safety
/// `libtorch_cuda` is NULL or a NUL-terminated string; `oom_error` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_torch_attach(
    libtorch_cuda: *const c_char,
    oom_error: *mut c_int,
) -> c_int {
    status("ump_torch_attach", || {
        // SAFETY: NULL or a NUL-terminated string, per the contract.
        let path = unsafe { path_arg(libtorch_cuda, "libtorch_cuda") }?;
        let hooks = cxx::Hooks {
            record_stream: hook_record_stream,
            reset: hook_reset,
            memory_fraction: hook_memory_fraction,
            init: hook_init,
        };
        let oom = cxx::attach(path, hooks)?;
        if !oom_error.is_null() {
            // SAFETY: checked non-NULL; the caller passes a writable int.
            unsafe { *oom_error = c_int::from(oom) };
        }
        Ok(())
    })
}

// ---- the segments route ------------------------------------------------------------------

use segments::{CudaFree, CudaMalloc};

const CUDA_SUCCESS: c_int = 0;
const CUDA_ERROR_INVALID_VALUE: c_int = 1;
const CUDA_ERROR_MEMORY_ALLOCATION: c_int = 2;

/// The hooks the segments route puts in `libc10_cuda`'s slots.
fn hooks() -> segments::Hooks {
    segments::Hooks {
        malloc: segment_malloc,
        free: segment_free,
    }
}

fn real_malloc() -> CudaMalloc {
    // SAFETY: set to `libcudart`'s `cudaMalloc` (or an interposer's) before any slot points at
    // `segment_malloc` (`segments::hook_segments`).
    unsafe { std::mem::transmute::<usize, CudaMalloc>(segments::real_malloc()) }
}

fn real_free() -> CudaFree {
    // SAFETY: set to `libcudart`'s `cudaFree` (or an interposer's) before any slot points at
    // `segment_free`.
    unsafe { std::mem::transmute::<usize, CudaFree>(segments::real_free()) }
}

/// PyTorch's `cudaMalloc` on the segments route: a segment from the device side's pools on the
/// current device. Out of memory (or `UMP_ALLOC_LIMIT`) returns `cudaErrorMemoryAllocation`, so
/// PyTorch frees what it caches, tries again, and raises its own `torch.OutOfMemoryError`;
/// a request ump-alloc does not serve goes to CUDA's `cudaMalloc`.
unsafe extern "C" fn segment_malloc(out: *mut *mut c_void, size: usize) -> c_int {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if size == 0 {
        // CUDA's own answer to an empty request (no memory), whatever it is.
        // SAFETY: CUDA's own function, with PyTorch's arguments.
        return unsafe { real_malloc()(out, size) };
    }
    let r = guard(
        "cudaMalloc (PyTorch segment)",
        || match allocator::segment_malloc(size) {
            Ok(Some(p)) => Ok(Some(p)),
            Ok(None) => Ok(None),
            Err(e) => {
                let memory = matches!(e.class, ErrorClass::Oom | ErrorClass::Limit);
                error::report(&e.context("cudaMalloc (PyTorch segment)"));
                if memory { Err(()) } else { Ok(None) }
            }
        },
    );
    match r {
        // SAFETY: `out` is PyTorch's valid out-pointer (checked non-NULL).
        Ok(Some(p)) => unsafe {
            *out = p as *mut c_void;
            CUDA_SUCCESS
        },
        // SAFETY: CUDA's own function, with PyTorch's arguments.
        Ok(None) => unsafe { real_malloc()(out, size) },
        Err(()) => CUDA_ERROR_MEMORY_ALLOCATION,
    }
}

/// PyTorch's `cudaFree` on the segments route: a segment of ours goes back to its pool after
/// the device's queued work (as `cudaFree` waits); anything else (NULL, which initialises
/// CUDA, and segments PyTorch made before the hook) goes to CUDA's `cudaFree`.
unsafe extern "C" fn segment_free(ptr: *mut c_void) -> c_int {
    if ptr.is_null() {
        // SAFETY: CUDA's own function.
        return unsafe { real_free()(ptr) };
    }
    let r = guard("cudaFree (PyTorch segment)", || {
        allocator::segment_free(ptr as usize).map_err(|e| {
            error::report(&e.context("cudaFree (PyTorch segment)"));
        })
    });
    match r {
        Ok(true) => CUDA_SUCCESS,
        // SAFETY: CUDA's own function, with PyTorch's argument.
        Ok(false) => unsafe { real_free()(ptr) },
        Err(()) => CUDA_ERROR_INVALID_VALUE,
    }
}

/// Supply PyTorch's segments (the default route): point the `cudaMalloc` and `cudaFree` import
/// slots of `libc10_cuda` (the path of the `libc10_cuda.so` that `import torch` loaded; it is
/// not loaded here) at ump-alloc, so that PyTorch's caching allocator maps every new segment
/// from the device side's pools, on every device, thread and stream, and keeps all of its own
/// machinery. Segments PyTorch made before stay its own and are freed through CUDA. What
/// ump-alloc does not serve goes to the function each slot held (an interposer of
/// `cudaMalloc` loaded before, such as an `LD_PRELOAD`ed one, is chained to, not bypassed;
/// `ump_torch_segments_target` names it). The library stays loaded from then on, whatever
/// `dlclose` calls follow, and each slot's page keeps its protection. Calling it again while
/// hooked does nothing (the slots are checked to still hold the hook). Returns `UMP_OK`;
/// `UMP_ERR_UNSUPPORTED` (with the reason in `ump_last_error()`, nothing changed) when that
/// library is not loaded, does not import both functions through slots, or its CUDA runtime
/// cannot be found; `UMP_ERR_NULL` for a NULL path.
///
/// # Safety
/// `libc10_cuda` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_torch_hook_segments(libc10_cuda: *const c_char) -> c_int {
    status("ump_torch_hook_segments", || {
        // SAFETY: NULL or a NUL-terminated string, per the contract.
        let path = unsafe { path_arg(libc10_cuda, "libc10_cuda") }?;
        segments::hook_segments(path, hooks())
    })
}

/// Stop supplying PyTorch's new segments (`ump_alloc.disable()`): `cudaMalloc` goes back to
/// the function it forwarded to; `cudaFree` stays ump-alloc's, so segments PyTorch still
/// caches from ump-alloc go back to their pools when it frees them. A slot that no longer
/// holds ump-alloc's function (written by someone else since) is left as it is. Returns
/// `UMP_OK` (also when not hooked); on failure nothing is forgotten: the route stays hooked.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_unhook_segments() -> c_int {
    status("ump_torch_unhook_segments", || {
        segments::unhook_segments(hooks())
    })
}

/// Choose the memory PyTorch's new segments come from (`UMP_ALLOC_TORCH_SEGMENTS`'s values):
/// `"device"` (plain device memory, one driver allocation per segment: CUDA IPC shares it),
/// `"side"` (the device side's memory, what CuPy gets: managed memory by default, which the
/// host can view) or `"auto"` (back to the configuration). Segments made before stay where they
/// are. Returns `UMP_OK`; `UMP_ERR_INVALID` for another value; `UMP_ERR_NULL` for NULL.
///
/// # Safety
/// `which` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_torch_segment_memory(which: *const c_char) -> c_int {
    status("ump_torch_segment_memory", || {
        // SAFETY: NULL or a NUL-terminated string, per the contract.
        let which = unsafe { path_arg(which, "which") }?;
        allocator::set_segment_memory(which)
    })
}

/// The file of the `cudaMalloc` that PyTorch's segments route hands requests ump-alloc does
/// not serve to (the CUDA runtime's, or an interposer's that was in the slot before), as a
/// NUL-terminated path valid for the life of the process; NULL when the route was never
/// hooked.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_segments_target() -> *const c_char {
    guard("ump_torch_segments_target", segments::segments_target)
}

/// 1 while PyTorch's segments come from ump-alloc (`ump_torch_hook_segments` succeeded and
/// `ump_torch_unhook_segments` was not called since), else 0.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_segments_hooked() -> c_int {
    c_int::from(guard(
        "ump_torch_segments_hooked",
        segments::segments_hooked,
    ))
}
