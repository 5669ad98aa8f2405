//! Small blocks: the thread cache (`tcache`) and the hot slot in front of the slabs (`slab`).
//!
//! A small allocation takes a slot from this thread's cache (host pool) or its class's hot
//! slot (stream-ordered pools) when there is one, and otherwise refills from the class under
//! its lock, cutting a new slab when the class has no free slot. A small free swaps its slot's
//! word without a lock (see `slab`) and keeps the slot in the cache or the hot cell, or gives
//! it back to its slab. The fast paths of the malloc family (`pool::free_cached`,
//! `pool::resize_cached`) come here too.

use super::class::SMALL_MAX;
use super::tcache;
use super::types::{Alloc, Pool, SPAN_SLAB, Slab, Slot};
use crate::error::Result;
use crate::prim::fork::lock;
use std::sync::atomic::Ordering;

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
            let span = self.take_span(self.table.slab_bytes[ci], SPAN_SLAB)?;
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

    /// Free the small block at `ptr` of slab `s` (found through the registry, no lock held),
    /// counted out of use. Returns its requested size.
    #[inline]
    pub(super) fn free_small(&'static self, s: &'static Slab, ptr: usize) -> Result<usize> {
        let (idx, n) = match s.clear_slot(ptr) {
            Some(r) => r?,
            None => return Err(s.not_a_slot(ptr)),
        };
        if s.held_for_children() {
            // A fork child may still read it.
            return self.hold_slot(s, idx, n);
        }
        let dead = s.on_freed();
        if self.is_stream_ordered() && self.put_hot(s.class, s, idx) {
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            self.stats.sub_in_use(n);
            return Ok(n);
        }
        if dead && self.over_retain() {
            // The slab's last live block, in a pool above its retain bound: the slot, and
            // this thread's cached slots of the slab, go back to it, so that it can go back
            // to the spans and its chunk to the OS instead of being pinned by a cache.
            self.free_to_slab(s, idx, n);
            return Ok(n);
        }
        if !tcache::push(self, s.class, (s, idx), n) {
            self.return_freed(s, idx, n);
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
        // A slot of a slab that had blocks out at a fork whose child may live must be held
        // back for it (`free_small` does that): not this path's business.
        if s.held_for_children() {
            return None;
        }
        let c = tcache::mine(self)?;
        let (idx, n) = match s.clear_slot(ptr)? {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        if s.on_freed() && self.over_retain() {
            self.free_to_slab(s, idx, n);
        } else if !tcache::push_to(c, self, s.class, (s, idx), n) {
            self.return_freed(s, idx, n);
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
        // realloc frees the old block: one a fork child may read moves (`realloc` copies).
        if s.held_for_children() {
            return None;
        }
        let c = tcache::mine(self)?;
        if n > SMALL_MAX || self.table.class_of(n) != s.class {
            return None;
        }
        let (_, w) = s.slot_at(ptr)?;
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
}
