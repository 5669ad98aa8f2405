//! Counters each pool keeps (RMM's statistics adaptor, built into the pool), the device-side
//! totals per kind, and one pool's snapshot in the C layout (`ump_usage`). The whole
//! allocator's C view (`ump_stats`) is collected in `crate::stats`.

use crate::backing::Kind;
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicUsize, Ordering};

/// Counters of one pool, or of all stream pools of one device. All relaxed: they are
/// statistics, not synchronisation.
#[derive(Default)]
pub struct PoolStats {
    /// Requested bytes currently handed out. Signed: a thread cache batches its changes (see
    /// `pool::tcache`), so a block freed on another thread than the one that allocated it can
    /// take the sum below zero for a moment. Read it through [`in_use`](Self::in_use).
    in_use: AtomicIsize,
    pub in_use_peak: AtomicUsize,
    /// Bytes of physical memory currently obtained from the backing.
    pub mapped: AtomicUsize,
    pub mapped_peak: AtomicUsize,
    /// Bytes of the chunks held (address space): `mapped` plus what a lazily committed
    /// backing has reserved but not committed, plus rounding.
    pub reserved: AtomicUsize,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    /// Allocations served without calling the backing. Counts served by a thread's cache
    /// are added in batches (see `pool::flush_thread_counts`).
    pub hits: AtomicU64,
    /// Allocations that had to call the backing.
    pub misses: AtomicU64,
    /// `realloc`s done without a copy (the block stayed, grew over free memory or with its
    /// chunk, or moved with its pages), and those that copied, with the bytes copied.
    pub reallocs_in_place: AtomicU64,
    /// Managed memory: bytes discarded (freed blocks, and reused ones discarded-and-prefetched
    /// to the device), see `pool::residency`.
    pub discarded: AtomicU64,
    pub reallocs_copied: AtomicU64,
    pub realloc_copied_bytes: AtomicU64,
    /// Bytes and blocks freed but held back while a fork child may still read them (pools over
    /// memory shared with fork children: see `pool::hold`).
    pub fork_held: AtomicUsize,
    pub fork_held_blocks: AtomicUsize,
    /// Byte counters are added here too (the device-side total of a kind).
    parent: Option<&'static PoolStats>,
}

macro_rules! zero_stats {
    () => {
        PoolStats {
            in_use: AtomicIsize::new(0),
            in_use_peak: AtomicUsize::new(0),
            mapped: AtomicUsize::new(0),
            mapped_peak: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            reallocs_in_place: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            reallocs_copied: AtomicU64::new(0),
            realloc_copied_bytes: AtomicU64::new(0),
            fork_held: AtomicUsize::new(0),
            fork_held_blocks: AtomicUsize::new(0),
            parent: None,
        }
    };
}

/// Device-side byte totals per kind (all devices together), indexed by `ump_kind`.
static DEVICE_SIDE: [PoolStats; 8] = [
    zero_stats!(),
    zero_stats!(),
    zero_stats!(),
    zero_stats!(),
    zero_stats!(),
    zero_stats!(),
    zero_stats!(),
    zero_stats!(),
];

/// The device-side total of `kind`.
pub fn device_side(kind: Kind) -> &'static PoolStats {
    &DEVICE_SIDE[kind as usize]
}

fn peak_add(now: &AtomicUsize, peak: &AtomicUsize, n: usize) {
    let v = now.fetch_add(n, Ordering::Relaxed) + n;
    if v > peak.load(Ordering::Relaxed) {
        peak.fetch_max(v, Ordering::Relaxed);
    }
}

impl PoolStats {
    /// Counters whose byte counts also go to `parent`.
    pub fn with_parent(parent: &'static PoolStats) -> Self {
        PoolStats {
            parent: Some(parent),
            ..PoolStats::default()
        }
    }

