//! CuPy's contract, through `cupy.cuda.CFunctionAllocator(param, malloc, free, owner)`.
//!
//! CuPy does not check for NULL: the Python layer (`ump_alloc._cupy`) wraps these calls and
//! raises `cupy.cuda.memory.OutOfMemoryError` itself when NULL comes back.
//!
//! CuPy's free passes no stream, so ump-alloc reads the stream from `param`: the Python layer
//! makes one CFunctionAllocator per stream, with the stream's handle (`Stream.ptr`) as `param`,
//! and uses the one of CuPy's current stream, as CuPy's own pool keys its arenas. A block is
//! then reused at once on its stream and, on another one, only behind an event (see
//! `crate::stream`). A `param` of 0 is the legacy default stream.

use super::guard;
use crate::allocator;
use crate::error;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// Allocate `size` bytes for CuPy on device `device_id`, from the memory the mode selects
/// (managed, registered, system or device), for use on the stream whose handle is `param`
/// (`cudaStream_t`; NULL: the legacy default stream). Returns NULL with a message in
/// `ump_last_error()` on failure, never aborts.
#[unsafe(no_mangle)]
pub extern "C" fn ump_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device_id: c_int,
) -> *mut c_void {
    guard(
        "ump_cupy_malloc",
        null_mut(),
        || match allocator::device_malloc(size, device_id, param as usize) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                error::report(&e.context("ump_cupy_malloc"));
                null_mut()
            }
        },
    )
}

/// Free a block from `ump_cupy_malloc`; `param` is the stream it was last used on (the
/// allocator's `param`, as CuPy passes it). NULL is a no-op; a foreign pointer or a double
/// free is ignored and counted.
#[unsafe(no_mangle)]
pub extern "C" fn ump_cupy_free(param: *mut c_void, ptr: *mut c_void, device_id: c_int) {
    guard("ump_cupy_free", (), || {
        if let Err(e) = allocator::device_free(ptr as usize, device_id, param as usize) {
            error::report(&e.context("ump_cupy_free"));
        }
    })
}
