//! Statistics: counters each pool keeps (RMM's statistics adaptor, built into the pool), and
//! the C view of them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Counters of one pool. All relaxed: they are statistics, not synchronisation.
#[derive(Default)]
pub struct PoolStats {
    /// Requested bytes currently handed out.
    pub in_use: AtomicUsize,
    pub in_use_peak: AtomicUsize,
    /// Bytes currently obtained from the backing.
    pub mapped: AtomicUsize,
    pub mapped_peak: AtomicUsize,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    /// Allocations served without calling the backing. Counts served by a thread's cache
    /// are added in batches (see `pool::flush_thread_counts`).
    pub hits: AtomicU64,
    /// Allocations that had to call the backing.
    pub misses: AtomicU64,
}

impl PoolStats {
    pub fn add_in_use(&self, n: usize) {
        let now = self.in_use.fetch_add(n, Ordering::Relaxed) + n;
        if now > self.in_use_peak.load(Ordering::Relaxed) {
            self.in_use_peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    pub fn sub_in_use(&self, n: usize) {
        self.in_use.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn on_resize(&self, old: usize, new: usize) {
        if new >= old {
            self.add_in_use(new - old);
        } else {
            self.sub_in_use(old - new);
        }
    }

    pub fn on_map(&self, n: usize) {
        let now = self.mapped.fetch_add(n, Ordering::Relaxed) + n;
        self.mapped_peak.fetch_max(now, Ordering::Relaxed);
    }

    pub fn on_unmap(&self, n: usize) {
        self.mapped.fetch_sub(n, Ordering::Relaxed);
    }

    /// Reset the peaks to the current values.
    pub fn reset_peak(&self) {
        self.in_use_peak
            .store(self.in_use.load(Ordering::Relaxed), Ordering::Relaxed);
        self.mapped_peak
            .store(self.mapped.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}
