//! Slabs: spans cut into equal slots of one size class, for requests up to `SMALL_MAX`.
//!
//! Each slab keeps its own free slots (mimalloc's pages): a stack of freed slot indices and a
//! bump index below which every slot has been handed out once. A class keeps the list of its
//! slabs that have free slots (`partial`), so an allocation takes from a slab in O(1), and a
//! slab whose slots have all come back is seen at once: it is kept for reuse (one per class,
//! within the pool's `retain`) or goes back to the span allocator, from where its chunk may go
//! back to the backing.
//!
//! **Lock-free free.** A free finds the slab through the registry without a lock and swaps its
//! slot's word to 0; the slot goes back to its slab under the class lock afterwards. A slot
//! word is `requested + 1` while handed out and 0 otherwise, so a second free of the same slot
//! always finds 0 and is refused. A slab descriptor may have been recycled for another range
//! between the registry read and the swap: the free then checks the address against the
//! descriptor's current range and refuses it when it does not belong there. Slab and span
//! states change only under the large lock (see `span`), so a free of a slab's start address
//! that reaches the span path while the slab is being made or released is refused too.

use super::tcache::{self, Slot};
use super::*;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Descriptor of a slab: a span cut into equal slots of one class.
pub struct Slab {
    pub(super) pool: &'static Pool,
    pub(super) class: usize,
    pub(super) slot: usize,
    nslots: usize,
    /// `nslots * slot`: the bytes of the slab's slots.
    len: usize,
    /// Index of this descriptor's state in its class (fixed for the descriptor's life).
    id: usize,
    pub(super) base: AtomicUsize,
    span: AtomicUsize,
    /// Reciprocal of `slot` for division by multiplication: `idx = off * magic >> 64`.
    magic: u64,
    /// Per slot: requested bytes + 1 while handed out, 0 otherwise.
    words: Box<[AtomicU32]>,
    /// The fork generation of its blocks (renewed when it is taken from with no slot out):
    /// see `hold`.
    pub(super) born: AtomicU64,
    /// Blocks of the slab live now (handed out and not freed), as a hint: kept with plain
    /// loads and stores, so exact when one thread uses the slab and possibly off by a few
    /// while threads race on it (it is set right whenever the slab empties). It only decides
    /// when cached slots go back early (`free_small`, `tcache::release_dead`); what is
    /// released is decided by the exact count under the class lock.
    live: AtomicU32,
}

impl Slab {
    /// Slot index of byte offset `off` (exact for offsets below 2^32).
    #[inline]
    fn slot_of(&self, off: usize) -> usize {
        ((off as u128 * self.magic as u128) >> 64) as usize
    }

    fn span(&self) -> &'static Span {
        // SAFETY: `span` holds a pointer to a leaked, never-freed Span descriptor while the
        // slab is installed (and it is read only then).
        unsafe { &*(self.span.load(Ordering::Acquire) as *const Span) }
    }

    #[inline(always)]
    fn bytes(&self) -> usize {
        self.len
    }

    /// The live block containing `addr`, if this slab holds one there now.
    #[inline]
    pub(super) fn lookup(&'static self, addr: usize) -> Option<BlockInfo> {
        let base = self.base.load(Ordering::Acquire);
        let off = addr.checked_sub(base)?;
        if off >= self.bytes() {
            return None;
        }
        let idx = self.slot_of(off);
        let w = self.words[idx].load(Ordering::Acquire);
        if w == 0 {
            return None;
        }
        Some(BlockInfo {
            pool: self.pool,
            base: base + idx * self.slot,
            size: w as usize - 1,
            capacity: self.slot,
        })
    }

    /// Slot `idx` (out of the slab, free) becomes a live block of `n` bytes. Returns its
    /// address.
    #[inline(always)]
    pub(super) fn hand_out(&self, idx: u32, n: usize) -> usize {
        let i = idx as usize;
        debug_assert!(i < self.nslots);
        // SAFETY: slots come from `ClassState::take`, which hands out indices below `nslots`,
        // the length of `words`.
        unsafe { self.words.get_unchecked(i) }.store(n as u32 + 1, Ordering::Release);
        self.on_handed_out();
        self.base.load(Ordering::Relaxed) + i * self.slot
    }

    /// A block of this slab was handed out.
    #[inline]
    fn on_handed_out(&self) {
        let l = self.live.load(Ordering::Relaxed);
        self.live.store(l.wrapping_add(1), Ordering::Relaxed);
    }

    /// A block of this slab was freed. Returns whether, by the hint, none is live any more.
    #[inline]
    fn on_freed(&self) -> bool {
        let l = self.live.load(Ordering::Relaxed).wrapping_sub(1);
        self.live.store(l, Ordering::Relaxed);
        l as i32 <= 0
    }

    /// Whether, by the hint, no block of this slab is live: its slots in thread caches are
    /// all that keep it (and its chunk) in use.
    #[inline]
    pub(super) fn maybe_dead(&self) -> bool {
        self.live.load(Ordering::Relaxed) as i32 <= 0
    }

    /// Record a new requested size for the live block at `base`.
    pub(super) fn resize(&self, base: usize, n: usize) -> bool {
        let off = base.wrapping_sub(self.base.load(Ordering::Acquire));
        if off >= self.bytes() {
            return false;
        }
        let w = &self.words[self.slot_of(off)];
        if w.load(Ordering::Relaxed) == 0 {
            return false;
        }
        w.store(n as u32 + 1, Ordering::Release);
        true
    }
}