    /// Requested bytes currently handed out (0 while batched changes of other threads make
    /// the sum negative for a moment).
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed).max(0) as usize
    }

    #[inline]
    pub fn add_in_use(&self, n: usize) {
        let v = self.in_use.fetch_add(n as isize, Ordering::Relaxed) + n as isize;
        if v > 0 && v as usize > self.in_use_peak.load(Ordering::Relaxed) {
            self.in_use_peak.fetch_max(v as usize, Ordering::Relaxed);
        }
        if let Some(p) = self.parent {
            p.add_in_use(n);
        }
    }

    #[inline]
    pub fn sub_in_use(&self, n: usize) {
        self.in_use.fetch_sub(n as isize, Ordering::Relaxed);
        if let Some(p) = self.parent {
            p.sub_in_use(n);
        }
    }

    pub fn on_resize(&self, old: usize, new: usize) {
        if new >= old {
            self.add_in_use(new - old);
        } else {
            self.sub_in_use(old - new);
        }
    }

    /// Count `n` more bytes mapped if that keeps `mapped` within `limit` (None: no limit).
    /// Atomic, so that threads mapping at once cannot pass the limit together. Returns
    /// whether the bytes were counted; the caller undoes it with [`on_unmap`](Self::on_unmap)
    /// if the mapping then fails.
    pub fn reserve_mapped(&self, n: usize, limit: Option<usize>) -> bool {
        if let Some(limit) = limit {
            let ok = self
                .mapped
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                    m.checked_add(n).filter(|&t| t <= limit)
                })
                .is_ok();
            if !ok {
                return false;
            }
            let v = self.mapped.load(Ordering::Relaxed);
            if v > self.mapped_peak.load(Ordering::Relaxed) {
                self.mapped_peak.fetch_max(v, Ordering::Relaxed);
            }
            if let Some(p) = self.parent {
                p.on_map(n);
            }
            return true;
        }
        self.on_map(n);
        true
    }

    pub fn on_map(&self, n: usize) {
        peak_add(&self.mapped, &self.mapped_peak, n);
        if let Some(p) = self.parent {
            p.on_map(n);
        }
    }

    pub fn on_unmap(&self, n: usize) {
        self.mapped.fetch_sub(n, Ordering::Relaxed);
        if let Some(p) = self.parent {
            p.on_unmap(n);
        }
    }

    /// A chunk of `n` bytes of address space was taken from the backing.
    pub fn on_reserve(&self, n: usize) {
        self.reserved.fetch_add(n, Ordering::Relaxed);
        if let Some(p) = self.parent {
            p.on_reserve(n);
        }
    }

    /// A chunk of `n` bytes of address space went back to the backing.
    pub fn on_unreserve(&self, n: usize) {
        self.reserved.fetch_sub(n, Ordering::Relaxed);
        if let Some(p) = self.parent {
            p.on_unreserve(n);
        }
    }

    /// A freed block of `bytes` is held back for fork children.
    pub fn on_hold(&self, bytes: usize) {
        self.fork_held.fetch_add(bytes, Ordering::Relaxed);
        self.fork_held_blocks.fetch_add(1, Ordering::Relaxed);
    }

    /// A held block of `bytes` went back to its pool.
    pub fn on_unhold(&self, bytes: usize) {
        self.fork_held.fetch_sub(bytes, Ordering::Relaxed);
        self.fork_held_blocks.fetch_sub(1, Ordering::Relaxed);
    }

    /// Reset the peaks to the current values.
    pub fn reset_peak(&self) {
        self.in_use_peak.store(self.in_use(), Ordering::Relaxed);
        self.mapped_peak
            .store(self.mapped.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// A snapshot in the C layout (`cached` is filled by the caller).
    pub fn usage(&self) -> ump_usage {
        let g = |a: &AtomicUsize| a.load(Ordering::Relaxed) as u64;
        let h = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ump_usage {
            in_use: self.in_use() as u64,
            in_use_peak: g(&self.in_use_peak),
            mapped: g(&self.mapped),
            mapped_peak: g(&self.mapped_peak),
            cached: 0,
            allocs: h(&self.allocs),
            frees: h(&self.frees),
            hits: h(&self.hits),
            misses: h(&self.misses),
        }
    }
}

/// Reset the peaks of the device-side totals.
pub fn reset_device_side_peaks() {
    for s in &DEVICE_SIDE {
        s.reset_peak();
    }
}

/// Byte and operation counts of one part of the allocator (see `ump_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct ump_usage {
    /// Bytes handed out now, as requested.
    pub in_use: u64,
    /// Most bytes handed out at once since start or `ump_reset_peak()`.
    pub in_use_peak: u64,
    /// Bytes obtained from the OS or the driver now (handed out, cached, and rounding).
    pub mapped: u64,
    /// Most bytes mapped at once since start or `ump_reset_peak()`.
    pub mapped_peak: u64,
    /// Free bytes held in the cache, ready for reuse (returned by `ump_trim()`).
    pub cached: u64,
    /// Allocations and frees.
    pub allocs: u64,
    pub frees: u64,
    /// Allocations served from the cache, and those that had to map memory.
    pub hits: u64,
    pub misses: u64,
}

impl ump_usage {
    /// Add `o` to `self`. Peaks add too: the sum of peaks bounds the peak of the sum.
    pub fn add(&mut self, o: &ump_usage) {
        self.in_use += o.in_use;
        self.in_use_peak += o.in_use_peak;
        self.mapped += o.mapped;
        self.mapped_peak += o.mapped_peak;
        self.cached += o.cached;
        self.allocs += o.allocs;
        self.frees += o.frees;
        self.hits += o.hits;
        self.misses += o.misses;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_see_byte_counts_and_peaks_reset() {
        static PARENT: PoolStats = zero_stats!();
        let s = PoolStats::with_parent(&PARENT);
        s.add_in_use(100);
        s.add_in_use(50);
        s.sub_in_use(120);
        s.on_map(4096);
        let u = s.usage();
        assert_eq!((u.in_use, u.in_use_peak, u.mapped), (30, 150, 4096));
        assert_eq!(PARENT.usage().in_use_peak, 150);
        s.reset_peak();
        assert_eq!(s.usage().in_use_peak, 30);
        s.on_unmap(4096);
        assert_eq!(PARENT.usage().mapped, 0);
    }
}
