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
//!
//! What stands in front of the slabs (the thread cache and the hot slot, the refill and the
//! free paths that use them) is in `small`.

use super::types::{BlockInfo, ClassState, NEVER, Pool, Slab, Slot, Span, TAG_SLAB, double_free};
use crate::error::{Error, Result};
use crate::prim::fork::lock;
use crate::registry;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::atomic::{AtomicUsize, Ordering};

impl Slab {
    /// Slot index of byte offset `off` (exact for offsets below 2^32).
    #[inline]
    pub(super) fn slot_of(&self, off: usize) -> usize {
        ((off as u128 * self.magic as u128) >> 64) as usize
    }

    fn span(&self) -> &'static Span {
        // SAFETY: `span` holds a pointer to a leaked, never-freed Span descriptor while the
        // slab is installed (and it is read only then).
        unsafe { &*(self.span.load(Ordering::Acquire) as *const Span) }
    }

    #[inline(always)]
    pub(super) fn bytes(&self) -> usize {
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

    /// The free fast paths' first step: the live block starting at `ptr` (found in this slab
    /// through the registry) is freed in the slab's words. Returns its slot index and
    /// requested size; the slot is then out of the slab and free, and the caller keeps it or
    /// gives it back. None: `ptr` is not a slot's start in this slab's current range (nothing
    /// changed; the full path says why). `Some(Err)`: the slot is not live (a double free).
    #[inline(always)]
    pub(super) fn clear_slot(&self, ptr: usize) -> Option<Result<(u32, usize)>> {
        let (idx, word) = self.slot_at(ptr)?;
        let w = word.swap(0, Ordering::AcqRel);
        if w == 0 {
            return Some(Err(double_free(ptr)));
        }
        Some(Ok((idx as u32, w as usize - 1)))
    }

    /// The slot that starts at `ptr` in this slab's current range, and its word (0: free,
    /// else the requested size + 1). None: `ptr` is outside the range or inside a slot.
    #[inline(always)]
    pub(super) fn slot_at(&self, ptr: usize) -> Option<(usize, &AtomicU32)> {
        let off = ptr.wrapping_sub(self.base.load(Ordering::Acquire));
        if off >= self.bytes() {
            return None;
        }
        let idx = self.slot_of(off);
        if idx * self.slot != off {
            return None;
        }
        debug_assert!(idx < self.nslots);
        // SAFETY: `off < nslots * slot`, so `idx < nslots`, the length of `words`.
        Some((idx, unsafe { self.words.get_unchecked(idx) }))
    }

    /// Why [`clear_slot`](Self::clear_slot) found no slot's start at `ptr`: the error a free
    /// reports for it.
    #[cold]
    #[inline(never)]
    pub(super) fn not_a_slot(&self, ptr: usize) -> Error {
        let off = ptr.wrapping_sub(self.base.load(Ordering::Acquire));
        if off < self.bytes() && self.slot_of(off) * self.slot != off {
            return Error::not_ours(format!("{ptr:#x} points inside a block, not at its start"));
        }
        // The descriptor moved on to another range since the registry was read.
        Error::not_ours(format!("{ptr:#x} is not a live block"))
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

    /// Whether a fork child that may still live could read this slab's blocks (it had blocks
    /// out at that fork): they are held back when freed, and never resized in place (see
    /// `hold`).
    #[inline(always)]
    pub(super) fn held_for_children(&self) -> bool {
        let live = crate::backing::shared::live_max();
        live != 0 && self.born.load(Ordering::Relaxed) < live
    }

    /// A block of this slab was handed out.
    #[inline]
    fn on_handed_out(&self) {
        let l = self.live.load(Ordering::Relaxed);
        self.live.store(l.wrapping_add(1), Ordering::Relaxed);
    }

    /// A block of this slab was freed. Returns whether, by the hint, none is live any more.
    #[inline]
    pub(super) fn on_freed(&self) -> bool {
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

impl Pool {
    #[inline]
    pub(super) fn take_slots(&'static self, st: &mut ClassState, want: usize, out: &mut Vec<Slot>) {
        let revived = st.take(want, out);
        if revived > 0 {
            self.retention.unkeep_slabs(revived);
        }
    }

    /// Make `span` (state SLAB, from `take_span`) a slab of class `ci`, with every slot free.
    pub(super) fn install_slab(&'static self, st: &mut ClassState, ci: usize, span: &'static Span) {
        let slot = self.table.sizes[ci];
        let bytes = self.table.slab_bytes[ci];
        let nslots = bytes / slot;
        let id = st.spare_or_new(|id| {
            Box::leak(Box::new(Slab {
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
                born: AtomicU64::new(NEVER),
                live: AtomicU32::new(0),
            }))
        });
        let desc = st.desc(id);
        let start = span.start();
        desc.born.store(self.birth_gen(), Ordering::Relaxed);
        desc.base.store(start, Ordering::Release);
        desc.span
            .store(span as *const Span as usize, Ordering::Release);
        st.list_new(id);
        // The span's range was reserved when its chunk was mapped.
        registry::set_range(start, bytes, desc as *const Slab as usize | TAG_SLAB);
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
        if let Some(old) = st.last_empty() {
            st.unlist(old);
            self.retention.unkeep_slabs(st.desc(old).bytes());
            self.release_slab(st, old);
        }
        let bytes = slab.bytes();
        if self.is_retired()
            || self.over_retain()
            || self.retention.kept_slabs() + bytes > self.retention.bound() / 2
        {
            // Over the bound, a kept slab would pin its chunk too.
            return false;
        }
        self.retention.keep_slab(bytes);
        st.push_empty(slab.id);
        true
    }

    /// Give slab `id` (wholly free, in no list) back to the span allocator.
    fn release_slab(&'static self, st: &mut ClassState, id: usize) {
        let span = st.retire_slab(id).span();
        // The registry still points at the slab, whose slot words are all 0: a stale free
        // meanwhile is refused as a double free. The class lock is held until the span is
        // back, so the descriptor is not reused before then.
        self.release_slab_span(span);
    }

    /// Give every kept empty slab back to the span allocator.
    pub(super) fn release_empty_slabs(&'static self) {
        for ci in 0..self.classes.len() {
            let mut st = lock(&self.classes[ci]);
            while let Some(id) = st.last_empty() {
                st.unlist(id);
                self.retention.unkeep_slabs(st.desc(id).bytes());
                self.release_slab(&mut st, id);
            }
        }
    }
}
