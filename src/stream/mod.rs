//! Stream-ordered reuse for the memory GPU libraries allocate (CuPy, PyTorch).
//!
//! A freed block must never reach a new user while GPU work queued before the free can still
//! touch it. The rule, the one PyTorch's caching allocator and CuPy's pool follow, extended
//! with events the way cudaMallocAsync's pools are:
//!
//! - Each device has one [`Pool`] per stream. A block is allocated from the pool of the stream
//!   it will be used on, and a free returns it to that pool. Work on one stream runs in order,
//!   so a block freed on stream S is reused on S at once, with no event and no wait.
//! - Memory moves between streams only as whole chunks. When the last block of a chunk is
//!   freed, the pool records an event on its stream. A pool of another stream T that has
//!   nothing free that fits adopts such an idle chunk, and T waits for the event on the device
//!   (`cuStreamWaitEvent`: the host never blocks) unless the event has already completed.
//! - A free that names a stream other than the block's (a block used last on another stream)
//!   makes the block's stream wait for an event recorded on the named stream before the block
//!   goes back.
//! - Where an event cannot be recorded (a stream handle destroyed before its blocks were
//!   freed), the device is synchronised instead: slower, never unsafe.
//!
//! **Retired streams.** A stream about to be destroyed is retired: one last event is recorded
//! on it and its handle is never used again. Its pool's idle chunks, and every chunk of it that
//! falls idle later, go to the device's *orphans*, each ordered by that event; any stream
//! adopts an orphan before it maps memory, and `trim` (or the limit) gives orphans back. A
//! retired pool that holds no chunk any more serves the next new stream, so the number of
//! pools is bounded by the streams in use at once, not by the streams ever made.
//!
//! **Blocks used on other streams** (PyTorch's `tensor.record_stream(s)`). A block recorded on
//! streams other than its own is not reused when it is freed: an event is recorded on each of
//! those streams, and the block goes back only once they have all completed (polled at the
//! next allocation on the device, waited for by `trim`, `torch.cuda.empty_cache()` and before
//! an out-of-memory error), as PyTorch's caching allocator does. No stream is made to wait.
//!
//! The pool list is append-only and lock-free to read (a stream's pool is found with no lock);
//! making and recycling pools is serialised by one lock per device.
//!
//! PyTorch passes the allocation stream to `free`. CuPy's free passes none; `ump_alloc`'s CuPy
//! allocator passes the current stream as CFunctionAllocator's `param`, so CuPy's blocks are
//! stream-ordered the same way (see `ffi::cupy`).

use crate::backing::{Backing, Chunk};
use crate::error::Result;
use crate::pool::PoolStats;
use crate::pool::{Fence, Group, Limit, Pool};
use crate::prim::fork::lock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod order;
mod recorded;

use recorded::Recorded;
pub use recorded::{any_deferred, any_recorded};

/// `CU_STREAM_LEGACY`: the legacy default stream by its explicit handle (same as 0).
const CU_STREAM_LEGACY: usize = 1;

/// The same stream by one name: the legacy default stream is 0 whichever handle names it.
#[inline]
pub fn normalize(stream: usize) -> usize {
    if stream == CU_STREAM_LEGACY {
        0
    } else {
        stream
    }
}

/// A link of the pool list (leaked: readers may hold it at any time).
struct Node {
    pool: &'static Pool,
    next: *const Node,
}

/// An idle chunk of a retired stream, with the event after which another stream may use it.
type Orphan = (Chunk, Option<Arc<dyn Fence>>);

