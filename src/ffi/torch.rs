//! PyTorch's contract, through `torch.cuda.memory.CUDAPluggableAllocator(path, "ump_torch_malloc",
//! "ump_torch_free")`. PyTorch passes the device and the current stream to both calls and does
//! no caching of its own on top.
//!
//! After `change_current_allocator`, `ump_torch_attach` gives PyTorch's pluggable allocator the
//! hooks its native allocator has (`record_stream`, `empty_cache`, the memory fraction) and
//! turns a failed allocation into `torch.OutOfMemoryError` instead of a tensor at address 0
//! (see `crate::prim::torch`). The same operations are exported for C as
//! `ump_torch_record_stream`, `ump_torch_empty_cache` and `ump_torch_set_memory_fraction`.

use super::{guard, status};
use crate::allocator;
use crate::error::{self, Error, ErrorClass, Status};
use crate::prim::torch as cxx;
use std::ffi::{CStr, c_char, c_int, c_void};
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
    let p = guard(
        "ump_torch_malloc",
        null_mut(),
        || match allocator::device_malloc(size, device, stream as usize) {
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
        },
    );
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
    guard("ump_torch_free", (), || {
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
    guard("ump_torch_empty_cache", 0, allocator::device_trim)
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
    guard("ump_torch_attach: init", (), || {
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
        if libtorch_cuda.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "libtorch_cuda is NULL"));
        }
        // SAFETY: a NUL-terminated string, per the contract.
        let path = unsafe { CStr::from_ptr(libtorch_cuda) }
            .to_str()
            .map_err(|_| Error::invalid("libtorch_cuda is not UTF-8"))?;
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
