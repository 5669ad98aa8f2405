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

use crate::backing::{Backing, Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::cuda;
use crate::prim::fork::lock;
use crate::registry::{self, GRANULE};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod chunk;
mod class;
mod commit;
mod grow;
mod hold;
mod residency;
mod slab;
mod small;
mod span;
pub mod stats;
mod tcache;

pub use class::ClassTable;
pub use residency::mark_away;
pub use stats::PoolStats;

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

/// What a stream-ordered pool needs from the set of pools of its device (implemented one
/// layer up, by `stream::StreamPools`), so that dependencies point down.
pub trait Group: Send + Sync {
    /// Whether events order reuse across streams (false without a CUDA driver).
    fn ordered(&self) -> bool;
    /// Count a cross-stream reuse that had to synchronise instead of waiting on an event.
    fn count_sync(&self);
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
    fn adopt(&self, chunk: Chunk, fence: Option<Arc<cuda::Event>>);
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
    pub(crate) retire_event: Mutex<Option<Arc<cuda::Event>>>,
    limit: Option<usize>,
    /// Free bytes kept in forms that could go back to the backing (see the module docs).
    retain: usize,
    /// Bytes of wholly free slabs kept for reuse (part of what `retain` bounds).
    kept_slabs: AtomicUsize,
    /// The free memory the pool holds is above `retain` and nothing could go back at the last
    /// look (`enforce_retain`): free spans sit in chunks that something pins. A slot cached
    /// by a thread whose slab holds no live block may be what pins one (see `tcache`).
    over_retain: AtomicBool,
    /// Stream-ordered pools (no thread cache): per class, the last freed slot, kept out of its
    /// slab so that an alloc+free pair on one stream takes one atomic swap each and no lock.
    /// See `small.rs` (`take_hot`, `put_hot`, `drain_hot`).
    hot: Box<[AtomicUsize]>,
    /// Bytes given back to the backing so far (what `trim` reports).
    unmapped: AtomicUsize,
    /// How long a wholly free chunk above `retain` is kept before it goes back (milliseconds;
    /// 0: at once). For memory that is costly to make, such as pinned host memory.
    decay_ms: AtomicU64,
    /// Milliseconds since `EPOCH` when idle chunks are next due to go back (0: none waiting).
    decay_due: AtomicU64,
    /// The backing's commit unit when it commits lazily (see `commit`).
    page: Option<usize>,
    /// Lazily committed pools: milliseconds since `EPOCH` when free spans are next looked at.
    purge_due: AtomicU64,
    /// Freed blocks a fork child may still read are held back (pages shared with fork
    /// children: see `hold`).
    fork_hold: std::sync::atomic::AtomicBool,
    /// `shared::drops()` when the held blocks were last looked at: none can go back before it
    /// changes (see `hold`).
    held_seen: AtomicU64,
    /// The pool that shares this one's counters and limit, if any (`share_limit_with`).
    peer: std::sync::OnceLock<&'static Pool>,
    /// The host side's primary pool (`mark_host_primary`): the pool small allocations of the
    /// malloc family are served from first, which the allocation fast path serves from its
    /// thread caches (`tcache::alloc_cached`).
    host_primary: AtomicBool,
}

/// The clock `decay_due` counts from.
static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn epoch_ms(t: std::time::Instant) -> u64 {
    let e = *EPOCH.get_or_init(std::time::Instant::now);
    t.saturating_duration_since(e).as_millis() as u64 + 1
}

/// Descriptor a registry entry points at.
#[derive(Clone, Copy)]
pub enum Entry {
    Span(&'static Span),
    Slab(&'static Slab),
}

/// Decode a registry entry.
#[inline]
pub fn entry_at(addr: usize) -> Option<Entry> {
    let e = registry::get(addr);
    let p = e & !TAG_MASK;
    if p == 0 {
        return None;
    }
    // SAFETY: the registry holds only tagged pointers to leaked, never-freed descriptors.
    match e & TAG_MASK {
        TAG_SPAN => Some(Entry::Span(unsafe { &*(p as *const Span) })),
        TAG_SLAB => Some(Entry::Slab(unsafe { &*(p as *const Slab) })),
        _ => None,
    }
}

impl Entry {
    /// The pool whose descriptor this is.
    #[inline]
    pub fn pool(self) -> &'static Pool {
        match self {
            Entry::Slab(s) => s.pool,
            Entry::Span(sp) => sp.pool,
        }
    }

    /// The live block containing `addr`, if this descriptor (found for `addr`) has one there.
    #[inline]
    pub fn lookup(self, addr: usize) -> Option<BlockInfo> {
        match self {
            Entry::Slab(s) => s.lookup(addr),
            Entry::Span(sp) => sp.lookup(addr),
        }
    }

    /// Free the block starting at `ptr`, this descriptor being the one found for `ptr`.
    /// Returns the bytes it held. Errors leave everything as it was.
    #[inline]
    pub fn free(self, ptr: usize) -> Result<usize> {
        match self {
            Entry::Slab(s) => s.pool.free_small(s, ptr),
            Entry::Span(sp) => {
                let n = sp.pool.free_large(sp, ptr)?;
                sp.pool.stats.frees.fetch_add(1, Ordering::Relaxed);
                sp.pool.stats.sub_in_use(n);
                if sp.pool.over_retain() {
                    sp.pool.release_pinning();
                }
                Ok(n)
            }
        }
    }
}

/// Free the block starting at `ptr`, whichever pool it belongs to (one registry lookup).
/// Returns the bytes it held. Errors leave everything as it was.
#[inline]
pub fn free_block(ptr: usize) -> Result<usize> {
    match entry_at(ptr) {
        Some(e) => e.free(ptr),
        None => Err(Error::not_ours(format!(
            "{ptr:#x} was not allocated by ump-alloc"
        ))),
    }
}

/// The host side's small-block free fast path: free the block at `ptr` into this thread's
/// cache when it is a slot of a pool this thread caches for. None: not handled, nothing
/// changed (use `free_block`); else what `free_block` would give.
#[inline(always)]
pub fn free_cached(ptr: usize) -> Option<Result<usize>> {
    match entry_at(ptr)? {
        Entry::Slab(s) => s.pool.free_cached(s, ptr),
        Entry::Span(_) => None,
    }
}

/// The host side's realloc fast path: the small block at `ptr` resized in place to `n` bytes
/// when `n` falls in its size class, counted in this thread's cache of its pool. None: not
/// handled, nothing changed (use the full realloc).
#[inline(always)]
pub fn resize_cached(ptr: usize, n: usize) -> Option<usize> {
    match entry_at(ptr)? {
        Entry::Slab(s) => s.pool.resize_cached(s, ptr, n),
        Entry::Span(_) => None,
    }
}

/// The pool whose memory holds `addr` (live block or cached), if any. Lock-free.
pub fn pool_at(addr: usize) -> Option<&'static Pool> {
    entry_at(addr).map(Entry::pool)
}

/// Find the live block containing `addr` (any pool). Lock-free.
#[inline]
pub fn lookup(addr: usize) -> Option<BlockInfo> {
    entry_at(addr)?.lookup(addr)
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("kind", &self.kind())
            .field("device", &self.device())
            .field("stream", &self.stream())
            .finish()
    }
}