/// The pools of one device, one per stream, sharing counters and a limit.
pub struct StreamPools {
    device: i32,
    make_backing: Box<dyn Fn() -> Box<dyn Backing> + Send + Sync>,
    align: usize,
    /// `UMP_ALLOC_LIMIT`.
    limit: Option<usize>,
    /// A limit set at run time in bytes (PyTorch's memory fraction); 0: none.
    fraction_limit: AtomicUsize,
    retain: usize,
    /// Whether events order reuse across streams (false without a CUDA driver, in tests).
    ordered: bool,
    pub stats: &'static PoolStats,
    /// Every pool of the device, newest first. Read lock-free; appended under `create`.
    head: AtomicPtr<Node>,
    /// Serialises making, recycling and retiring pools.
    create: Mutex<()>,
    /// Idle chunks of retired streams, oldest first.
    orphans: Mutex<Vec<Orphan>>,
    /// The backing orphans go back through (every pool of the device has the same kind).
    backing: Box<dyn Backing>,
    /// Cross-stream reuses ordered by a device-side wait on an event.
    pub waits: AtomicU64,
    /// Cross-stream reuses that had to synchronise (the event was not usable).
    pub syncs: AtomicU64,
    /// Blocks recorded on other streams and deferred frees (see the module docs).
    recorded: Recorded,
    /// Managed memory: discard freed blocks that may be away from the device (see
    /// `pool::residency`), and the device's memory, past which it is oversubscribed (0: never).
    discard: AtomicBool,
    device_memory: AtomicUsize,
}

// SAFETY: `Node::next` is a raw pointer only to leaked, immutable nodes; everything else is
// Send + Sync.
unsafe impl Send for StreamPools {}
// SAFETY: as above.
unsafe impl Sync for StreamPools {}

