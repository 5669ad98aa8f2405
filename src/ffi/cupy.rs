//! CuPy's contract, through `cupy.cuda.CFunctionAllocator(param, malloc, free, owner)`.
//!
//! CuPy does not check for NULL: the Python layer (`ump_alloc._cupy`) wraps these calls and
//! raises `cupy.cuda.memory.OutOfMemoryError` itself when NULL comes back.

use super::guard;
use crate::allocator;
use crate::error;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// Allocate `size` bytes for CuPy on device `device_id`, from the memory the mode selects
/// (managed, registered, system or device). `param` is CuPy's opaque parameter and is not
/// used. Returns NULL with a message in `ump_last_error()` on failure, never aborts.
#[unsafe(no_mangle)]
pub extern "C" fn ump_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device_id: c_int,
) -> *mut c_void {
    let _ = param;
    guard(
        "ump_cupy_malloc",
        null_mut(),
        || match allocator::device_malloc(size, device_id, 0) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                error::report(&e.context("ump_cupy_malloc"));
                null_mut()
            }
        },
    )
}

/// Free a block from `ump_cupy_malloc`. `param` and `device_id` come from CuPy; NULL is a
/// no-op; a foreign pointer or a double free is ignored and counted.
#[unsafe(no_mangle)]
pub extern "C" fn ump_cupy_free(param: *mut c_void, ptr: *mut c_void, device_id: c_int) {
    let _ = param;
    guard("ump_cupy_free", (), || {
        if let Err(e) = allocator::device_free(ptr as usize, device_id, 0) {
            error::report(&e.context("ump_cupy_free"));
        }
    })
}
