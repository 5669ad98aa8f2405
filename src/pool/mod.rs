//! The pool: a caching sub-allocator over one backing (RMM's pool adaptor over a resource).
//!
//! - Chunks come from the backing (large, granule-aligned; `chunk`) and are cut into *spans*
//!   (granule multiples) by best fit, with splitting and coalescing. Free spans sit in an
//!   ordered map keyed by (length, address), so finding the best fit costs O(log n) in the
//!   number of free spans, never a scan (`span`).
//! - Over a lazily committed backing (virtual memory), chunks are address space and a span's
//!   pages are committed when it is handed out and purged when no block needs them (`commit`).
//! - Small requests (up to [`SMALL_MAX`]) are served from *slabs*: spans cut into equal slots
//!   of one size class (`class`). Each slab keeps its own free slots and a class keeps the list
//!   of slabs with free slots, so a slab whose last slot comes back is found at once and goes
//!   back to the spans on its own (`slab`). Each thread caches a few free slots per class, so a
//!   cached small alloc+free takes no lock (`tcache`); a small request goes to the cache
//!   first and to the slabs when it has none (`small`).
//! - All bookkeeping lives outside the memory itself (device memory is not host-readable), in
//!   descriptors the registry points to. Descriptors are never freed, only recycled inside
//!   their pool, so lock-free readers (`lookup`) can always dereference what they load, and
//!   then check that the descriptor still describes the address.
//!
//! **What a pool keeps.** `retain` bounds the free memory a pool holds in a form it could give
//! back: wholly free chunks, the exact-size list and wholly free slabs. Past it, memory goes
//! back to the backing as it is freed. Free space inside partly used chunks and slabs is kept
//! (it cannot go back without moving live blocks); thread caches are bounded on their own.
//!
//! **Locks** (each a `std::sync::Mutex`, never held across a call into another pool unless
//! this order allows it): a class lock, then the large lock, then `retire_event`. `fork`
//! takes them all in that order (every pool's class locks, then every pool's large lock, ...).
//!
//! This file holds the pool's types and its locks; the rest is in parts: decoding the
//! registry's entries and the entry points by address (`entry`), making a pool and what it is
//! (`make`), its blocks in and out (`blocks`), what it keeps and gives back (`retain`), and
//! what it reports (`report`).

