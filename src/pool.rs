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

use crate::backing::{Backing, Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::cuda;
use crate::registry::{self, GRANULE};
use crate::stats::PoolStats;
use crate::stream::StreamPools;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

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

/// Size classes for one alignment.
pub struct ClassTable {
    align: usize,
    align_shift: u32,
    sizes: Vec<usize>,
    slab_bytes: Vec<usize>,
    /// Class index by `ceil(n / align)`, for `n <= SMALL_MAX`.
    lookup: Vec<u8>,
}

impl ClassTable {
    pub fn new(align: usize) -> Self {
        assert!(align.is_power_of_two() && (16..=GRANULE).contains(&align));
        let mut sizes: Vec<usize> = (1..=8)
            .map(|k| k * align)
            .filter(|&s| s <= SMALL_MAX)
            .collect();
        let mut base = 8 * align;
        while base < SMALL_MAX {
            for m in [5, 6, 7, 8] {
                let s = (base * m / 4).next_multiple_of(align);
                if s <= SMALL_MAX && s > *sizes.last().unwrap() {
                    sizes.push(s);
                }
            }
            base *= 2;
        }
        assert!(sizes.len() < 256);
        let slab_bytes = sizes
            .iter()
            .map(|&s| (s * 32).next_power_of_two().clamp(GRANULE, SLAB_MAX))
            .collect();
        let mut lookup = vec![0u8; SMALL_MAX / align + 1];
        let mut ci = 0;
        for (q, slot) in lookup.iter_mut().enumerate() {
            while sizes[ci] < q * align {
                ci += 1;
            }
            *slot = ci as u8;
        }
        ClassTable {
            align,
            align_shift: align.trailing_zeros(),
            sizes,
            slab_bytes,
            lookup,
        }
    }

    /// The class serving `n` bytes (`n <= SMALL_MAX`).
    #[inline]
    pub fn class_of(&self, n: usize) -> usize {
        self.lookup[(n + self.align - 1) >> self.align_shift] as usize
    }

    pub fn size(&self, ci: usize) -> usize {
        self.sizes[ci]
    }

    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}

/// Descriptor of a span: a granule-aligned range inside one chunk.
pub struct Span {
    pool: &'static Pool,
    start: AtomicUsize,
    len: AtomicUsize,
    state: AtomicU8,
    /// Requested bytes while used.
    req: AtomicUsize,
    chunk_base: AtomicUsize,
    chunk_len: AtomicUsize,
    /// Whether the span may hold non-zero bytes (false only for never-used backing memory
    /// that reads as zero).
    dirty: AtomicBool,
}

/// Descriptor of a slab: a span cut into equal slots of one class.
pub struct Slab {
    pool: &'static Pool,
    class: usize,
    slot: usize,
    nslots: usize,
    base: AtomicUsize,
    span: AtomicUsize,
    /// Reciprocal of `slot` for division by multiplication: `idx = off * magic >> 64`.
    magic: u64,
    /// One byte per slot: 1 while the slot is handed out. A byte (not a bit) so that handing
    /// a slot out is a plain store; freeing swaps, so a double free is always seen.
    state: Box<[AtomicU8]>,
    /// Requested bytes per live slot.
    sizes: Box<[AtomicU32]>,
    live: AtomicUsize,
}

impl Slab {
    /// Slot index of byte offset `off` (exact for offsets below 2^32).
    #[inline]
    fn slot_of(&self, off: usize) -> usize {
        ((off as u128 * self.magic as u128) >> 64) as usize
    }

    fn span(&self) -> &'static Span {
        // SAFETY: `span` always holds a pointer to a leaked, never-freed Span descriptor.
        unsafe { &*(self.span.load(Ordering::Acquire) as *const Span) }
    }
}