/// Where a slab descriptor is in its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// In use, with free slots: `partial[i]`.
    Partial(usize),
    /// In use, every slot out.
    Full,
    /// Every slot free, kept for reuse: `empty[i]`.
    Empty(usize),
    /// No span: waiting in `spare` for reuse.
    Spare,
}

/// What a class knows of one of its slab descriptors (under the class lock).
struct SlabState {
    desc: &'static Slab,
    /// Freed slot indices below `bump`.
    free: Vec<u16>,
    /// Slots at or past `bump` were never handed out since the slab was made.
    bump: usize,
    /// Slots out of the slab: handed out or in a thread cache.
    out: usize,
    at: At,
}

impl SlabState {
    fn free_slots(&self) -> usize {
        self.free.len() + (self.desc.nslots - self.bump)
    }
}

/// One size class of a pool: its slab descriptors and which of them have free slots.
#[derive(Default)]
pub(crate) struct ClassState {
    slabs: Vec<SlabState>,
    partial: Vec<usize>,
    empty: Vec<usize>,
    spare: Vec<usize>,
    /// Free slots in slabs in use (partial and empty).
    free: usize,
    /// Freed slots held back for fork children (still out of their slabs): see `hold`.
    pub(super) held: Vec<Slot>,
}

impl ClassState {
    /// Free slots held by the class (not counting thread caches).
    pub(super) fn free_slots(&self) -> usize {
        self.free
    }

    /// Take slab `id` out of whichever list holds it (partial or empty); it is then `Full`.
    fn unlist(&mut self, id: usize) {
        let (i, partial) = match self.slabs[id].at {
            At::Partial(i) => (i, true),
            At::Empty(i) => (i, false),
            At::Full | At::Spare => return,
        };
        let list = if partial {
            &mut self.partial
        } else {
            &mut self.empty
        };
        list.swap_remove(i);
        if let Some(&moved) = list.get(i) {
            self.slabs[moved].at = if partial {
                At::Partial(i)
            } else {
                At::Empty(i)
            };
        }
        self.slabs[id].at = At::Full;
    }

    fn push_partial(&mut self, id: usize) {
        self.partial.push(id);
        self.slabs[id].at = At::Partial(self.partial.len() - 1);
    }

    /// Take up to `want` free slots, from partial slabs first, then a kept empty slab.
    /// Returns the slots and the bytes of empty slabs brought back into use.
    fn take(&mut self, want: usize, out: &mut Vec<Slot>) -> usize {
        let mut revived = 0;
        while out.len() < want {
            let id = match self.partial.last() {
                Some(&id) => id,
                None => match self.empty.last() {
                    Some(&id) => {
                        self.unlist(id);
                        revived += self.slabs[id].desc.bytes();
                        self.push_partial(id);
                        id
                    }
                    None => break,
                },
            };
            let st = &mut self.slabs[id];
            while out.len() < want {
                let idx = match st.free.pop() {
                    Some(i) => i as usize,
                    None if st.bump < st.desc.nslots => {
                        st.bump += 1;
                        st.bump - 1
                    }
                    None => break,
                };
                st.out += 1;
                self.free -= 1;
                out.push((st.desc, idx as u32));
            }
            if self.slabs[id].free_slots() == 0 {
                self.unlist(id);
            }
        }
        revived
    }

