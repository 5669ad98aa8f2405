//! Per-thread caches of free slots: a cached small alloc+free takes no lock.

use super::*;

/// Slots a thread keeps per class before it gives half back.
pub(super) const TCACHE_CAP: usize = 64;
/// Slots a thread takes from a class at once.
pub(super) const TCACHE_BATCH: usize = 32;

pub(super) type SlotList = Vec<(&'static Slab, u32)>;

/// A thread's cache of free slots, per class, for one pool (the first that caches on this
/// thread; in practice the host pool behind NumPy). Alloc and free on it take no lock and no
/// atomic read-modify-write. Slots in it count as out of their class (`live`), so trim leaves
/// their slabs alone; they go back when the cache overflows, on trim from this thread, and
/// when the thread exits.
pub(super) struct TcInner {
    /// The owning pool.
    pub(super) owner: &'static Pool,
    pub(super) bins: Vec<SlotList>,
    /// Operations served by the cache and not yet added to the pool's counters.
    pub(super) allocs: u64,
    pub(super) frees: u64,
}

/// Thread-local operation counts are added to the pool's counters every this many operations.
pub(super) const TCACHE_COUNT_FLUSH: u64 = 256;

impl TcInner {
    pub(super) fn flush_counts(&mut self) {
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
    pub(super) fn counted(&mut self) {
        if self.allocs + self.frees >= TCACHE_COUNT_FLUSH {
            self.flush_counts();
        }
    }

    #[inline]
    pub(super) fn pop(&mut self, ci: usize) -> Option<(&'static Slab, u32)> {
        let x = self.bins[ci].pop()?;
        self.allocs += 1;
        self.counted();
        Some(x)
    }

    /// Keep a freed slot, giving half the bin back to the class when it overflows.
    #[inline]
    pub(super) fn push(&mut self, pool: &'static Pool, slab: &'static Slab, idx: u32) {
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
    pub(super) fn flush(&mut self, pool: &'static Pool) {
        self.flush_counts();
        for (ci, bin) in self.bins.iter_mut().enumerate() {
            if !bin.is_empty() {
                pool.return_slots(ci, bin.drain(..));
            }
        }
    }
}

/// `TC` holds null before the thread has a cache and `TC_GONE` after it was destroyed.
pub(super) const TC_GONE: usize = 1;

thread_local! {
    /// This thread's cache, as a raw pointer in a thread-local *without* a destructor: one TLS
    /// access on the fast path, readable at any point of thread exit. glibc runs thread-local
    /// destructors before pthread-key destructors, so a free from a key destructor must find
    /// "gone" here rather than create a cache whose destructor would never run.
    static TC: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Owns the cache: touched once, when the cache is made; its destructor flushes it.
    static TC_GUARD: TcGuard = const { TcGuard };
}

pub(super) struct TcGuard;

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
pub(super) fn with_tcache<R>(pool: &'static Pool, f: impl FnOnce(&mut TcInner) -> R) -> Option<R> {
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
pub(super) fn ensure_tcache(pool: &'static Pool) -> bool {
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
