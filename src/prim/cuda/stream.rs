//! Streams and synchronisation: ump-alloc's own streams, and waiting for a stream or a whole
//! device.

use super::libcuda::{check, context_active, with_device};
use crate::error::Result;
use cudarc::driver::sys::CUstream;
use std::ffi::c_uint;

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
/// The default streams of a primary context that is not active hold no work: nothing is waited
/// for then, and no context is made for the wait. (A stream of its own the caller passes is
/// waited for as it is.)
pub fn stream_synchronize(stream: usize, device: i32) -> Result<()> {
    // 0 and CU_STREAM_LEGACY (1): the legacy default stream; CU_STREAM_PER_THREAD (2).
    if stream <= 2 && !context_active(device.max(0)) {
        return Ok(());
    }
    with_device(device.max(0), |d| {
        // SAFETY: the driver validates the stream handle.
        check(
            d,
            unsafe { (d.cuStreamSynchronize)(stream as CUstream) },
            "cuStreamSynchronize",
        )
    })
}

/// Wait for all work queued on every stream of `device`'s primary context (the last resort
/// of stream-ordered reuse when a stream handle is no longer valid). Nothing to wait for (and
/// no context made) where the context is not active.
pub fn device_synchronize(device: i32) -> Result<()> {
    if !context_active(device.max(0)) {
        return Ok(());
    }
    with_device(device.max(0), |d| {
        // SAFETY: no arguments; the context is current.
        check(d, unsafe { (d.cuCtxSynchronize)() }, "cuCtxSynchronize")
    })
}
