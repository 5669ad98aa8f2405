//! Slabs: spans cut into equal slots of one size class, for requests up to `SMALL_MAX`.

use super::tcache::TCACHE_BATCH;
use super::*;

/// Descriptor of a slab: a span cut into equal slots of one class.
pub struct Slab {
    pub(super) pool: &'static Pool,
    pub(super) class: usize,
    pub(super) slot: usize,
    pub(super) nslots: usize,
    pub(super) base: AtomicUsize,
    pub(super) span: AtomicUsize,
    /// Reciprocal of `slot` for division by multiplication: `idx = off * magic >> 64`.
    pub(super) magic: u64,
    /// One byte per slot: 1 while the slot is handed out. A byte (not a bit) so that handing
    /// a slot out is a plain store; freeing swaps, so a double free is always seen.
    pub(super) state: Box<[AtomicU8]>,
    /// Requested bytes per live slot.
    pub(super) sizes: Box<[AtomicU32]>,
    pub(super) live: AtomicUsize,
}

impl Slab {
    /// Slot index of byte offset `off` (exact for offsets below 2^32).
    #[inline]
    pub(super) fn slot_of(&self, off: usize) -> usize {
        ((off as u128 * self.magic as u128) >> 64) as usize
    }

    pub(super) fn span(&self) -> &'static Span {
        // SAFETY: `span` always holds a pointer to a leaked, never-freed Span descriptor.
        unsafe { &*(self.span.load(Ordering::Acquire) as *const Span) }
    }
}

#[derive(Default)]
pub(super) struct ClassState {
    /// Free slots, most recently freed last.
    pub(super) free: Vec<(&'static Slab, u32)>,
    /// Every slab of the class that is in use.
    pub(super) slabs: Vec<&'static Slab>,
    /// Recycled descriptors.
    pub(super) spare: Vec<&'static Slab>,
}

impl Pool {
    // ---- small blocks ------------------------------------------------------------------

    #[inline]
    pub(super) fn alloc_small(&'static self, n: usize) -> Result<Alloc> {
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
    pub(super) fn refill(&'static self, ci: usize) -> Result<(&'static Slab, u32)> {
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
    pub(super) fn return_slots(
        &'static self,
        ci: usize,
        slots: impl Iterator<Item = (&'static Slab, u32)>,
    ) {
        let mut st = lock(&self.classes[ci]);
        for (slab, idx) in slots {
            slab.live.fetch_sub(1, Ordering::Relaxed);
            st.free.push((slab, idx));
        }
    }

    pub(super) fn grow_class(&'static self, ci: usize, st: &mut ClassState) -> Result<()> {
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
    pub(super) fn free_small(&'static self, s: &'static Slab, ptr: usize) -> Result<usize> {
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
    pub(super) fn trim_slabs(&'static self) -> usize {
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
}
