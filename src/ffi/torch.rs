//! PyTorch's contract, through `torch.cuda.memory.CUDAPluggableAllocator(path, "ump_torch_malloc",
//! "ump_torch_free")`. PyTorch passes the device and the current stream to both calls and does
//! no caching of its own on top.

use super::guard;
use crate::allocator;
use crate::error;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// Allocate `size` bytes for PyTorch on `device`, to be used on `stream` (a `cudaStream_t`;
/// NULL is the legacy default stream). Returns NULL with a message in `ump_last_error()` on
/// failure (PyTorch then raises its out-of-memory error), never aborts.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guard(
        "ump_torch_malloc",
        null_mut(),
        || match allocator::device_malloc(size, device, stream as usize) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                error::report(&e.context("ump_torch_malloc"));
                null_mut()
            }
        },
    )
}

/// Free a block from `ump_torch_malloc`; `size`, `device` and `stream` are what PyTorch passes.
/// NULL is a no-op; a foreign pointer or a double free is ignored and counted.
#[unsafe(no_mangle)]
pub extern "C" fn ump_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = size;
    guard("ump_torch_free", (), || {
        if let Err(e) = allocator::device_free(ptr as usize, device, stream as usize) {
            error::report(&e.context("ump_torch_free"));
        }
    })
}
