//! What runs in a stream's order, and every CUDA call stream-ordered reuse makes: fences
//! (events recorded on a stream), the waits for them on the host or on another stream, host
//! waits for a stream, and the managed-memory advice queued on a stream (`pool::residency`).
//!
//! Where an event cannot be recorded or waited for (a stream handle destroyed before its
//! blocks were freed), the whole device is synchronised instead: slower, never unsafe.

use crate::error::Result;
use crate::pool::Fence;
use crate::prim::cuda;

/// A fence: an event recorded on a stream of `device`.
struct EventFence {
    ev: cuda::Event,
    device: i32,
}

impl Fence for EventFence {
    fn done(&self) -> Result<bool> {
        self.ev.done()
    }

    fn wait(&self) -> bool {
        self.ev.wait().is_ok() || cuda::device_synchronize(self.device).is_ok()
    }

    fn wait_on(&self, stream: usize) -> bool {
        self.ev.wait_on(stream).is_ok()
    }
}

/// A fence recorded on `stream` of `device`; None when the stream takes no event (the caller
/// synchronises instead, see [`sync_device`]).
pub(super) fn record(stream: usize, device: i32) -> Option<Box<dyn Fence>> {
    let ev = cuda::Event::record(stream, device).ok()?;
    Some(Box::new(EventFence { ev, device }))
}

/// Wait on the host for all work on `device`.
pub(super) fn sync_device(device: i32) {
    let _ = cuda::device_synchronize(device);
}

/// Wait on the host for the work queued on `stream` (the whole device when the stream cannot
/// be waited for).
pub(super) fn host_wait(stream: usize, device: i32) {
    if cuda::stream_synchronize(stream, device).is_err() {
        sync_device(device);
    }
}

/// Queue the discard of managed `ranges` on `stream` (see `pool::Group::queue_discard`).
///
/// # Safety
/// As `pool::Group::queue_discard`.
pub(super) unsafe fn discard(
    ranges: &[(usize, usize)],
    stream: usize,
    device: i32,
) -> Result<bool> {
    // SAFETY: the caller's contract: the ranges are free memory, queued in stream order.
    unsafe { cuda::discard(ranges, stream, device) }
}

/// Queue a discard-and-prefetch of managed `[a, a + n)` to `device` on `stream`, or a prefetch
/// when the batch call is missing or fails (see `pool::Group::queue_populate`).
///
/// # Safety
/// As `pool::Group::queue_populate`.
pub(super) unsafe fn populate(a: usize, n: usize, stream: usize, device: i32) -> Result<bool> {
    // SAFETY: the caller's contract: the range is not handed out yet, and the call runs in
    // the stream order of the work that will use it.
    let r = unsafe { cuda::discard_and_prefetch(&[(a, n)], device, stream, device) };
    if !matches!(r, Ok(true)) {
        // No batch call in this driver, or it failed: at least bring the pages over in one go.
        let _ = cuda::prefetch(a, n, device, stream, device);
    }
    r
}