#[derive(Default)]
struct ClassState {
    /// Free slots, most recently freed last.
    free: Vec<(&'static Slab, u32)>,
    /// Every slab of the class that is in use.
    slabs: Vec<&'static Slab>,
    /// Recycled descriptors.
    spare: Vec<&'static Slab>,
}

#[derive(Default)]
struct Large {
    /// Free spans keyed by (length, start).
    free: BTreeSet<(usize, usize)>,
    chunks: Vec<Chunk>,
    spare: Vec<&'static Span>,
    /// Bytes in free spans that cover a whole chunk (what can go back to the backing).
    idle: usize,
    /// Stream-ordered pools only: for each wholly free chunk (by base), the event recorded on
    /// the pool's stream when it fell idle. Another stream may use the chunk once it waits
    /// for the event; this stream may use it at once.
    events: Vec<(usize, cuda::Event)>,
    /// The exact-size list (oldest first): spans in state CACHED.
    quick: std::collections::VecDeque<&'static Span>,
    quick_bytes: usize,
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
    group: Option<&'static StreamPools>,
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
        group: &'static StreamPools,
        stream: usize,
    ) -> &'static Pool {
        Self::build(
            backing,
            align,
            limit,
            retain,
            group.stats,
            Some(group),
            stream,
        )
    }

    fn build(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        stats: &'static PoolStats,
        group: Option<&'static StreamPools>,
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
    pub fn group(&self) -> Option<&'static StreamPools> {
        self.group
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

    // ---- small blocks ------------------------------------------------------------------

    #[inline]
    fn alloc_small(&'static self, n: usize) -> Result<Alloc> {
        let ci = self.table.class_of(n);
        let cached = with_tcache(self, |tc| tc.pop(ci)).flatten();
        let (slab, idx) = match cached {
            Some(x) => x,
            None => {
                let x = self.refill(ci)?;
                self.stats.allocs.fetch_add(1, Ordering::Relaxed);
                x
            }
        };
        let i = idx as usize;
        slab.sizes[i].store(n as u32, Ordering::Relaxed);
        slab.state[i].store(1, Ordering::Release);
        let ptr = slab.base.load(Ordering::Relaxed) + i * slab.slot;
        Ok(Alloc { ptr, zeroed: false })
    }

    /// Slow path of a small allocation: take slots from the class under its lock (growing the
    /// class when it has none), one to return and a batch for this thread's cache.
    fn refill(&'static self, ci: usize) -> Result<(&'static Slab, u32)> {
        let mut st = lock(&self.classes[ci]);
        if st.free.is_empty() {
            // Counts a hit (span reused) or a miss (chunk mapped) for this allocation.
            self.grow_class(ci, &mut st)?;
        } else {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
        }
        let caching = ensure_tcache(self);
        let take = if caching {
            st.free.len().min(TCACHE_BATCH)
        } else {
            1
        };
        let keep = st.free.len() - take;
        let batch = st.free.split_off(keep);
        // `live` counts slots outside the class list (handed out or in a thread cache); it
        // changes only under the class lock, so trim never takes a slab that has one out.
        for (slab, _) in &batch {
            slab.live.fetch_add(1, Ordering::Relaxed);
        }
        drop(st);
        let mut batch = batch;
        let one = batch.pop().expect("at least one free slot");
        if !batch.is_empty() {
            with_tcache(self, |tc| tc.bins[ci].extend(batch));
        }
        Ok(one)
    }

    /// Return slots to their class lists (thread-cache flush).
    fn return_slots(&'static self, ci: usize, slots: impl Iterator<Item = (&'static Slab, u32)>) {
        let mut st = lock(&self.classes[ci]);
        for (slab, idx) in slots {
            slab.live.fetch_sub(1, Ordering::Relaxed);
            st.free.push((slab, idx));
        }
    }

    fn grow_class(&'static self, ci: usize, st: &mut ClassState) -> Result<()> {
        let bytes = self.table.slab_bytes[ci];
        let slot = self.table.sizes[ci];
        let nslots = bytes / slot;
        let span = self.take_span(bytes)?;
        let slab = st.spare.pop().unwrap_or_else(|| {
            Box::leak(Box::new(Slab {
                pool: self,
                class: ci,
                slot,
                nslots,
                base: AtomicUsize::new(0),
                span: AtomicUsize::new(0),
                magic: (u64::MAX / slot as u64) + 1,
                state: (0..nslots).map(|_| AtomicU8::new(0)).collect(),
                sizes: (0..nslots).map(|_| AtomicU32::new(0)).collect(),
                live: AtomicUsize::new(0),
            }))
        });
        let start = span.start.load(Ordering::Relaxed);
        slab.base.store(start, Ordering::Release);
        slab.span
            .store(span as *const Span as usize, Ordering::Release);
        span.state.store(SPAN_SLAB, Ordering::Release);
        span.dirty.store(true, Ordering::Relaxed);
        registry::set_range(start, bytes, slab as *const Slab as usize | TAG_SLAB);
        st.slabs.push(slab);
        st.free.reserve(nslots);
        // Lowest addresses pop first.
        st.free.extend((0..nslots as u32).rev().map(|i| (slab, i)));
        Ok(())
    }

    #[inline]
    fn free_small(&'static self, s: &'static Slab, ptr: usize) -> Result<usize> {
        let off = ptr - s.base.load(Ordering::Acquire);
        let idx = s.slot_of(off);
        if idx * s.slot != off || idx >= s.nslots {
            return Err(Error::not_ours(format!(
                "{ptr:#x} points inside a block, not at its start"
            )));
        }
        if s.state[idx].swap(0, Ordering::AcqRel) == 0 {
            return Err(double_free(ptr));
        }
        let n = s.sizes[idx].load(Ordering::Relaxed) as usize;
        // Only a cache made by an allocation on this thread is used: a free never makes one.
        let cached = with_tcache(self, |tc| tc.push(self, s, idx as u32)).is_some();
        if !cached {
            self.return_slots(s.class, std::iter::once((s, idx as u32)));
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Give every empty slab back to the span allocator. Returns bytes released to spans.
    fn trim_slabs(&'static self) -> usize {
        with_tcache(self, |tc| tc.flush(self));
        let mut released = 0;
        for cls in self.classes.iter() {
            let mut st = lock(cls);
            let empty: Vec<&'static Slab> = st
                .slabs
                .iter()
                .copied()
                .filter(|s| s.live.load(Ordering::Acquire) == 0)
                .collect();
            if empty.is_empty() {
                continue;
            }
            st.free.retain(|(s, _)| s.live.load(Ordering::Acquire) != 0);
            st.slabs.retain(|s| s.live.load(Ordering::Acquire) != 0);
            for s in empty {
                let span = s.span();
                let len = span.len.load(Ordering::Relaxed);
                registry::set_range(
                    span.start.load(Ordering::Relaxed),
                    len,
                    span as *const Span as usize | TAG_SPAN,
                );
                span.state.store(SPAN_USED, Ordering::Release);
                released += len;
                self.release_span(span);
                st.spare.push(s);
            }
        }
        released
    }

    // ---- large blocks ------------------------------------------------------------------

    fn alloc_large(&'static self, n: usize) -> Result<Alloc> {
        let len = n.next_multiple_of(GRANULE);
        let span = self.take_span(len)?;
        span.req.store(n, Ordering::Relaxed);
        let zeroed = !span.dirty.swap(true, Ordering::Relaxed);
        let start = span.start.load(Ordering::Relaxed);

        Ok(Alloc { ptr: start, zeroed })
    }

    fn free_large(&'static self, sp: &'static Span, ptr: usize) -> Result<usize> {
        let mut lg = lock(&self.large);
        let state = sp.state.load(Ordering::Acquire);
        let start = sp.start.load(Ordering::Acquire);
        if (state == SPAN_FREE || state == SPAN_CACHED)
            && ptr >= start
            && ptr < start + sp.len.load(Ordering::Relaxed)
        {
            return Err(double_free(ptr));
        }
        if state != SPAN_USED {
            return Err(Error::not_ours(format!("{ptr:#x} is not a live block")));
        }
        if ptr != start {
            return Err(Error::not_ours(format!(
                "{ptr:#x} points inside a block, not at its start"
            )));
        }
        let n = sp.req.load(Ordering::Relaxed);
        let len = sp.len.load(Ordering::Relaxed);
        if is_whole_chunk(sp) || len > QUICK_MAX_BYTES.min(self.retain) {
            // A chunk of its own (the free set reuses it as cheaply, and it may go idle), or
            // more than the list may hold.
            sp.state.store(SPAN_FREE, Ordering::Release);
            self.insert_free(&mut lg, sp);
            self.maybe_release(&mut lg);
        } else {
            sp.state.store(SPAN_CACHED, Ordering::Release);
            lg.quick.push_back(sp);
            lg.quick_bytes += len;
            while lg.quick.len() > QUICK_MAX || lg.quick_bytes > QUICK_MAX_BYTES.min(self.retain) {
                let old = lg.quick.pop_front().expect("non-empty");
                self.uncache(&mut lg, old);
            }
        }
        Ok(n)
    }

    /// Move a span from the exact-size list into the free set (merging it).
    fn uncache(&'static self, lg: &mut Large, sp: &'static Span) {
        lg.quick_bytes -= sp.len.load(Ordering::Relaxed);
        sp.state.store(SPAN_FREE, Ordering::Release);
        self.insert_free(lg, sp);
        self.maybe_release(lg);
    }

    /// Merge every span of the exact-size list into the free set. Returns whether any was.
    fn flush_quick(&'static self, lg: &mut Large) -> bool {
        let any = !lg.quick.is_empty();
        while let Some(sp) = lg.quick.pop_front() {
            self.uncache(lg, sp);
        }
        any
    }

    /// Return a used (not slab) span to the free set, under the large lock.
    fn release_span(&'static self, sp: &'static Span) {
        let mut lg = lock(&self.large);
        sp.state.store(SPAN_FREE, Ordering::Release);
        self.insert_free(&mut lg, sp);
        self.maybe_release(&mut lg);
    }

    /// Take a span of exactly `len` bytes (granule multiple), mapping a chunk if needed.
    /// The span comes back in state USED (so no concurrent free merges it), with the registry
    /// pointing at it. A stream-ordered pool that has nothing free that fits first adopts a
    /// wholly free chunk of another stream of its device (ordered after that stream's work)
    /// before it maps a new one.
    fn take_span(&'static self, len: usize) -> Result<&'static Span> {
        let chunk_len = if len >= ARENA / 2 { len } else { ARENA };
        if let Some(g) = self.group {
            {
                let mut lg = lock(&self.large);
                if let Some(sp) = self.take_fit(&mut lg, len) {
                    return Ok(self.finish_take(&mut lg, sp, len));
                }
            }
            // Neither lock of ours is held while other pools' locks are taken.
            if let Some(chunk) = g.steal(self, len) {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                let mut lg = lock(&self.large);
                lg.chunks.push(chunk);
                let sp = self.new_span(&mut lg, chunk.base, chunk.size, &chunk, true);
                return Ok(self.finish_take(&mut lg, sp, len));
            }
            g.make_room(chunk_len, len);
        }
        let mut lg = lock(&self.large);
        let sp = match self.take_fit(&mut lg, len) {
            Some(sp) => sp,
            None => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                let chunk = match (self.map_chunk(&mut lg, chunk_len, len), self.group) {
                    (Ok(c), _) => c,
                    (Err(e), None) => return Err(e),
                    (Err(_), Some(g)) => {
                        // Out of memory: give back what every stream of the device holds
                        // idle, then try once more.
                        drop(lg);
                        g.release_idle();
                        lg = lock(&self.large);
                        self.map_chunk(&mut lg, chunk_len, len)?
                    }
                };
                self.new_span(
                    &mut lg,
                    chunk.base,
                    chunk.size,
                    &chunk,
                    !self.backing.fresh_is_zero(),
                )
            }
        };
        Ok(self.finish_take(&mut lg, sp, len))
    }

    /// Best fit for `len` bytes from this pool's free set, out of the set.
    fn take_fit(&'static self, lg: &mut Large, len: usize) -> Option<&'static Span> {
        if let Some(i) = lg
            .quick
            .iter()
            .rposition(|sp| sp.len.load(Ordering::Relaxed) == len)
        {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            let sp = lg.quick.remove(i).expect("index in range");
            lg.quick_bytes -= len;
            // State FREE for `finish_take`, which cuts nothing off an exact fit.
            sp.state.store(SPAN_FREE, Ordering::Release);
            return Some(sp);
        }
        let fit = lg.free.range((len, 0)..).next().copied();
        let (flen, fstart) = match fit {
            Some(f) => f,
            None => {
                // Merge the exact-size list and look again before mapping more memory.
                if !self.flush_quick(lg) {
                    return None;
                }
                *lg.free.range((len, 0)..).next()?
            }
        };
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        lg.free.remove(&(flen, fstart));
        let Some(Entry::Span(sp)) = entry_at(fstart) else {
            unreachable!("free set entries are registered spans")
        };
        if is_whole_chunk(sp) {
            lg.idle -= flen;
            // This stream may reuse its own idle chunk at once: its event is moot.
            take_event(lg, fstart);
        }
        Some(sp)
    }

    /// Cut `len` bytes from free span `sp` and mark them used.
    fn finish_take(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> &'static Span {
        let taken = self.split_tail(lg, sp, len);
        taken.state.store(SPAN_USED, Ordering::Release);
        // Huge pages (NumPy's default does this for blocks of 4 MiB and more): advise the whole
        // chunk the first time such a block lands in it, so reuse costs no system call.
        if len >= crate::backing::HUGEPAGE_MIN {
            let base = taken.chunk_base.load(Ordering::Relaxed);
            if let Some(c) = lg.chunks.iter_mut().find(|c| c.base == base)
                && !c.advised
            {
                c.advised = true;
                self.backing.advise_block(c.base, c.size);
            }
        }
        taken
    }

    /// Hand a wholly free chunk of at least `min` bytes (the smallest such) to another pool of
    /// the same backing kind, with the event that orders it after this pool's stream.
    pub(crate) fn take_idle_chunk(
        &'static self,
        min: usize,
    ) -> Option<(Chunk, Option<cuda::Event>)> {
        let mut lg = lock(&self.large);
        self.flush_quick(&mut lg);
        if lg.idle < min {
            return None;
        }
        let (len, start) = lg
            .free
            .range((min, 0)..)
            .copied()
            .find(|&(len, start)| lg.chunks.iter().any(|c| c.base == start && c.size == len))?;
        let Some(Entry::Span(sp)) = entry_at(start) else {
            unreachable!("free spans are registered")
        };
        self.unlist_free(&mut lg, sp);
        registry::set_range(start, len, 0);
        let pos = lg
            .chunks
            .iter()
            .position(|c| c.base == start)
            .expect("chunk record");
        let chunk = lg.chunks.swap_remove(pos);
        sp.len.store(0, Ordering::Release);
        lg.spare.push(sp);
        let ev = take_event(&mut lg, start);
        Some((chunk, ev))
    }

    /// Give back every wholly free chunk of this pool (waiting for its stream first).
    pub(crate) fn release_idle(&'static self) -> usize {
        let mut lg = lock(&self.large);
        self.flush_quick(&mut lg);
        self.release_free_chunks(&mut lg, 0)
    }

    /// Map a chunk of `want` bytes (falling back to `need` bytes), honouring the limit and
    /// retrying once after giving cached chunks back.
    fn map_chunk(&'static self, lg: &mut Large, want: usize, need: usize) -> Result<Chunk> {
        let mapped = self.stats.mapped.load(Ordering::Relaxed);
        let size = match self.limit {
            Some(limit) if mapped + want > limit => {
                if mapped + need > limit {
                    self.release_free_chunks(lg, 0);
                    let mapped = self.stats.mapped.load(Ordering::Relaxed);
                    if mapped + need > limit {
                        return Err(Error::oom(format!(
                            "UMP_ALLOC_LIMIT of {limit} bytes reached ({mapped} mapped, {need} more needed)"
                        )));
                    }
                }
                need
            }
            _ => want,
        };
        let chunk = match self.backing.map(size) {
            Ok(c) => c,
            Err(_) => {
                // Out of memory in the backing: give back what is cached and try once more,
                // with the smallest chunk that serves the request.
                self.release_free_chunks(lg, 0);
                self.backing.map(need).map_err(|e| {
                    Error::oom(format!(
                        "cannot get {need} bytes of {} memory: {}",
                        self.kind().name(),
                        e.msg
                    ))
                })?
            }
        };
        self.stats.on_map(chunk.size);
        lg.chunks.push(chunk);
        Ok(chunk)
    }

    fn new_span(
        &'static self,
        lg: &mut Large,
        start: usize,
        len: usize,
        chunk: &Chunk,
        dirty: bool,
    ) -> &'static Span {
        let sp = lg.spare.pop().unwrap_or_else(|| {
            Box::leak(Box::new(Span {
                pool: self,
                start: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                state: AtomicU8::new(SPAN_FREE),
                req: AtomicUsize::new(0),
                chunk_base: AtomicUsize::new(0),
                chunk_len: AtomicUsize::new(0),
                dirty: AtomicBool::new(false),
            }))
        });
        sp.start.store(start, Ordering::Release);
        sp.len.store(len, Ordering::Release);
        sp.state.store(SPAN_FREE, Ordering::Release);
        sp.chunk_base.store(chunk.base, Ordering::Relaxed);
        sp.chunk_len.store(chunk.size, Ordering::Relaxed);
        sp.dirty.store(dirty, Ordering::Relaxed);

        registry::set_range(start, len, sp as *const Span as usize | TAG_SPAN);
        sp
    }

    /// Cut `len` bytes off the end of free span `sp` (already out of the free set) and return
    /// the span for them; the front stays free. Only the granules of the cut part are
    /// re-registered, so the cost follows the size handed out.
    fn split_tail(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> &'static Span {
        let flen = sp.len.load(Ordering::Relaxed);
        if flen == len {
            return sp;
        }
        let start = sp.start.load(Ordering::Relaxed);
        let chunk = chunk_of(sp);
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start));
        self.new_span(
            lg,
            start + flen - len,
            len,
            &chunk,
            sp.dirty.load(Ordering::Relaxed),
        )
    }

    /// Put free span `sp` into the free set, merging it with free neighbours in its chunk.
    fn insert_free(&'static self, lg: &mut Large, sp: &'static Span) {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        let mut cur = sp;
        // Merge with the next span.
        let end = cur.start.load(Ordering::Relaxed) + cur.len.load(Ordering::Relaxed);
        if end < cend {
            if let Some(Entry::Span(next)) = entry_at(end) {
                if next.state.load(Ordering::Acquire) == SPAN_FREE
                    && next.chunk_base.load(Ordering::Relaxed) == cbase
                {
                    self.absorb(lg, cur, next);
                }
            }
        }
        // Merge into the previous span.
        let start = cur.start.load(Ordering::Relaxed);
        if start > cbase {
            if let Some(Entry::Span(prev)) = entry_at(start - 1) {
                if prev.state.load(Ordering::Acquire) == SPAN_FREE
                    && prev.chunk_base.load(Ordering::Relaxed) == cbase
                {
                    self.unlist_free(lg, prev);
                    self.absorb_into(lg, prev, cur);
                    cur = prev;
                }
            }
        }
        let len = cur.len.load(Ordering::Relaxed);
        let start = cur.start.load(Ordering::Relaxed);
        lg.free.insert((len, start));
        if is_whole_chunk(cur) {
            lg.idle += len;
            if self.ordered() {
                self.stamp_idle(lg, start);
            }
        }
    }

    /// Record, on this pool's stream, the event after which chunk `base` (now wholly free)
    /// may serve another stream. When the stream cannot take an event (a destroyed stream
    /// handle), wait for the device instead, so the chunk needs none.
    fn stamp_idle(&self, lg: &mut Large, base: usize) {
        take_event(lg, base);
        if self.is_retired() {
            return; // the retire event orders the chunk
        }
        match cuda::Event::record(self.stream, self.device) {
            Ok(ev) => lg.events.push((base, ev)),
            Err(_) => {
                if let Some(g) = self.group {
                    g.count_sync();
                }
                let _ = cuda::device_synchronize(self.device);
            }
        }
    }

    /// `a` (not in the free set) takes over its free right neighbour `b` (in the free set).
    fn absorb(&'static self, lg: &mut Large, a: &'static Span, b: &'static Span) {
        self.unlist_free(lg, b);
        self.absorb_into(lg, a, b);
    }

    /// Take free span `sp` out of the free set (keeping the idle count right).
    fn unlist_free(&self, lg: &mut Large, sp: &Span) {
        let len = sp.len.load(Ordering::Relaxed);
        lg.free.remove(&(len, sp.start.load(Ordering::Relaxed)));
        if is_whole_chunk(sp) {
            lg.idle -= len;
        }
    }

    /// `a` takes over its right neighbour `b`; `b`'s descriptor is recycled.
    fn absorb_into(&'static self, lg: &mut Large, a: &'static Span, b: &'static Span) {
        let blen = b.len.load(Ordering::Relaxed);
        let bstart = b.start.load(Ordering::Relaxed);
        registry::set_range(bstart, blen, a as *const Span as usize | TAG_SPAN);
        a.len.fetch_add(blen, Ordering::AcqRel);
        let dirty = a.dirty.load(Ordering::Relaxed) || b.dirty.load(Ordering::Relaxed);
        a.dirty.store(dirty, Ordering::Relaxed);

        b.len.store(0, Ordering::Release);
        lg.spare.push(b);
    }

    /// Give wholly free chunks back while more than `retain` bytes sit free in them.
    /// O(1) unless there is something to give back.
    fn maybe_release(&'static self, lg: &mut Large) {
        if lg.idle > self.retain {
            self.release_free_chunks(lg, self.retain);
        }
    }

    /// Give wholly free chunks back to the backing, largest first, until at most `keep` bytes
    /// of them remain. Returns the bytes given back.
    fn release_free_chunks(&'static self, lg: &mut Large, keep: usize) -> usize {
        let whole: Vec<(usize, usize)> = lg
            .free
            .iter()
            .rev()
            .copied()
            .filter(|&(len, start)| lg.chunks.iter().any(|c| c.base == start && c.size == len))
            .collect();
        let mut kept: usize = whole.iter().map(|w| w.0).sum();
        let mut released = 0;
        for (len, start) in whole {
            if kept <= keep {
                break;
            }
            let Some(Entry::Span(sp)) = entry_at(start) else {
                unreachable!("free spans are registered")
            };
            self.unlist_free(lg, sp);
            registry::set_range(start, len, 0);
            let pos = lg
                .chunks
                .iter()
                .position(|c| c.base == start)
                .expect("chunk record");
            let chunk = lg.chunks.swap_remove(pos);
            // Work queued on this pool's stream may still touch the chunk: wait for it.
            if let Some(ev) = take_event(lg, start)
                && ev.wait().is_err()
            {
                let _ = cuda::device_synchronize(self.device);
            }
            // SAFETY: the chunk is wholly free, no longer registered, and no queued work of
            // its stream uses it.
            unsafe { self.backing.unmap(&chunk) };
            self.stats.on_unmap(chunk.size);
            sp.len.store(0, Ordering::Release);
            lg.spare.push(sp);
            kept -= len;
            released += len;
        }
        released
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

/// Slots a thread keeps per class before it gives half back.
const TCACHE_CAP: usize = 64;
/// Slots a thread takes from a class at once.
const TCACHE_BATCH: usize = 32;

type SlotList = Vec<(&'static Slab, u32)>;

/// A thread's cache of free slots, per class, for one pool (the first that caches on this
/// thread; in practice the host pool behind NumPy). Alloc and free on it take no lock and no
/// atomic read-modify-write. Slots in it count as out of their class (`live`), so trim leaves
/// their slabs alone; they go back when the cache overflows, on trim from this thread, and
/// when the thread exits.
struct TcInner {
    /// The owning pool.
    owner: &'static Pool,
    bins: Vec<SlotList>,
    /// Operations served by the cache and not yet added to the pool's counters.
    allocs: u64,
    frees: u64,
}

/// Thread-local operation counts are added to the pool's counters every this many operations.
const TCACHE_COUNT_FLUSH: u64 = 256;

impl TcInner {
    fn flush_counts(&mut self) {
        if self.allocs + self.frees == 0 {
            return;
        }
        let st = &self.owner.stats;
        st.allocs.fetch_add(self.allocs, Ordering::Relaxed);
        st.hits.fetch_add(self.allocs, Ordering::Relaxed);
        st.frees.fetch_add(self.frees, Ordering::Relaxed);
        self.allocs = 0;
        self.frees = 0;
    }

    #[inline]
    fn counted(&mut self) {
        if self.allocs + self.frees >= TCACHE_COUNT_FLUSH {
            self.flush_counts();
        }
    }

    #[inline]
    fn pop(&mut self, ci: usize) -> Option<(&'static Slab, u32)> {
        let x = self.bins[ci].pop()?;
        self.allocs += 1;
        self.counted();
        Some(x)
    }

    /// Keep a freed slot, giving half the bin back to the class when it overflows.
    #[inline]
    fn push(&mut self, pool: &'static Pool, slab: &'static Slab, idx: u32) {
        self.frees += 1;
        self.counted();
        let bin = &mut self.bins[slab.class];
        bin.push((slab, idx));
        if bin.len() > TCACHE_CAP {
            let half = bin.split_off(TCACHE_CAP / 2);
            pool.return_slots(slab.class, half.into_iter());
        }
    }

    /// Give every cached slot back to the owner's classes and publish the counts.
    fn flush(&mut self, pool: &'static Pool) {
        self.flush_counts();
        for (ci, bin) in self.bins.iter_mut().enumerate() {
            if !bin.is_empty() {
                pool.return_slots(ci, bin.drain(..));
            }
        }
    }
}

/// `TC` holds null before the thread has a cache and `TC_GONE` after it was destroyed.
const TC_GONE: usize = 1;

thread_local! {
    /// This thread's cache, as a raw pointer in a thread-local *without* a destructor: one TLS
    /// access on the fast path, readable at any point of thread exit. glibc runs thread-local
    /// destructors before pthread-key destructors, so a free from a key destructor must find
    /// "gone" here rather than create a cache whose destructor would never run.
    static TC: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Owns the cache: touched once, when the cache is made; its destructor flushes it.
    static TC_GUARD: TcGuard = const { TcGuard };
}

struct TcGuard;

impl Drop for TcGuard {
    fn drop(&mut self) {
        let p = TC.try_with(|c| c.replace(TC_GONE)).unwrap_or(0);
        if p > TC_GONE {
            // SAFETY: `p` came from Box::into_raw in `ensure_tcache` and is unique to this
            // thread; TC no longer points at it.
            let mut tc = unsafe { Box::from_raw(p as *mut TcInner) };
            let owner = tc.owner;
            tc.flush(owner);
        }
    }
}

/// Run `f` on this thread's cache if it exists and belongs to `pool`.
#[inline]
fn with_tcache<R>(pool: &'static Pool, f: impl FnOnce(&mut TcInner) -> R) -> Option<R> {
    let p = TC.try_with(|c| c.get()).unwrap_or(TC_GONE);
    if p <= TC_GONE {
        return None;
    }
    // SAFETY: `p` is this thread's live cache (only this thread reads TC); no other reference
    // to it exists while `f` runs, and `f` never re-enters the thread cache.
    let tc = unsafe { &mut *(p as *mut TcInner) };
    if !std::ptr::eq(tc.owner, pool) {
        return None;
    }
    Some(f(tc))
}

/// Make this thread's cache for `pool` if it has none yet. False when the thread's cache
/// belongs to another pool or was already destroyed (thread exit).
fn ensure_tcache(pool: &'static Pool) -> bool {
    let p = TC.try_with(|c| c.get()).unwrap_or(TC_GONE);
    if p == TC_GONE {
        return false;
    }
    if p != 0 {
        // SAFETY: this thread's live cache.
        return std::ptr::eq(unsafe { &*(p as *const TcInner) }.owner, pool);
    }
    // Register the destructor first: if the thread is already past its TLS destructors, the
    // guard is gone and no cache is made.
    if TC_GUARD.try_with(|_| ()).is_err() {
        return false;
    }
    let tc = Box::new(TcInner {
        owner: pool,
        bins: (0..pool.table.len()).map(|_| Vec::new()).collect(),
        allocs: 0,
        frees: 0,
    });
    let _ = TC.try_with(|c| c.set(Box::into_raw(tc) as usize));
    true
}

/// Publish the calling thread's cached operation counts to its pool's statistics.
pub fn flush_thread_counts() {
    let p = TC.try_with(|c| c.get()).unwrap_or(TC_GONE);
    if p > TC_GONE {
        // SAFETY: this thread's live cache.
        unsafe { &mut *(p as *mut TcInner) }.flush_counts();
    }
}

/// Take the idle event of chunk `base` out of the list, if it has one.
fn take_event(lg: &mut Large, base: usize) -> Option<cuda::Event> {
    let i = lg.events.iter().position(|e| e.0 == base)?;
    Some(lg.events.swap_remove(i).1)
}

fn is_whole_chunk(sp: &Span) -> bool {
    sp.start.load(Ordering::Relaxed) == sp.chunk_base.load(Ordering::Relaxed)
        && sp.len.load(Ordering::Relaxed) == sp.chunk_len.load(Ordering::Relaxed)
}

fn chunk_of(sp: &Span) -> Chunk {
    let base = sp.chunk_base.load(Ordering::Relaxed);
    let size = sp.chunk_len.load(Ordering::Relaxed);
    Chunk {
        base,
        size,
        raw: base,
        raw_size: size,
        advised: false,
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