use crate::backing::{Backing, Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::fork::lock;
use crate::registry::{self, GRANULE};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod blocks;
mod chunk;
mod class;
mod commit;
mod entry;
mod grow;
mod hold;
mod make;
mod parts;
mod report;
mod residency;
mod retain;
mod slab;
mod small;
mod span;
pub mod stats;
mod tcache;

pub use class::ClassTable;
pub use entry::{Entry, entry_at, free_block, free_cached, lookup, pool_at, resize_cached};
pub use residency::mark_away;
pub use stats::PoolStats;

use parts::{Commit, Decay, ForkHold, Retention};
use slab::{ClassState, Slab};
use span::{Large, Span};
pub use tcache::flush_thread_counts;

/// The host side's small-block fast path: `n` bytes (counted in use) from this thread's cache
/// of the host side's primary pool, if it holds a slot of `n`'s class; None sends the caller
/// to the full path (no cache yet, another pool's cache, an empty bin, a large request).
#[inline(always)]
pub fn alloc_cached(n: usize) -> Option<usize> {
    if n > SMALL_MAX {
        return None;
    }
    tcache::alloc_primary(n)
}
pub(crate) use tcache::{
    fork_child as tcache_fork_child, fork_parent as tcache_fork_parent,
    fork_prepare as tcache_fork_prepare, register_membarrier_if_alone,
};

/// Largest request served from slabs; larger ones get spans of their own.
pub(crate) const SMALL_MAX: usize = 256 << 10;
/// Largest slab.
const SLAB_MAX: usize = 4 << 20;
/// Largest request accepted at all (keeps every size computation far from overflow).
pub(crate) const MAX_REQUEST: usize = isize::MAX as usize / 2;

const TAG_SPAN: usize = 1;
const TAG_SLAB: usize = 2;
const TAG_MASK: usize = 3;

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

/// What a stream-ordered pool needs from the set of pools of its device and from its stream
/// (implemented one layer up, by `stream::StreamPools`), so that dependencies point down.
pub trait Group: Send + Sync {
    /// Whether events order reuse across streams (false without a CUDA driver).
    fn ordered(&self) -> bool;
    /// Record a fence on `stream`, the pool's own (never a retired one). None when the stream
    /// takes none (a destroyed handle): the device was synchronised instead, and the sync is
    /// counted, so nothing queued before is pending any more.
    fn fence(&self, stream: usize) -> Option<Box<dyn Fence>>;
    /// Wait on the host for the work queued on `stream` (for the whole device when the
    /// stream cannot be waited for).
    fn host_wait(&self, stream: usize);
    /// An idle chunk of at least `min` bytes of another stream, adopted for `taker` and
    /// ordered after that stream's work.
    fn steal(&self, taker: &'static Pool, min: usize) -> Option<Chunk>;
    /// Under the device's limit, give back idle memory of every stream so that `want` (or at
    /// least `need`) more bytes fit.
    fn make_room(&self, want: usize, need: usize);
    /// Give back idle memory of every stream. Returns the bytes given back.
    fn release_idle(&self) -> usize;
    /// The device's limit on mapped bytes now (it may change: PyTorch's memory fraction), and
    /// what set it, for messages.
    fn limit(&self) -> Option<(usize, &'static str)>;
    /// Take a wholly free chunk of a retired stream's pool, ordered by `fence` (the retire
    /// event), to lend to other streams or give back.
    fn adopt(&self, chunk: Chunk, fence: Option<Arc<dyn Fence>>);
    /// Whether freed managed blocks that may be away from the device are discarded (see
    /// `residency`).
    fn discard(&self) -> bool {
        false
    }
    /// Whether the device's managed memory is oversubscribed (more mapped than the device
    /// has): the driver may have evicted any page.
    fn oversubscribed(&self) -> bool {
        false
    }
    /// Queue, on `stream`, the discard of managed `ranges` (their contents are dead). Ok(false)
    /// when the driver has no discard.
    ///
    /// # Safety
    /// Every range is free memory of the caller, and nothing hands it out before the discard
    /// is queued.
    unsafe fn queue_discard(&self, _ranges: &[(usize, usize)], _stream: usize) -> Result<bool> {
        Ok(false)
    }
    /// Queue, on `stream`, a discard-and-prefetch of managed `[a, a + n)` to the device:
    /// populated there with no data moved. Ok(false) when the driver has no batch call (the
    /// pages were prefetched instead); an error says why the call failed (the pages were
    /// prefetched too).
    ///
    /// # Safety
    /// `[a, a + n)` is memory of the caller not handed out yet.
    unsafe fn queue_populate(&self, _a: usize, _n: usize, _stream: usize) -> Result<bool> {
        Ok(false)
    }
}

/// Where a live block is, as the registry and descriptors say.
#[derive(Clone, Copy, Debug)]
pub struct BlockInfo {
    pub pool: &'static Pool,
    pub base: usize,
    /// Requested size.
    pub size: usize,
    /// Usable size (the slot or span length).
    pub capacity: usize,
}

/// A snapshot of one pool (one stream of a device, or the host side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolReport {
    /// The stream it serves (0: the legacy default stream; host pools: 0).
    pub stream: usize,
    /// Whether its stream was retired.
    pub retired: bool,
    /// Bytes of physical memory it holds (its chunks; for a lazily committed pool, the pages
    /// committed in them).
    pub mapped: usize,
    /// Bytes of address space its chunks hold (equal to `mapped` unless lazily committed).
    pub reserved: usize,
    /// Free bytes ready for reuse (spans, slots of partly used slabs, kept slabs).
    pub cached: usize,
    /// The largest free span: the largest block that fits without mapping (or committing)
    /// more.
    pub largest_free: usize,
    /// The kind of memory it is made of.
    pub kind: Kind,
}

/// The result of an allocation.
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub ptr: usize,
    /// True when the block is known to read as zero already.
    pub zeroed: bool,
}

/// A caching pool over one backing.
pub struct Pool {
    backing: Box<dyn Backing>,
    /// The backing's kind and device, copied out so the identity hot path makes no dyn call.
    kind: Kind,
    device: i32,
    table: ClassTable,
    classes: Box<[Mutex<ClassState>]>,
    large: Mutex<Large>,
    /// Counters, shared by the stream pools of one device.
    pub stats: &'static PoolStats,
    /// `stream << 1 | retired`: the stream this pool's blocks are used on (stream-ordered
    /// pools; 0 otherwise), and whether it was retired (about to be destroyed: its handle is
    /// never used again, and `retire_event` orders everything it ran). One word, so that a
    /// lock-free reader sees both at once; it changes only while the pool holds no memory.
    key: AtomicUsize,
    /// The device's set of stream pools this pool belongs to, if it is stream-ordered.
    group: Option<&'static dyn Group>,
    pub(crate) retire_event: Mutex<Option<Arc<dyn Fence>>>,
    limit: Option<usize>,
    /// What the pool keeps: the `retain` bound, the kept empty slabs, whether it is over the
    /// bound with nothing to give back, and what it gave back so far (`retain.rs`).
    retention: Retention,
    /// Stream-ordered pools (no thread cache): per class, the last freed slot, kept out of its
    /// slab so that an alloc+free pair on one stream takes one atomic swap each and no lock.
    /// See `small.rs` (`take_hot`, `put_hot`, `drain_hot`).
    hot: Box<[AtomicUsize]>,
    /// How long wholly free chunks above `retain` wait before they go back (`retain.rs`).
    idle: Decay,
    /// Lazy commitment: the commit unit and when free pages are next purged (`commit.rs`).
    commit: Commit,
    /// Freed blocks a fork child may still read are held back (`hold.rs`).
    hold: ForkHold,
    /// The pool that shares this one's counters and limit, if any (`share_limit_with`).
    peer: std::sync::OnceLock<&'static Pool>,
    /// The host side's primary pool (`mark_host_primary`): the pool small allocations of the
    /// malloc family are served from first, which the allocation fast path serves from its
    /// thread caches (`tcache::alloc_cached`).
    host_primary: AtomicBool,
}

impl Pool {
    /// Fork: take this pool's class locks (all of them, in order).
    pub(crate) fn fork_lock_classes(&'static self, held: &mut crate::prim::fork::Held) {
        for c in self.classes.iter() {
            held.push(lock(c));
        }
    }

    /// Fork: take this pool's large lock.
    pub(crate) fn fork_lock_large(&'static self, held: &mut crate::prim::fork::Held) {
        held.push(lock(&self.large));
    }

    /// Fork: take this pool's retire-event lock.
    pub(crate) fn fork_lock_retire(&'static self, held: &mut crate::prim::fork::Held) {
        held.push(lock(&self.retire_event));
    }
}

#[cold]
#[inline(never)]
fn double_free(ptr: usize) -> Error {
    Error::double_free(format!("double free of {ptr:#x}"))
}

#[cfg(test)]
mod tests;
