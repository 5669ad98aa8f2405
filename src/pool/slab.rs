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

use super::{AtomicUsize, BlockInfo, Ordering, Pool, Span, TAG_SLAB, lock, registry};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A free slot: its slab and index.
pub(super) type Slot = (&'static Slab, u32);

/// Descriptor of a slab: a span cut into equal slots of one class.
pub struct Slab {
    pub(super) pool: &'static Pool,
    pub(super) class: usize,
    pub(super) slot: usize,
    pub(super) nslots: usize,
    /// `nslots * slot`: the bytes of the slab's slots.
    len: usize,
    /// Index of this descriptor's state in its class (fixed for the descriptor's life).
    id: usize,
    pub(super) base: AtomicUsize,
    span: AtomicUsize,
    /// Reciprocal of `slot` for division by multiplication: `idx = off * magic >> 64`.
    magic: u64,
    /// Per slot: requested bytes + 1 while handed out, 0 otherwise.
    pub(super) words: Box<[AtomicU32]>,
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
    held: Vec<Slot>,
}

impl ClassState {
    /// Hold freed slot `slot` back for fork children (it stays out of its slab).
    pub(super) fn hold(&mut self, slot: Slot) {
        self.held.push(slot);
    }

    /// The held slots that `still` no longer holds (by their slab's generation), taken off the
    /// held list; they are still out of their slabs.
    pub(super) fn take_unheld(&mut self, still: impl Fn(u64) -> bool) -> Vec<Slot> {
        if self.held.is_empty() {
            return Vec::new();
        }
        let (keep, go) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(s, _)| still(s.born.load(Ordering::Relaxed)));
        self.held = keep;
        go
    }

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
            self.retention.unkeep_slabs(st.slabs[old].desc.bytes());
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
                self.retention.unkeep_slabs(st.slabs[id].desc.bytes());
                self.release_slab(&mut st, id);
            }
        }
    }
}
