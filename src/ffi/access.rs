//! Host and device access without a copy: the C side of `access` (stream-synchronised views of
//! memory both processors reach). Shared by every consumer.

use super::status;
use std::ffi::{c_int, c_void};

/// Make `[ptr, ptr+size)` safe for the host to read and write, with no copy: wait for the work
/// queued on `stream` (a `CUstream`/`cudaStream_t`; NULL is the legacy default stream) and, for
/// managed ranges of `UMP_ALLOC_PREFETCH_MIN` bytes or more, prefetch them to the host first in
/// the same stream order. Without a GPU it only validates. Returns `UMP_OK`; `UMP_ERR_INVALID`
/// for device-only memory or a range past its block; `UMP_ERR_NULL`; `UMP_ERR_CUDA`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_host_access(ptr: *const c_void, size: usize, stream: *mut c_void) -> c_int {
    status("ump_host_access", || {
        crate::access::host_access(ptr as usize, size, stream as usize)
    })
}

/// Make `[ptr, ptr+size)` ready for kernels on `device` queued on `stream`, in stream order and
/// with no host wait: managed ranges are prefetched to the device. Host writes made before the
/// call are seen by kernels queued after it. Returns `UMP_OK`; `UMP_ERR_INVALID` for memory
/// the device cannot reach on this machine; `UMP_ERR_UNSUPPORTED` without a GPU.
#[unsafe(no_mangle)]
pub extern "C" fn ump_device_access(
    ptr: *const c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    status("ump_device_access", || {
        crate::access::device_access(ptr as usize, size, device, stream as usize)
    })
}