impl StreamPools {
    /// Make the stream pools of `device`. They live for the whole process.
    pub fn new(
        device: i32,
        make_backing: Box<dyn Fn() -> Box<dyn Backing> + Send + Sync>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        ordered: bool,
        stats: &'static PoolStats,
    ) -> &'static StreamPools {
        let backing = make_backing();
        Box::leak(Box::new(StreamPools {
            device,
            make_backing,
            align,
            limit,
            fraction_limit: AtomicUsize::new(0),
            retain,
            ordered,
            stats,
            head: AtomicPtr::new(std::ptr::null_mut()),
            create: Mutex::new(()),
            orphans: Mutex::new(Vec::new()),
            backing,
            waits: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            recorded: Recorded::default(),
            discard: AtomicBool::new(false),
            device_memory: AtomicUsize::new(0),
        }))
    }

    /// Managed memory (`UMP_ALLOC_MANAGED_DISCARD`): discard freed blocks whose pages may be
    /// away from the device, which has `device_memory` bytes (see `pool::residency`).
    pub fn set_managed_discard(&self, on: bool, device_memory: usize) {
        self.device_memory.store(device_memory, Ordering::Relaxed);
        self.discard.store(on, Ordering::Relaxed);
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    /// Every pool of the device (live and retired), lock-free.
    fn iter(&self) -> impl Iterator<Item = &'static Pool> {
        let mut n = self.head.load(Ordering::Acquire) as *const Node;
        std::iter::from_fn(move || {
            // SAFETY: nodes are leaked and never change after publication.
            let node = unsafe { n.as_ref() }?;
            n = node.next;
            Some(node.pool)
        })
    }

    /// Every pool of the device, live and retired.
    pub fn pools(&self) -> Vec<&'static Pool> {
        self.iter().collect()
    }

    /// Whether `pool` is one of these pools.
    pub fn holds(&self, pool: &Pool) -> bool {
        self.iter().any(|p| std::ptr::eq(p, pool))
    }

    /// The pool of `stream` (0: the legacy default stream): found lock-free, else a retired
    /// pool that holds nothing any more is recycled, else one is made.
    #[inline]
    pub fn pool_for(&'static self, stream: usize) -> Result<&'static Pool> {
        let stream = normalize(stream);
        if let Some(p) = self.iter().find(|p| p.serves(stream)) {
            return Ok(p);
        }
        let _g = lock(&self.create);
        if let Some(p) = self.iter().find(|p| p.serves(stream)) {
            return Ok(p);
        }
        if let Some(p) = self.iter().find(|p| p.recycle(stream)) {
            return Ok(p);
        }
        let p = Pool::for_stream(
            (self.make_backing)(),
            self.align,
            self.retain,
            self,
            self.stats,
            stream,
        );
        let node = Box::leak(Box::new(Node {
            pool: p,
            next: self.head.load(Ordering::Acquire),
        }));
        self.head.store(node, Ordering::Release);
        Ok(p)
    }

    /// The stream `stream` is about to be destroyed: record the event that covers its work
    /// and never use the handle again (a new stream that gets the same handle gets a pool of
    /// its own). Returns whether this device had a pool for it. The legacy default stream is
    /// never retired.
    pub fn retire(&self, stream: usize) -> bool {
        let stream = normalize(stream);
        if stream == 0 {
            return false;
        }
        let _g = lock(&self.create);
        let Some(p) = self.iter().find(|p| p.serves(stream)) else {
            return false;
        };
        p.retire();
        true
    }

    /// The retired pool of handle `stream`, if the handle was retired and not reused since.
    fn retired_pool(&self, stream: usize) -> Option<&'static Pool> {
        if self.iter().any(|p| p.serves(stream)) {
            return None; // the handle was reused by a live stream
        }
        self.iter().find(|p| p.retired_for(stream))
    }

    /// Make `stream` wait for `ev`: on the device when the event is still pending, on the
    /// host (or the whole device) when the driver refuses that.
    fn order_after(&self, fence: &dyn Fence, stream: usize) {
        if matches!(fence.done(), Ok(true)) {
            return;
        }
        if fence.wait_on(stream) {
            self.waits.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        fence.wait();
    }

    /// A fence on `stream`; None after synchronising the device (counted) when the stream
    /// takes none.
    fn fence_or_sync(&self, stream: usize) -> Option<Box<dyn Fence>> {
        let fence = order::record(stream, self.device);
        if fence.is_none() {
            self.syncs.fetch_add(1, Ordering::Relaxed);
            order::sync_device(self.device);
        }
        fence
    }

    /// A block of `pool` was last used on `stream`: before it goes back to `pool`, order
    /// `pool`'s stream after the work queued on `stream` so far.
    pub fn fence_free(&self, pool: &Pool, stream: usize) {
        let stream = normalize(stream);
        if !self.ordered || stream == pool.stream() {
            return;
        }
        if let Some(r) = self.retired_pool(stream) {
            // The handle is gone: its retire event stands for all its work.
            if let Some(fence) = lock(&r.retire_event).as_ref() {
                self.order_after(&**fence, pool.stream());
            }
            return;
        }
        if let Some(fence) = self.fence_or_sync(stream) {
            self.order_after(&*fence, pool.stream());
        }
    }

    /// Give orphan `o` back to the backing, after the work of its retired stream.
    fn release_orphan(&self, (chunk, fence): Orphan) -> usize {
        if let Some(fence) = fence {
            fence.wait();
        }
        if self.backing.kind() == crate::backing::Kind::UMP_KIND_MANAGED {
            // No prefetch of the background migration may touch memory given back.
            crate::migrate::quiesce(chunk.base, chunk.base + chunk.size);
        }
        let phys = self.backing.physical(&chunk);
        // SAFETY: the chunk is wholly free, registered nowhere, and its stream's work is done.
        unsafe { self.backing.unmap(&chunk) };
        self.stats.on_unmap(phys);
        self.stats.on_unreserve(chunk.raw_size);
        phys
    }

    /// Give every orphan back. Returns the bytes given back.
    fn release_orphans(&self) -> usize {
        let all = std::mem::take(&mut *lock(&self.orphans));
        all.into_iter().map(|o| self.release_orphan(o)).sum()
    }

    /// Return all cached memory of every stream (empty slabs and orphans included), after
    /// waiting for the blocks whose frees were deferred. Returns the bytes given back to the
    /// backing.
    pub fn trim(&self) -> usize {
        self.release_deferred(true);
        self.iter().map(|p| p.trim()).sum::<usize>() + self.release_orphans()
    }

    /// Set (or, with 0, clear) a limit on the device's mapped bytes besides `UMP_ALLOC_LIMIT`.
    /// Lowering it below what is mapped gives idle memory back; blocks in use stay.
    pub fn set_runtime_limit(&self, bytes: usize) {
        self.fraction_limit.store(bytes, Ordering::Relaxed);
        if bytes != 0 && self.stats.mapped.load(Ordering::Relaxed) > bytes {
            self.trim();
        }
    }

    // ---- blocks used on other streams (record_stream) ------------------------------------

    /// Block `ptr` of `pool` is used on `stream` too: when it is freed, it goes back only once
    /// the work queued on `stream` until then is done. Recording its own stream does nothing.
    pub fn record_stream(&self, pool: &Pool, ptr: usize, stream: usize) {
        let stream = normalize(stream);
        if !self.ordered || stream == pool.stream() {
            return;
        }
        self.recorded.record(ptr, stream);
    }

    /// Whether `ptr` was freed already and waits for other streams (a second free of it is a
    /// double free).
    pub fn is_deferred(&self, ptr: usize) -> bool {
        self.recorded.is_deferred(ptr)
    }

    /// The free of block `ptr`, recorded on other streams: record an event on each and keep
    /// the block until they complete. Returns false when the block may go back at once.
    pub fn defer_free(&self, ptr: usize) -> bool {
        // The table is not held while events are recorded: a retire event's lock comes
        // before it in the fork order.
        let Some(streams) = self.recorded.take_streams(ptr) else {
            return false;
        };
        let mut fences = Vec::with_capacity(streams.len());
        for s in streams {
            if let Some(p) = self.retired_pool(s) {
                // The handle is gone: its retire event stands for all its work.
                if let Some(fence) = lock(&p.retire_event).as_ref() {
                    fences.push(fence.clone());
                }
                continue;
            }
            // No fence on that stream: the whole device was waited for instead.
            if let Some(fence) = self.fence_or_sync(s) {
                fences.push(Arc::from(fence));
            }
        }
        self.recorded.defer(ptr, fences)
    }

    /// Give back the deferred blocks whose streams are done (with `wait`, all of them, after
    /// waiting). Returns how many went back.
    pub fn release_deferred(&self, wait: bool) -> usize {
        let ready = self.recorded.take_ready(wait);
        // No lock of ours is held while the blocks go back to their pools.
        for &ptr in &ready {
            let _ = crate::pool::free_block(ptr);
        }
        ready.len()
    }

    /// Fork: the recorded-stream table (after the orphans, before the driver's event cache).
    pub(crate) fn fork_lock_recorded(&'static self, held: &mut crate::prim::fork::Held) {
        self.recorded.fork_lock(held);
    }

    /// Free bytes held by every stream's pool and the orphans.
    pub fn cached_bytes(&self) -> usize {
        let orphans: usize = lock(&self.orphans)
            .iter()
            .map(|o| self.backing.physical(&o.0))
            .sum();
        self.iter().map(|p| p.cached_bytes()).sum::<usize>() + orphans
    }

    /// A snapshot of every pool of the device (one per stream), newest first.
    pub fn reports(&self) -> Vec<crate::pool::PoolReport> {
        self.iter().map(|p| p.report()).collect()
    }

    /// Fork: the lock that makes and recycles pools (taken before any pool's locks).
    pub(crate) fn fork_lock_create(&'static self, held: &mut crate::prim::fork::Held) {
        held.push(lock(&self.create));
    }

    /// Fork: the backing's own lock (a virtual-memory space), after the recorded-stream table.
    pub(crate) fn fork_lock_backing(&'static self, held: &mut crate::prim::fork::Held) {
        if let Some(g) = self.backing.fork_lock() {
            held.push(g);
        }
    }

    /// Fork: the orphan list (taken after every pool's large lock).
    pub(crate) fn fork_lock_orphans(&'static self, held: &mut crate::prim::fork::Held) {
        held.push(lock(&self.orphans));
    }
}

