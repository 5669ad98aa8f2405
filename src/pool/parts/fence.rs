//! What the pool and its parts know of stream order: a [`Fence`], recorded by the stream layer.

use crate::error::Result;

/// A point in a stream's queued work, recorded by the stream layer (an event): once it is
/// reached, the work queued before it is over. The pool keeps fences and asks about them; it
/// never makes one itself, so every CUDA call of stream ordering stays in `stream/`.
pub trait Fence: Send + Sync {
    /// Whether the work queued before the fence is over (never blocks).
    fn done(&self) -> Result<bool>;
    /// Wait on the host until it is over; when the fence cannot be waited for, wait for the
    /// whole device instead. False only when neither could be waited for.
    fn wait(&self) -> bool;
    /// Make `stream` wait for the fence on the device (the host does not block). False when
    /// the driver refuses.
    fn wait_on(&self, stream: usize) -> bool;
}
