//! Blocks used on other streams than their own (PyTorch's `tensor.record_stream(s)`), and the
//! frees that wait for those streams: the books of one device, with process-wide counts that
//! keep the hot paths lock-free while nothing is recorded.

use crate::pool::Fence;
use crate::prim::fork::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Blocks recorded on other streams or waiting for them, on every device: 0 lets a free that
/// names no stream skip the record-stream bookkeeping altogether.
static RECORDED: AtomicUsize = AtomicUsize::new(0);

/// Whether any block is recorded on another stream or waits for one (see
/// [`StreamPools::record_stream`](super::StreamPools::record_stream)).
#[inline]
pub fn any_recorded() -> bool {
    RECORDED.load(Ordering::Relaxed) != 0
}

/// Deferred frees on every device: 0 keeps `allocator::free` from looking them up.
static DEFERRED: AtomicUsize = AtomicUsize::new(0);

/// Whether any free is deferred (see
/// [`StreamPools::is_deferred`](super::StreamPools::is_deferred)).
#[inline]
pub fn any_deferred() -> bool {
    DEFERRED.load(Ordering::Relaxed) != 0
}

/// A freed block waiting for the work of the streams it was recorded on.
struct Deferred {
    ptr: usize,
    fences: Vec<Arc<dyn Fence>>,
}

#[derive(Default)]
struct Table {
    /// Live block start -> the other streams it was recorded on.
    streams: HashMap<usize, Vec<usize>>,
    /// Freed blocks, oldest first, that go back once their fences are reached.
    pending: Vec<Deferred>,
}

/// The blocks of one device recorded on other streams, and its deferred frees.
#[derive(Default)]
pub(super) struct Recorded {
    table: Mutex<Table>,
    /// Entries in `streams` plus `pending`: 0 keeps the hot paths lock-free.
    count: AtomicUsize,
}

impl Recorded {
    /// Block `ptr` is used on `stream` (not its own) too.
    pub(super) fn record(&self, ptr: usize, stream: usize) {
        let mut t = lock(&self.table);
        let streams = t.streams.entry(ptr).or_insert_with(|| {
            self.count.fetch_add(1, Ordering::Relaxed);
            RECORDED.fetch_add(1, Ordering::Relaxed);
            Vec::new()
        });
        if !streams.contains(&stream) {
            streams.push(stream);
        }
    }

    /// Whether `ptr` was freed already and waits for other streams.
    pub(super) fn is_deferred(&self, ptr: usize) -> bool {
        self.count.load(Ordering::Relaxed) != 0
            && lock(&self.table).pending.iter().any(|d| d.ptr == ptr)
    }

    /// The free of `ptr` begins: the other streams it was recorded on, if any (it is no longer
    /// recorded; [`defer`](Self::defer) says what waits).
    pub(super) fn take_streams(&self, ptr: usize) -> Option<Vec<usize>> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        lock(&self.table).streams.remove(&ptr)
    }

    /// Keep freed block `ptr` (taken by [`take_streams`](Self::take_streams)) until `fences`
    /// are reached. Returns false, with nothing kept, when there are none.
    pub(super) fn defer(&self, ptr: usize, fences: Vec<Arc<dyn Fence>>) -> bool {
        if fences.is_empty() {
            self.count.fetch_sub(1, Ordering::Relaxed);
            RECORDED.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        lock(&self.table).pending.push(Deferred { ptr, fences });
        DEFERRED.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The deferred blocks whose fences are reached (with `wait`, all of them, after waiting),
    /// taken out of the books. A fence that cannot be asked about counts as reached.
    pub(super) fn take_ready(&self, wait: bool) -> Vec<usize> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let mut t = lock(&self.table);
        let mut ready = Vec::new();
        t.pending.retain(|d| {
            let done = d.fences.iter().all(|fence| {
                if wait {
                    fence.wait();
                }
                wait || !matches!(fence.done(), Ok(false))
            });
            if done {
                ready.push(d.ptr);
            }
            !done
        });
        self.count.fetch_sub(ready.len(), Ordering::Relaxed);
        RECORDED.fetch_sub(ready.len(), Ordering::Relaxed);
        DEFERRED.fetch_sub(ready.len(), Ordering::Relaxed);
        ready
    }

    /// Fork: the table (after the orphans, before the driver's event cache).
    pub(super) fn fork_lock(&'static self, held: &mut crate::prim::fork::Held) {
        held.push(lock(&self.table));
    }
}