impl Group for StreamPools {
    fn ordered(&self) -> bool {
        self.ordered
    }

    fn fence(&self, stream: usize) -> Option<Box<dyn Fence>> {
        self.fence_or_sync(stream)
    }

    fn host_wait(&self, stream: usize) {
        order::host_wait(stream, self.device);
    }

    /// Adopt for `taker` an idle chunk of at least `min` bytes: an orphan first, else one of
    /// another stream's pool, ordered after the work that stream queued before the chunk fell
    /// idle.
    fn steal(&self, taker: &'static Pool, min: usize) -> Option<Chunk> {
        let orphan = {
            let mut o = lock(&self.orphans);
            let best = o
                .iter()
                .enumerate()
                .filter(|(_, x)| x.0.size >= min)
                .min_by_key(|(_, x)| x.0.size)
                .map(|(i, _)| i);
            best.map(|i| o.remove(i))
        };
        if let Some((chunk, fence)) = orphan {
            if let Some(fence) = fence {
                self.order_after(&*fence, taker.stream());
            }
            return Some(chunk);
        }
        for p in self.iter() {
            if std::ptr::eq(p, taker) || p.is_retired() {
                continue;
            }
            if let Some((chunk, fence)) = p.take_idle_chunk(min) {
                if let Some(fence) = fence {
                    self.order_after(&*fence, taker.stream());
                }
                return Some(chunk);
            }
        }
        None
    }