    /// Put slot `idx` back into its slab. Returns true when the slab is now wholly free (the
    /// caller decides whether to keep it); it is then out of the partial list.
    fn give(&mut self, id: usize, idx: u32) -> bool {
        let st = &mut self.slabs[id];
        debug_assert!(st.out > 0 && !matches!(st.at, At::Spare));
        st.free.push(idx as u16);
        st.out -= 1;
        self.free += 1;
        if self.slabs[id].out == 0 {
            // Every slot is back: nothing is live (the hint may have drifted).
            self.slabs[id].desc.live.store(0, Ordering::Relaxed);
            self.unlist(id);
            return true;
        }
        if self.slabs[id].at == At::Full {
            self.push_partial(id);
        }
        false
    }
}

/// A hot slot packs its slab descriptor's address (below 2^48 on every 64-bit target we run
/// on) and its index (below 2^16: slabs hold fewer slots) into one word; 0 is "none".
const HOT_IDX_SHIFT: u32 = 48;

fn unpack_hot(v: usize) -> Slot {
    let ptr = v & ((1usize << HOT_IDX_SHIFT) - 1);
    // SAFETY: `v` was packed by `put_hot` from a leaked (never freed) slab descriptor, and the
    // slot kept its slab in use, so the descriptor still describes the slot's slab.
    let slab = unsafe { &*(ptr as *const Slab) };
    (slab, (v >> HOT_IDX_SHIFT) as u32)
}

