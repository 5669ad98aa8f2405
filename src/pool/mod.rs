//! The pool: a caching sub-allocator over one backing (RMM's pool adaptor over a resource).
//!
//! - Chunks come from the backing (large, granule-aligned) and are cut into *spans* (granule
//!   multiples) by best fit, with splitting and coalescing. Free spans sit in an ordered set
//!   keyed by (length, address), so finding the best fit costs O(log n) in the number of free
//!   spans, never a scan.
//! - Small requests (up to [`SMALL_MAX`]) are served from *slabs*: spans cut into equal slots of
//!   one size class. A class keeps a LIFO stack of free slots, so a cached alloc+free is a pop
//!   and a push under one uncontended lock.
//! - All bookkeeping lives outside the memory itself (device memory is not host-readable), in
//!   descriptors the registry points to. Descriptors are never freed, only recycled inside
//!   their pool, so lock-free readers (`lookup`) can always dereference what they load.
//!
//! Files: `class` (size classes), `slab` (small blocks), `span` (large blocks, chunks, the
//! exact-size list), `tcache` (per-thread caches of free slots); this file holds the pool
//! itself, its public operations and the lock-free lookup.

use crate::backing::{Backing, Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::cuda;
use crate::registry::{self, GRANULE};
use crate::stats::PoolStats;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

mod class;
mod slab;
mod span;
mod tcache;

pub use class::ClassTable;
use slab::{ClassState, Slab};
use span::{Large, Span};
pub use tcache::flush_thread_counts;
use tcache::{ensure_tcache, with_tcache};

/// Largest request served from slabs; larger ones get spans of their own.
pub(crate) const SMALL_MAX: usize = 256 << 10;
/// Default size of a chunk that spans are cut from. Requests of half of it or more get a
/// chunk of their own.
pub(crate) const ARENA: usize = 64 << 20;
/// Largest slab.
const SLAB_MAX: usize = 4 << 20;
/// Largest request accepted at all (keeps every size computation far from overflow).
pub(crate) const MAX_REQUEST: usize = isize::MAX as usize / 2;

const TAG_SPAN: usize = 1;
const TAG_SLAB: usize = 2;
const TAG_MASK: usize = 3;

const SPAN_FREE: u8 = 0;
const SPAN_USED: u8 = 1;
const SPAN_SLAB: u8 = 2;
/// Freed, kept whole in the exact-size list (not in the free set, never merged).
const SPAN_CACHED: u8 = 3;

/// Freed spans kept whole for reuse by a request of exactly their length (PyTorch's and
/// CuPy's common case: the same shapes every iteration). Bounded; the oldest is merged into
/// the free set when it overflows, and all are whenever a request finds nothing else.
const QUICK_MAX: usize = 32;
/// Most bytes the exact-size list holds (and never more than the pool's `retain`).
const QUICK_MAX_BYTES: usize = 256 << 20;

/// Lock a mutex, ignoring poisoning: a panic caught at the C boundary must not wedge the pool.
/// Every critical section keeps the state consistent at each point a panic could occur.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a stream-ordered pool needs from the set of pools of its device (implemented one
/// layer up, by `stream::StreamPools`), so that dependencies point down.
pub trait Group: Send + Sync {
    /// Whether events order reuse across streams (false without a CUDA driver).
    fn ordered(&self) -> bool;
    /// Count a cross-stream reuse that had to synchronise instead of waiting on an event.
    fn count_sync(&self);
    /// An idle chunk of at least `min` bytes of another stream's pool, adopted for `taker`
    /// and ordered after that stream's work.
    fn steal(&self, taker: &'static Pool, min: usize) -> Option<Chunk>;
    /// Under the device's limit, give back idle memory of every stream so that `want` (or at
    /// least `need`) more bytes fit.
    fn make_room(&self, want: usize, need: usize);
    /// Give back idle memory of every stream. Returns the bytes given back.
    fn release_idle(&self) -> usize;
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
    /// The stream this pool's blocks are used on (stream-ordered pools; 0 otherwise).
    stream: usize,
    /// The device's set of stream pools this pool belongs to, if it is stream-ordered.
    group: Option<&'static dyn Group>,
    /// The stream was retired (about to be destroyed): its handle is never used again, and
    /// `retire_event` (recorded at retirement) orders everything it ran.
    retired: AtomicBool,
    pub(crate) retire_event: Mutex<Option<cuda::Event>>,
    limit: Option<usize>,
    /// Free bytes kept in otherwise empty chunks before they go back to the backing.
    retain: usize,
}

/// Descriptor a registry entry points at.
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

/// Free the block starting at `ptr`, whichever pool it belongs to (one registry lookup).
/// Returns the bytes it held. Errors leave everything as it was.
#[inline]
pub fn free_block(ptr: usize) -> Result<usize> {
    let (pool, freed) = match entry_at(ptr) {
        Some(Entry::Slab(s)) => (s.pool, s.pool.free_small(s, ptr)?),
        Some(Entry::Span(sp)) => {
            let n = sp.pool.free_large(sp, ptr)?;
            sp.pool.stats.frees.fetch_add(1, Ordering::Relaxed);
            (sp.pool, n)
        }
        None => {
            return Err(Error::not_ours(format!(
                "{ptr:#x} was not allocated by ump-alloc"
            )));
        }
    };
    pool.stats.sub_in_use(freed);
    Ok(freed)
}

/// The pool whose memory holds `addr` (live block or cached), if any. Lock-free.
pub fn pool_at(addr: usize) -> Option<&'static Pool> {
    match entry_at(addr)? {
        Entry::Span(s) => Some(s.pool),
        Entry::Slab(s) => Some(s.pool),
    }
}

/// Find the live block containing `addr` (any pool). Lock-free.
#[inline]
pub fn lookup(addr: usize) -> Option<BlockInfo> {
    match entry_at(addr)? {
        Entry::Slab(s) => {
            let base = s.base.load(Ordering::Acquire);
            let off = addr.checked_sub(base)?;
            let idx = s.slot_of(off);
            if idx >= s.nslots || s.state[idx].load(Ordering::Acquire) == 0 {
                return None;
            }
            Some(BlockInfo {
                pool: s.pool,
                base: base + idx * s.slot,
                size: s.sizes[idx].load(Ordering::Relaxed) as usize,
                capacity: s.slot,
            })
        }
        Entry::Span(sp) => {
            if sp.state.load(Ordering::Acquire) != SPAN_USED {
                return None;
            }
            let start = sp.start.load(Ordering::Acquire);
            let len = sp.len.load(Ordering::Acquire);
            if addr < start || addr >= start + len {
                return None;
            }
            Some(BlockInfo {
                pool: sp.pool,
                base: start,
                size: sp.req.load(Ordering::Relaxed),
                capacity: len,
            })
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("kind", &self.kind())
            .field("device", &self.device())
            .finish()
    }
}

impl Pool {
    /// Make a pool. Pools live for the whole process (descriptors point back at them).
    pub fn new(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
    ) -> &'static Pool {
        let stats = Box::leak(Box::new(PoolStats::default()));
        Self::build(backing, align, limit, retain, stats, None, 0)
    }

    /// Make the pool of `stream` inside a device's stream pools, sharing their counters.
    pub fn for_stream(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        group: &'static dyn Group,
        stats: &'static PoolStats,
        stream: usize,
    ) -> &'static Pool {
        Self::build(backing, align, limit, retain, stats, Some(group), stream)
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
        let table = ClassTable::new(align);
        let classes = (0..table.len())
            .map(|_| Mutex::new(ClassState::default()))
            .collect();
        Box::leak(Box::new(Pool {
            kind: backing.kind(),
            device: backing.device(),
            backing,
            table,
            classes,
            large: Mutex::new(Large::default()),
            stats,
            stream,
            group,
            retired: AtomicBool::new(false),
            retire_event: Mutex::new(None),
            limit,
            retain,
        }))
    }

    /// Whether this pool's stream was retired.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Retire this pool's stream: record the event that covers all its work, then never
    /// touch the handle again.
    pub(crate) fn retire(&self) {
        let ev = cuda::Event::record(self.stream, self.device).ok();
        if ev.is_none() {
            let _ = cuda::device_synchronize(self.device);
        }
        *lock(&self.retire_event) = ev;
        self.retired.store(true, Ordering::Release);
        // Chunk events were recorded on the same stream earlier: the retire event covers them.
        lock(&self.large).events.clear();
    }

    /// The stream this pool serves (0 unless stream-ordered).
    #[inline]
    pub fn stream(&self) -> usize {
        self.stream
    }

    /// The device's stream pools, when this pool is stream-ordered.
    pub fn group(&self) -> Option<&'static dyn Group> {
        self.group
    }

    /// Whether this pool is one of a device's stream-ordered pools.
    pub fn is_stream_ordered(&self) -> bool {
        self.group.is_some()
    }

    /// Whether freed memory must be fenced with events before another stream uses it.
    fn ordered(&self) -> bool {
        self.group.is_some_and(|g| g.ordered())
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
        let a = if n <= SMALL_MAX {
            self.alloc_small(n)?
        } else {
            let a = self.alloc_large(n)?;
            self.stats.allocs.fetch_add(1, Ordering::Relaxed);
            a
        };
        self.stats.add_in_use(n);
        Ok(a)
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

    /// Return every cached byte that can be returned: empty slabs go back to spans, wholly
    /// free chunks go back to the backing. Returns the bytes given back to the backing.
    pub fn trim(&'static self) -> usize {
        self.trim_slabs();
        let mut lg = lock(&self.large);
        self.flush_quick(&mut lg);
        self.release_free_chunks(&mut lg, 0)
    }

    /// Resize in place when the block's capacity already fits `n` without wasting more than
    /// half of it. Returns true when done.
    pub fn resize_in_place(&'static self, info: &BlockInfo, n: usize) -> bool {
        if n > info.capacity {
            return false;
        }
        match entry_at(info.base) {
            Some(Entry::Slab(s)) if n <= SMALL_MAX && self.table.class_of(n) == s.class => {
                let idx = (info.base - s.base.load(Ordering::Relaxed)) / s.slot;
                s.sizes[idx].store(n as u32, Ordering::Relaxed);
            }
            Some(Entry::Span(sp))
                if n > SMALL_MAX && n.next_multiple_of(GRANULE) == info.capacity =>
            {
                sp.req.store(n, Ordering::Relaxed);
            }
            _ => return false,
        }
        self.stats.on_resize(info.size, n);
        true
    }

    /// Bytes of free memory held in chunks and slabs (mapped but not handed out).
    pub fn cached_bytes(&self) -> usize {
        let lg = lock(&self.large);
        let spans: usize = lg.free.iter().map(|f| f.0).sum::<usize>()
            + lg.quick
                .iter()
                .map(|sp| sp.len.load(Ordering::Relaxed))
                .sum::<usize>();
        drop(lg);
        let slots: usize = self
            .classes
            .iter()
            .enumerate()
            .map(|(ci, c)| lock(c).free.len() * self.table.sizes[ci])
            .sum();
        spans + slots
    }
}