    /// Under the limit, give back idle memory of every stream so that `want` more bytes fit.
    fn make_room(&self, want: usize, need: usize) {
        let Some(Limit { bytes: limit, .. }) = Group::limit(self) else {
            return;
        };
        let mapped = self.stats.mapped.load(Ordering::Relaxed);
        if mapped + want <= limit || mapped + need <= limit {
            return;
        }
        self.release_idle();
    }

    fn release_idle(&self) -> usize {
        self.trim()
    }

    fn limit(&self) -> Option<Limit> {
        let runtime = self.fraction_limit.load(Ordering::Relaxed);
        match (self.limit, runtime) {
            (Some(bytes), r) if r == 0 || bytes <= r => Some(Limit::configured(bytes)),
            (_, 0) => None,
            (_, bytes) => Some(Limit {
                bytes,
                source: "the device's memory fraction limit",
            }),
        }
    }

    fn discard(&self) -> bool {
        self.discard.load(Ordering::Relaxed)
    }

    fn oversubscribed(&self) -> bool {
        let total = self.device_memory.load(Ordering::Relaxed);
        total != 0 && self.stats.mapped.load(Ordering::Relaxed) > total
    }

    unsafe fn queue_discard(&self, ranges: &[(usize, usize)], stream: usize) -> Result<bool> {
        // SAFETY: the caller's contract (`Group::queue_discard`).
        unsafe { order::discard(ranges, stream, self.device) }
    }

    unsafe fn queue_populate(&self, a: usize, n: usize, stream: usize) -> Result<bool> {
        // SAFETY: the caller's contract (`Group::queue_populate`).
        unsafe { order::populate(a, n, stream, self.device) }
    }

    fn adopt(&self, chunk: Chunk, fence: Option<Arc<dyn Fence>>) {
        let mut o = lock(&self.orphans);
        o.push((chunk, fence));
        // Orphans are free memory like any other: within the device's retain.
        let mut held: usize = o.iter().map(|x| x.0.size).sum();
        while held > self.retain && !o.is_empty() {
            let old = o.remove(0);
            held -= old.0.size;
            self.release_orphan(old);
        }
    }
}

#[cfg(test)]
mod tests;