impl Pool {
    /// Make a host-side pool (NumPy, the C malloc family). Pools live for the whole process
    /// (descriptors point back at them).
    pub fn new(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
    ) -> &'static Pool {
        let stats = Box::leak(Box::new(PoolStats::default()));
        Self::new_shared(backing, align, limit, retain, stats)
    }

    /// Make a host-side pool that shares counters `stats` with another (the host side's
    /// primary and fallback pools).
    pub fn new_shared(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        stats: &'static PoolStats,
    ) -> &'static Pool {
        Self::build(backing, align, limit, retain, stats, None, 0)
    }

    /// Make the pool of `stream` inside a device's stream pools, sharing their counters.
    /// Its limit is the group's ([`Group::limit`]).
    pub fn for_stream(
        backing: Box<dyn Backing>,
        align: usize,
        retain: usize,
        group: &'static dyn Group,
        stats: &'static PoolStats,
        stream: usize,
    ) -> &'static Pool {
        Self::build(backing, align, None, retain, stats, Some(group), stream)
    }

    fn build(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        stats: &'static PoolStats,
        group: Option<&'static dyn Group>,
        stream: usize,
    ) -> &'static Pool {
        // Host-side pools give small blocks their natural alignment; device pools do not.
        let table = ClassTable::new(align, group.is_none());
        let classes = (0..table.len())
            .map(|_| Mutex::new(ClassState::default()))
            .collect();
        let hot = (0..table.len()).map(|_| AtomicUsize::new(0)).collect();
        let page = backing.commit_page();
        let fork_hold = std::sync::atomic::AtomicBool::new(backing.fork_shared());
        Box::leak(Box::new(Pool {
            kind: backing.kind(),
            device: backing.device(),
            backing,
            table,
            classes,
            large: Mutex::new(Large::default()),
            stats,
            key: AtomicUsize::new(stream << 1),
            group,
            retire_event: Mutex::new(None),
            limit,
            retain,
            kept_slabs: AtomicUsize::new(0),
            over_retain: AtomicBool::new(false),
            hot,
            unmapped: AtomicUsize::new(0),
            decay_ms: AtomicU64::new(0),
            decay_due: AtomicU64::new(0),
            page,
            purge_due: AtomicU64::new(0),
            fork_hold,
            held_seen: AtomicU64::new(0),
            peer: std::sync::OnceLock::new(),
            host_primary: AtomicBool::new(false),
        }))
    }

    /// The limit on this pool's mapped bytes (its group's, for a stream pool), and what set it.
    pub(crate) fn limit(&self) -> Option<(usize, &'static str)> {
        match self.group {
            Some(g) => g.limit(),
            None => self.limit.map(|l| (l, "UMP_ALLOC_LIMIT")),
        }
    }

    /// Keep wholly free chunks above `retain` for `decay` before they go back (pinned memory:
    /// a loop that frees and allocates large arrays reuses them instead of pinning anew).
    pub fn set_decay(&self, decay: std::time::Duration) {
        self.decay_ms
            .store(decay.as_millis() as u64, Ordering::Relaxed);
    }

    fn decay(&self) -> Option<std::time::Duration> {
        match self.decay_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        }
    }

    fn set_decay_due(&self, at: std::time::Instant) {
        self.decay_due.store(epoch_ms(at), Ordering::Relaxed);
    }

    fn clear_decay_due(&self) {
        if self.decay_due.load(Ordering::Relaxed) != 0 {
            self.decay_due.store(0, Ordering::Relaxed);
        }
    }

    /// Whether idle chunks wait for their decay and the first is due (cheap when none wait).
    #[inline]
    fn decay_is_due(&self) -> bool {
        let due = self.decay_due.load(Ordering::Relaxed);
        due != 0 && epoch_ms(std::time::Instant::now()) >= due
    }

    /// Whether this pool's stream was retired.
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.key.load(Ordering::Acquire) & 1 != 0
    }

    /// Whether this pool serves `stream` and is not retired (lock-free).
    #[inline]
    pub(crate) fn serves(&self, stream: usize) -> bool {
        self.key.load(Ordering::Acquire) == stream << 1
    }

    /// Whether this pool is the retired pool of `stream`.
    pub(crate) fn retired_for(&self, stream: usize) -> bool {
        self.key.load(Ordering::Acquire) == stream << 1 | 1
    }

    /// The stream this pool serves (0 unless stream-ordered).
    #[inline]
    pub fn stream(&self) -> usize {
        self.key.load(Ordering::Acquire) >> 1
    }

    /// Whether this pool is one of a device's stream-ordered pools.
    pub fn is_stream_ordered(&self) -> bool {
        self.group.is_some()
    }

    /// Whether the pool held more free memory than `retain` allows at its last look, with
    /// nothing it could give back (see `enforce_retain`).
    #[inline]
    pub(crate) fn over_retain(&self) -> bool {
        self.over_retain.load(Ordering::Relaxed)
    }

    /// The pool holds more free memory than `retain` allows and could give none back: what
    /// may pin its chunks goes back to the spans (slots cached for slabs with no live block,
    /// then kept empty slabs), so that the chunks can go. The caller holds no lock of the pool.
    #[cold]
    pub(super) fn release_pinning(&'static self) {
        tcache::release_dead(self);
        if self.over_retain() {
            self.release_empty_slabs();
        }
    }

    fn set_over_retain(&self, over: bool) {
        if self.over_retain.load(Ordering::Relaxed) != over {
            self.over_retain.store(over, Ordering::Relaxed);
        }
    }

    /// Whether freed memory must be fenced with events before another stream uses it.
    fn ordered(&self) -> bool {
        self.group.is_some_and(|g| g.ordered())
    }

    /// Wait on the host for the work queued on this pool's stream (a retired stream: for its
    /// retire event), before the host writes memory the pool handed out: a stream-ordered pool
    /// hands out memory freed in its stream's order, which kernels queued before the free may
    /// still use. Nothing for pools whose reuse is not ordered by events.
    pub(crate) fn host_wait(&'static self) {
        if !self.ordered() {
            return;
        }
        let waited = if self.is_retired() {
            let fence = lock(&self.retire_event).clone();
            fence.is_none_or(|ev| ev.wait().is_ok())
        } else {
            cuda::stream_synchronize(self.stream(), self.device).is_ok()
        };
        if !waited {
            let _ = cuda::device_synchronize(self.device);
        }
    }

    #[inline]
    pub fn kind(&self) -> Kind {
        self.kind
    }

    #[inline]
    pub fn device(&self) -> i32 {
        self.device
    }

    pub fn alignment(&self) -> usize {
        self.table.align
    }

    /// The size classes of this pool.
    pub fn classes(&self) -> &ClassTable {
        &self.table
    }

    pub fn backing(&self) -> &dyn Backing {
        &*self.backing
    }

    /// Allocate `n` bytes (0 is allowed and yields a unique block).
    #[inline]
    pub fn alloc(&'static self, n: usize) -> Result<Alloc> {
        if n > MAX_REQUEST {
            return Err(Error::bad_size(format!(
                "size {n} is too large (the limit is {MAX_REQUEST})"
            )));
        }
        if n <= SMALL_MAX {
            self.alloc_small(n)
        } else {
            let a = self.alloc_large(n)?;
            self.stats.allocs.fetch_add(1, Ordering::Relaxed);
            self.stats.add_in_use(n);
            Ok(a)
        }
    }

    /// Allocate `n` bytes (more than [`SMALL_MAX`]) as a whole chunk of its own, exactly as
    /// long as the request rounded to the granule: its start is the start of what the backing
    /// mapped. CUDA IPC exports a driver allocation whole (a handle opens at the allocation's
    /// base), so a block shared between processes must be an allocation of its own.
    pub fn alloc_whole(&'static self, n: usize) -> Result<Alloc> {
        if n > MAX_REQUEST || n <= SMALL_MAX {
            return Err(Error::bad_size(format!(
                "size {n} is outside {}..={MAX_REQUEST} for a chunk of its own",
                SMALL_MAX + 1
            )));
        }
        let span = self.take_whole(n.next_multiple_of(GRANULE), n)?;
        let zeroed = !span.dirty.swap(true, Ordering::Relaxed);
        self.stats.allocs.fetch_add(1, Ordering::Relaxed);
        self.stats.add_in_use(n);
        Ok(Alloc {
            ptr: span.start(),
            zeroed,
        })
    }

    /// Free the block starting at `ptr`. Errors leave everything as it was.
    pub fn free(&'static self, ptr: usize) -> Result<usize> {
        match pool_at(ptr) {
            Some(p) if std::ptr::eq(p, self) => free_block(ptr),
            _ => Err(Error::not_ours(format!(
                "{ptr:#x} was not allocated by this pool"
            ))),
        }
    }

    /// Return every cached byte that can be returned, whichever thread cached it: thread
    /// caches go back to their slabs, empty slabs to the spans, the exact-size list to the
    /// free set, and wholly free chunks to the backing. Returns the bytes given back to the
    /// backing meanwhile.
    pub fn trim(&'static self) -> usize {
        let before = self.unmapped.load(Ordering::Relaxed);
        self.release_held(true);
        if self.is_stream_ordered() {
            self.drain_hot();
        } else {
            tcache::reclaim(Some(self));
        }
        self.release_empty_slabs();
        let mut lg = lock(&self.large);
        self.flush_quick(&mut lg);
        self.flush_discards(&mut lg);
        if self.lazy() {
            self.purge(&mut lg, commit::Purge::All);
        }
        self.release_free_chunks(&mut lg, 0);
        drop(lg);
        self.unmapped.load(Ordering::Relaxed) - before
    }

    /// Everything an out-of-memory retry may give back first: the device's idle memory of
    /// every stream for a stream-ordered pool, this pool's whole cache otherwise, and that of
    /// the pool it shares its counters and limit with (see [`share_limit_with`]).
    ///
    /// [`share_limit_with`]: Self::share_limit_with
    fn reclaim_for_retry(&'static self) {
        match self.group {
            Some(g) => {
                g.release_idle();
            }
            None => {
                self.trim();
                if let Some(peer) = self.peer.get() {
                    peer.trim();
                }
            }
        }
    }

    /// This pool is the host side's primary pool: the malloc family's small allocations may
    /// come from its thread caches without going through the host side's choice of pool.
    /// Before the first allocation.
    pub fn mark_host_primary(&self) {
        self.host_primary.store(true, Ordering::Relaxed);
    }

    /// Whether this is the host side's primary pool.
    pub(crate) fn is_host_primary(&self) -> bool {
        self.host_primary.load(Ordering::Relaxed)
    }

    /// `self` and `other` share their counters, and so the limit (`new_shared`: the host
    /// side's primary and fallback pools): an allocation refused for the limit in one first
    /// gives back what both cache.
    pub fn share_limit_with(&'static self, other: &'static Pool) {
        debug_assert!(std::ptr::eq(self.stats, other.stats));
        let _ = self.peer.set(other);
        let _ = other.peer.set(self);
    }

    /// Resize without copying: a small block whose class still fits `n`, a large block whose
    /// span shrinks or grows (see `grow`). Returns where the block is now (a large block on
    /// plain host memory may move with its pages, no byte copied), or None when resizing needs
    /// a copy (nothing changed then).
    pub fn resize_in_place(&'static self, info: &BlockInfo, n: usize) -> Option<usize> {
        if n > MAX_REQUEST {
            return None; // refused by the allocation the caller falls back to
        }
        match entry_at(info.base)? {
            Entry::Slab(s) => {
                // realloc frees the old block: one a fork child may read moves (`hold`).
                let fits = n <= info.capacity
                    && n <= SMALL_MAX
                    && self.table.class_of(n) == s.class
                    && !s.held_for_children();
                if fits && s.resize(info.base, n) {
                    self.stats.on_resize(info.size, n);
                    return Some(info.base);
                }
                None
            }
            Entry::Span(sp) if n > SMALL_MAX => self.resize_large(sp, info.base, n),
            Entry::Span(_) => None,
        }
    }

    /// What this pool holds now (read under its locks, one at a time: a snapshot per field).
    pub fn report(&'static self) -> PoolReport {
        let (mapped, reserved, largest_free) = {
            let lg = lock(&self.large);
            let largest = if self.lazy() {
                self.largest_committed_free(&lg)
            } else {
                lg.largest_free()
            };
            (self.mapped_of(&lg), lg.chunk_bytes(), largest)
        };
        PoolReport {
            stream: self.stream(),
            retired: self.is_retired(),
            mapped,
            reserved,
            cached: self.cached_bytes(),
            largest_free,
            kind: self.kind(),
        }
    }

    /// Bytes of free memory held in chunks, slabs and thread caches (mapped, not handed out).
    pub fn cached_bytes(&'static self) -> usize {
        let spans = {
            let lg = lock(&self.large);
            if self.lazy() {
                lg.free_committed()
            } else {
                lg.free_bytes()
            }
        };
        let slots: usize = self
            .classes
            .iter()
            .enumerate()
            .map(|(ci, c)| lock(c).free_slots() * self.table.sizes[ci])
            .sum();
        let threads = if self.is_stream_ordered() {
            self.hot_bytes()
        } else {
            tcache::cached_bytes(self)
        };
        spans + slots + threads
    }

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