thread_local! {
    /// `refill`'s vector of slots, reused (empty between uses).
    static SCRATCH: std::cell::RefCell<Vec<Slot>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Pool {
    /// Allocate `n <= SMALL_MAX` bytes from the class that serves it, counted in use.
    #[inline]
    pub(super) fn alloc_small(&'static self, n: usize) -> Result<Alloc> {
        let ci = self.table.class_of(n);
        let hot = if self.is_stream_ordered() {
            self.take_hot(ci)
        } else {
            None
        };
        // An explicit branch rather than `hot.or_else(|| tcache::pop(..))`: LLVM stopped
        // inlining that closure's `or_else` into this function after unrelated changes in the
        // crate, which cost about 30 instructions per allocation.
        let cached = if hot.is_some() {
            hot
        } else {
            tcache::pop(self, ci, n)
        };
        let (slab, idx) = match cached {
            Some(x) if hot.is_some() => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                self.stats.allocs.fetch_add(1, Ordering::Relaxed);
                self.stats.add_in_use(n);
                x
            }
            Some(x) => x,
            None => {
                let x = self.refill(ci)?;
                self.stats.add_in_use(n);
                x
            }
        };
        Ok(Alloc {
            ptr: slab.hand_out(idx, n),
            zeroed: false,
        })
    }

    /// Slow path of a small allocation: take slots from the class under its lock, one to
    /// return and a batch for this thread's cache. When the class has none, a new slab is cut
    /// from a span taken with no class lock held (so that an out-of-memory retry may reclaim
    /// every cache and slab of the pool).
    fn refill(&'static self, ci: usize) -> Result<Slot> {
        self.decay_if_due();
        let extra = if tcache::ensure(self) {
            tcache::fill(self, ci)
        } else {
            0
        };
        // A scratch vector kept per thread: no heap allocation per refill (device pools, which
        // have no thread cache, refill on every small allocation).
        let mut got = SCRATCH
            .try_with(|v| std::mem::take(&mut *v.borrow_mut()))
            .unwrap_or_default();
        got.clear();
        got.reserve(1 + extra);
        let hit = {
            let mut st = lock(&self.classes[ci]);
            self.take_slots(&mut st, 1 + extra, &mut got);
            !got.is_empty()
        };
        if hit {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            // Counts a hit (span reused) or a miss (chunk mapped) for this allocation.
            let span = self.take_span(self.table.slab_bytes[ci], span::SPAN_SLAB)?;
            let mut st = lock(&self.classes[ci]);
            self.install_slab(&mut st, ci, span);
            self.take_slots(&mut st, 1 + extra, &mut got);
        }
        self.stats.allocs.fetch_add(1, Ordering::Relaxed);
        let one = got.pop().expect("a new slab has free slots");
        if !got.is_empty() {
            let rest = tcache::stash(self, ci, got);
            if !rest.is_empty() {
                self.return_slots(ci, rest);
            }
        } else {
            let _ = SCRATCH.try_with(|v| *v.borrow_mut() = got);
        }
        Ok(one)
    }

    fn take_slots(&'static self, st: &mut ClassState, want: usize, out: &mut Vec<Slot>) {
        let revived = st.take(want, out);
        if revived > 0 {
            self.kept_slabs.fetch_sub(revived, Ordering::Relaxed);
        }
    }

    /// Make `span` (state SLAB, from `take_span`) a slab of class `ci`, with every slot free.
    fn install_slab(&'static self, st: &mut ClassState, ci: usize, span: &'static Span) {
        let slot = self.table.sizes[ci];
        let bytes = self.table.slab_bytes[ci];
        let nslots = bytes / slot;
        let id = match st.spare.pop() {
            Some(id) => id,
            None => {
                let id = st.slabs.len();
                let desc: &'static Slab = Box::leak(Box::new(Slab {
                    pool: self,
                    class: ci,
                    slot,
                    nslots,
                    len: nslots * slot,
                    id,
                    base: AtomicUsize::new(0),
                    span: AtomicUsize::new(0),
                    magic: (u64::MAX / slot as u64) + 1,
                    words: (0..nslots).map(|_| AtomicU32::new(0)).collect(),
                    born: AtomicU64::new(super::span::NEVER),
                    live: AtomicU32::new(0),
                }));
                st.slabs.push(SlabState {
                    desc,
                    free: Vec::new(),
                    bump: 0,
                    out: 0,
                    at: At::Spare,
                });
                id
            }
        };
        let desc = st.slabs[id].desc;
        let start = span.start();
        desc.born.store(self.birth_gen(), Ordering::Relaxed);
        desc.base.store(start, Ordering::Release);
        desc.span
            .store(span as *const Span as usize, Ordering::Release);
        let s = &mut st.slabs[id];
        s.free.clear();
        s.bump = 0;
        s.out = 0;
        st.free += nslots;
        st.push_partial(id);
        // The span's range was reserved when its chunk was mapped.
        registry::set_range(start, bytes, desc as *const Slab as usize | TAG_SLAB);
    }

    /// Free the small block at `ptr` of slab `s` (found through the registry, no lock held),
    /// counted out of use. Returns its requested size.
    #[inline]
    pub(super) fn free_small(&'static self, s: &'static Slab, ptr: usize) -> Result<usize> {
        let off = ptr.wrapping_sub(s.base.load(Ordering::Acquire));
        if off >= s.bytes() {
            // The descriptor moved on to another range since the registry was read.
            return Err(Error::not_ours(format!("{ptr:#x} is not a live block")));
        }
        let idx = s.slot_of(off);
        if idx * s.slot != off {
            return Err(Error::not_ours(format!(
                "{ptr:#x} points inside a block, not at its start"
            )));
        }
        let w = s.words[idx].swap(0, Ordering::AcqRel);
        if w == 0 {
            return Err(double_free(ptr));
        }
        let n = w as usize - 1;
        let live = crate::backing::shared::live_max();
        if live != 0 && s.born.load(Ordering::Relaxed) < live {
            // A fork child may still read it.
            return self.hold_slot(s, idx as u32, n);
        }
        let dead = s.on_freed();
        if self.is_stream_ordered() && self.put_hot(s.class, s, idx as u32) {
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            self.stats.sub_in_use(n);
            return Ok(n);
        }
        if dead && self.over_retain() {
            // The slab's last live block, in a pool above its retain bound: the slot, and
            // this thread's cached slots of the slab, go back to it, so that it can go back
            // to the spans and its chunk to the OS instead of being pinned by a cache.
            self.free_to_slab(s, idx as u32, n);
            return Ok(n);
        }
        if !tcache::push(self, s.class, (s, idx as u32), n) {
            self.return_freed(s, idx as u32, n);
        }
        Ok(n)
    }

    /// The free fast path (`pool::free_cached`): free the small block at `ptr` of slab `s`
    /// into this thread's cache, which must be this (host) pool's. None: not handled, nothing
    /// changed (no cache of this pool here, or `ptr` is not a slot's start: the full path
    /// says why); else the result of the free, as `free_small` gives it.
    #[inline(always)]
    pub(super) fn free_cached(
        &'static self,
        s: &'static Slab,
        ptr: usize,
    ) -> Option<Result<usize>> {
        // While a fork child may read this process's shared pages, a freed slot may have to
        // be held back for it (`free_small` decides): not this path's business.
        if crate::backing::shared::live_max() != 0 {
            return None;
        }
        let c = tcache::mine(self)?;
        let off = ptr.wrapping_sub(s.base.load(Ordering::Acquire));
        if off >= s.bytes() {
            return None;
        }
        let idx = s.slot_of(off);
        if idx * s.slot != off {
            return None;
        }
        debug_assert!(idx < s.nslots);
        // SAFETY: `off < nslots * slot`, so `idx < nslots`, the length of `words`.
        let w = unsafe { s.words.get_unchecked(idx) }.swap(0, Ordering::AcqRel);
        if w == 0 {
            return Some(Err(double_free(ptr)));
        }
        let n = w as usize - 1;
        if s.on_freed() && self.over_retain() {
            self.free_to_slab(s, idx as u32, n);
        } else if !tcache::push_to(c, self, s.class, (s, idx as u32), n) {
            self.return_freed(s, idx as u32, n);
        }
        Some(Ok(n))
    }

    /// The realloc fast path (`pool::resize_cached`): the live small block at `ptr` of slab
    /// `s` takes `n` bytes in place when `n` falls in its class, counted in this thread's
    /// cache, which must be this (host) pool's. None: not handled, nothing changed.
    #[inline(always)]
    pub(super) fn resize_cached(
        &'static self,
        s: &'static Slab,
        ptr: usize,
        n: usize,
    ) -> Option<usize> {
        let c = tcache::mine(self)?;
        let off = ptr.wrapping_sub(s.base.load(Ordering::Acquire));
        if n > SMALL_MAX || off >= s.bytes() || self.table.class_of(n) != s.class {
            return None;
        }
        let idx = s.slot_of(off);
        if idx * s.slot != off {
            return None;
        }
        debug_assert!(idx < s.nslots);
        // SAFETY: `off < nslots * slot`, so `idx < nslots`, the length of `words`.
        let w = unsafe { s.words.get_unchecked(idx) };
        let old = w.load(Ordering::Acquire);
        if old == 0 {
            return None;
        }
        w.store(n as u32 + 1, Ordering::Release);
        if !tcache::note_resize(c, old as usize - 1, n) {
            self.stats.on_resize(old as usize - 1, n);
            self.stats.reallocs_in_place.fetch_add(1, Ordering::Relaxed);
        }
        Some(ptr)
    }

    /// A freed slot that no thread cache takes goes back to its slab, counted as freed.
    #[cold]
    #[inline(never)]
    fn return_freed(&'static self, s: &'static Slab, idx: u32, n: usize) {
        self.return_slots(s.class, std::iter::once((s, idx)));
        self.stats.frees.fetch_add(1, Ordering::Relaxed);
        self.stats.sub_in_use(n);
    }

    /// `free_small`'s slow path: slot `idx` of `s` (freed, counted out of its live blocks),
    /// with this thread's cached slots of `s`, goes back to its slab.
    #[cold]
    #[inline(never)]
    fn free_to_slab(&'static self, s: &'static Slab, idx: u32, n: usize) {
        let mut slots = tcache::take_slab(self, s.class, s);
        slots.push((s, idx));
        self.return_slots(s.class, slots);
        self.stats.frees.fetch_add(1, Ordering::Relaxed);
        self.stats.sub_in_use(n);
        if self.over_retain() {
            self.release_pinning();
        }
    }

    /// Take the hot slot of class `ci` (stream-ordered pools), if there is one. The slot
    /// stayed out of its slab while it was hot, so it is handed out with no lock.
    #[inline]
    fn take_hot(&'static self, ci: usize) -> Option<Slot> {
        let v = self.hot[ci].swap(0, Ordering::Acquire);
        (v != 0).then(|| unpack_hot(v))
    }

    /// Make a freed slot the hot one of its class if the cell is empty. Returns false when
    /// another slot is hot already (the caller returns this one to its slab).
    #[inline]
    fn put_hot(&'static self, ci: usize, slab: &'static Slab, idx: u32) -> bool {
        let addr = slab as *const Slab as usize;
        if addr >> HOT_IDX_SHIFT != 0 || self.is_retired() {
            // An address this packing cannot hold, or a retired stream's pool (whose slabs
            // must fall empty so that the pool is recycled): the slot goes back to its slab.
            return false;
        }
        let v = addr | (idx as usize) << HOT_IDX_SHIFT;
        self.hot[ci]
            .compare_exchange(0, v, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Return every hot slot to its slab (trim, retire, statistics need them there).
    pub(super) fn drain_hot(&'static self) {
        for ci in 0..self.hot.len() {
            if let Some(slot) = self.take_hot(ci) {
                self.return_slots(ci, std::iter::once(slot));
            }
        }
    }

    /// Bytes of the hot slots.
    pub(super) fn hot_bytes(&self) -> usize {
        (0..self.hot.len())
            .filter(|&ci| self.hot[ci].load(Ordering::Relaxed) != 0)
            .map(|ci| self.table.sizes[ci])
            .sum()
    }

    /// Return free slots to their slabs; slabs that become wholly free are kept (one per
    /// class, within `retain`) or go back to the span allocator.
    pub(super) fn return_slots(&'static self, ci: usize, slots: impl IntoIterator<Item = Slot>) {
        let mut st = lock(&self.classes[ci]);
        for (slab, idx) in slots {
            if st.give(slab.id, idx) {
                // No block of it is out: blocks it hands out from now on are of this
                // generation or later (see `hold`).
                slab.born.store(self.birth_gen(), Ordering::Relaxed);
                if !self.keep_empty(&mut st, slab) {
                    self.release_slab(&mut st, slab.id);
                }
            }
        }
    }

    /// Keep wholly free slab `slab` for reuse, when the pool's budget allows: a class keeps
    /// one, the one that emptied last (an older one sits in memory more likely to be idle
    /// otherwise, so it goes back). Returns whether `slab` was kept.
    fn keep_empty(&'static self, st: &mut ClassState, slab: &'static Slab) -> bool {
        if let Some(&old) = st.empty.last() {
            st.unlist(old);
            self.kept_slabs
                .fetch_sub(st.slabs[old].desc.bytes(), Ordering::Relaxed);
            self.release_slab(st, old);
        }
        let bytes = slab.bytes();
        if self.is_retired()
            || self.over_retain()
            || self.kept_slabs.load(Ordering::Relaxed) + bytes > self.retain / 2
        {
            // Over the bound, a kept slab would pin its chunk too.
            return false;
        }
        self.kept_slabs.fetch_add(bytes, Ordering::Relaxed);
        st.empty.push(slab.id);
        st.slabs[slab.id].at = At::Empty(st.empty.len() - 1);
        true
    }

    /// Give slab `id` (wholly free, in no list) back to the span allocator.
    fn release_slab(&'static self, st: &mut ClassState, id: usize) {
        let s = &mut st.slabs[id];
        debug_assert_eq!(s.out, 0);
        let n = s.desc.nslots;
        s.at = At::Spare;
        s.free.clear();
        s.bump = 0;
        let span = s.desc.span();
        st.free -= n;
        st.spare.push(id);
        // The registry still points at the slab, whose slot words are all 0: a stale free
        // meanwhile is refused as a double free. The class lock is held until the span is
        // back, so the descriptor is not reused before then.
        self.release_slab_span(span);
    }

    /// Give every kept empty slab back to the span allocator.
    pub(super) fn release_empty_slabs(&'static self) {
        for ci in 0..self.classes.len() {
            let mut st = lock(&self.classes[ci]);
            while let Some(&id) = st.empty.last() {
                st.unlist(id);
                self.kept_slabs
                    .fetch_sub(st.slabs[id].desc.bytes(), Ordering::Relaxed);
                self.release_slab(&mut st, id);
            }
        }
    }
}