fn double_free(ptr: usize) -> Error {
    Error::double_free(format!("double free of {ptr:#x}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::HostBacking;

    fn pool(align: usize) -> &'static Pool {
        Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            align,
            None,
            0,
        )
    }

    #[test]
    fn class_table_is_monotone_and_aligned() {
        for align in [16, 64, 512, 4096, 65536] {
            let t = ClassTable::new(align);
            assert!(t.sizes.windows(2).all(|w| w[0] < w[1]));
            assert!(t.sizes.iter().all(|s| s % align == 0));
            assert_eq!(*t.sizes.last().unwrap(), SMALL_MAX);
            for n in [0, 1, align - 1, align, align + 1, 5000, 100_000, SMALL_MAX] {
                let c = t.class_of(n);
                assert!(t.size(c) >= n, "{n} -> {}", t.size(c));
                if c > 0 {
                    assert!(t.size(c - 1) < n.max(1), "{n} not in the tightest class");
                }
            }
        }
    }

    #[test]
    fn small_and_large_blocks_roundtrip() {
        let p = pool(512);
        let mut blocks = Vec::new();
        for n in [
            0,
            1,
            100,
            512,
            513,
            4096,
            70_000,
            SMALL_MAX,
            SMALL_MAX + 1,
            3 << 20,
            40 << 20,
        ] {
            let a = p.alloc(n).unwrap();
            assert_eq!(a.ptr % 512, 0);
            let info = lookup(a.ptr + n / 2).unwrap();
            assert_eq!(info.base, a.ptr);
            assert_eq!(info.size, n);
            assert!(info.capacity >= n);
            // SAFETY: host memory of at least n bytes.
            unsafe { std::ptr::write_bytes(a.ptr as *mut u8, 0xab, n) };
            blocks.push((a.ptr, n));
        }
        let ptrs: std::collections::HashSet<_> = blocks.iter().map(|b| b.0).collect();
        assert_eq!(ptrs.len(), blocks.len(), "blocks are distinct");
        for (ptr, n) in blocks {
            assert_eq!(p.free(ptr).unwrap(), n);
            assert!(lookup(ptr).is_none());
        }
    }

    #[test]
    fn double_free_and_interior_pointer_are_refused() {
        let p = pool(512);
        for n in [64, 1 << 20] {
            let a = p.alloc(n).unwrap().ptr;
            let e = p.free(a + 16).unwrap_err();
            assert!(e.msg.contains("inside"), "{}", e.msg);
            p.free(a).unwrap();
            let e = p.free(a).unwrap_err();
            assert!(e.msg.contains("double free"), "{}", e.msg);
        }
        let x = 5u64;
        assert!(p.free(&x as *const u64 as usize).is_err());
    }

    #[test]
    fn spans_coalesce_and_chunks_go_back() {
        let p = pool(512);
        let a = p.alloc(1 << 20).unwrap().ptr;
        let b = p.alloc(1 << 20).unwrap().ptr;
        let c = p.alloc(1 << 20).unwrap().ptr;
        assert_eq!(p.stats.mapped.load(Ordering::Relaxed), ARENA);
        p.free(b).unwrap();
        p.free(a).unwrap();
        p.free(c).unwrap();
        // With retain 0 the arena is whole again and goes back at once.
        assert_eq!(p.stats.mapped.load(Ordering::Relaxed), 0);
        assert_eq!(lock(&p.large).free.len(), 0);
    }

    #[test]
    fn exact_sizes_come_back_whole_and_merge_when_needed() {
        let p = Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            512,
            None,
            usize::MAX,
        );
        let keep = p.alloc(300 << 10).unwrap().ptr;
        let a = p.alloc(1 << 20).unwrap().ptr;
        let b = p.alloc(2 << 20).unwrap().ptr;
        p.free(a).unwrap();
        p.free(b).unwrap();
        assert!(
            lookup(a).is_none() && lookup(b + 5).is_none(),
            "cached spans are not live"
        );
        assert!(p.free(a).is_err(), "a double free of a cached span is seen");
        assert!(p.cached_bytes() >= 3 << 20);
        assert_eq!(
            p.alloc(2 << 20).unwrap().ptr,
            b,
            "exact size: the same span"
        );
        assert_eq!(p.alloc(1 << 20).unwrap().ptr, a);
        // Fill the arena, then free a and b: only merged do they serve 3 MiB.
        let rest = ARENA - (320 << 10) - (3 << 20);
        let f1 = p.alloc(31 << 20).unwrap().ptr;
        let f2 = p.alloc(rest - (31 << 20)).unwrap().ptr;
        let mapped = p.stats.mapped.load(Ordering::Relaxed);
        assert_eq!(mapped, ARENA);
        p.free(a).unwrap();
        p.free(b).unwrap();
        let c = p.alloc(3 << 20).unwrap().ptr;
        assert_eq!(c, b, "a and b merged");
        assert_eq!(
            p.stats.mapped.load(Ordering::Relaxed),
            mapped,
            "nothing new mapped"
        );
        for x in [c, f1, f2, keep] {
            p.free(x).unwrap();
        }
        assert_eq!(p.trim(), ARENA);
        assert_eq!(p.stats.mapped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn best_fit_reuses_the_tightest_hole() {
        let p = Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            512,
            None,
            usize::MAX,
        );
        let big = p.alloc(8 << 20).unwrap().ptr;
        let sep1 = p.alloc(1 << 20).unwrap().ptr;
        let small = p.alloc(2 << 20).unwrap().ptr;
        let _sep2 = p.alloc(1 << 20).unwrap().ptr;
        p.free(big).unwrap();
        p.free(small).unwrap();
        let again = p.alloc(2 << 20).unwrap().ptr;
        assert_eq!(again, small, "the 2 MiB hole fits best");
        p.free(again).unwrap();
        p.free(sep1).unwrap();
    }

    #[test]
    fn fresh_large_blocks_are_zeroed_and_reused_ones_are_not() {
        let p = Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            512,
            None,
            usize::MAX,
        );
        let a = p.alloc(2 << 20).unwrap();
        assert!(a.zeroed);
        p.free(a.ptr).unwrap();
        let b = p.alloc(2 << 20).unwrap();
        assert!(!b.zeroed);
        p.free(b.ptr).unwrap();
    }

    #[test]
    fn limit_fails_cleanly() {
        let p = Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            512,
            Some(48 << 20),
            0,
        );
        let a = p.alloc(40 << 20).unwrap().ptr;
        let e = p.alloc(40 << 20).unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_OOM);
        assert!(e.msg.contains("UMP_ALLOC_LIMIT"), "{}", e.msg);
        p.free(a).unwrap();
        let b = p.alloc(40 << 20).unwrap().ptr;
        p.free(b).unwrap();
    }

    #[test]
    fn trim_returns_empty_slabs() {
        let p = Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            512,
            None,
            usize::MAX,
        );
        let v: Vec<usize> = (0..1000).map(|_| p.alloc(700).unwrap().ptr).collect();
        for x in v {
            p.free(x).unwrap();
        }
        assert!(p.stats.mapped.load(Ordering::Relaxed) > 0);
        p.trim();
        assert_eq!(p.stats.mapped.load(Ordering::Relaxed), 0);
        assert_eq!(p.cached_bytes(), 0);
        // Still usable afterwards.
        let x = p.alloc(700).unwrap().ptr;
        p.free(x).unwrap();
    }

    #[test]
    fn threads_churn() {
        let p = pool(64);
        let hs: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..20_000usize {
                        let n = (i * 7919 + t * 31) % 5000 + if i % 97 == 0 { 400_000 } else { 0 };
                        let a = p.alloc(n).unwrap().ptr;
                        // SAFETY: host memory of n bytes.
                        unsafe { std::ptr::write_bytes(a as *mut u8, t as u8, n.min(64)) };
                        live.push((a, n, t as u8));
                        if live.len() > 50 {
                            let (a, n, tag) = live.swap_remove(i % 50);
                            // SAFETY: still ours.
                            let s =
                                unsafe { std::slice::from_raw_parts(a as *const u8, n.min(64)) };
                            assert!(s.iter().all(|&b| b == tag));
                            p.free(a).unwrap();
                        }
                    }
                    for (a, _, _) in live {
                        p.free(a).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(p.stats.in_use.load(Ordering::Relaxed), 0);
    }
}
