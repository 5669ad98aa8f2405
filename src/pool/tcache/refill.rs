//! Making a thread's cache and filling it: `ensure` makes the cache (bins sized by
//! `caps_for`), `fill` says how many slots a refill from the slabs takes for it and `stash`
//! puts them in. Part of `tcache`, which holds the cache and its fast path; the slabs' side of
//! a refill is `small`.

use super::reclaim::probe_membarrier;
use super::{Bin, CAP, CLASS_BYTES, COUNT_FLUSH, Cache, GONE, Inner, TC, TC_GUARD, caches, mine};
use crate::pool::types::{Pool, Slot};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Slots a refill takes from a class at once for the cache, at most.
const BATCH: usize = 32;

/// How many slots of class `ci` a refill should take for this thread's cache (0: none).
pub(in crate::pool) fn fill(pool: &'static Pool, ci: usize) -> usize {
    if mine(pool).is_none() {
        return 0;
    }
    let cap = caps_for(pool, ci);
    (cap / 2).min(BATCH)
}

/// Put `slots` (of class `ci`, fresh from a refill) into this thread's cache. Returns those
/// that did not fit.
pub(in crate::pool) fn stash(pool: &'static Pool, ci: usize, mut slots: Vec<Slot>) -> Vec<Slot> {
    let Some(c) = mine(pool) else {
        return slots;
    };
    if slots.is_empty() || !c.enter() {
        return slots;
    }
    // SAFETY: inside our busy window.
    let inner = unsafe { c.inner() };
    let bin = &mut inner.bins[ci];
    let n = bin.cap.saturating_sub(bin.slots.len()).min(slots.len());
    bin.slots.extend(slots.drain(slots.len() - n..));
    inner.bytes += n * bin.size;
    inner.fresh = true;
    c.bytes.store(inner.bytes, Ordering::Relaxed);
    c.leave();
    slots
}

fn caps_for(pool: &Pool, ci: usize) -> usize {
    (CLASS_BYTES / pool.table.sizes[ci]).clamp(1, CAP)
}

/// The most bytes one thread's cache for `pool` can hold.
#[cfg(test)]
pub(in crate::pool) fn max_bytes(pool: &Pool) -> usize {
    (0..pool.table.len())
        .map(|ci| caps_for(pool, ci) * pool.table.sizes[ci])
        .sum()
}

/// Make this thread's cache for `pool` if it has none. Only the host pool (not stream-ordered)
/// caches, and a thread has one cache. Returns whether this thread caches for `pool`.
pub(in crate::pool) fn ensure(pool: &'static Pool) -> bool {
    let p = TC.try_with(|c| c.get()).unwrap_or(GONE);
    if p == GONE {
        return false;
    }
    if p != 0 {
        // SAFETY: this thread's live cache.
        return std::ptr::eq(unsafe { &*(p as *const Cache) }.owner, pool);
    }
    if pool.is_stream_ordered() {
        return false;
    }
    // Register the destructor first: if the thread is already past its TLS destructors, the
    // guard is gone and no cache is made.
    if TC_GUARD.try_with(|_| ()).is_err() {
        return false;
    }
    probe_membarrier();
    let cache = Box::new(Cache {
        owner: pool,
        primary: pool.is_host_primary(),
        busy: AtomicBool::new(false),
        req: AtomicBool::new(false),
        bytes: AtomicUsize::new(0),
        inner: UnsafeCell::new(Inner {
            // Room for the cap and one more: no allocation inside a busy window.
            bins: (0..pool.table.len())
                .map(|ci| {
                    let cap = caps_for(pool, ci);
                    Bin {
                        slots: Vec::with_capacity(cap + 1),
                        cap,
                        size: pool.table.sizes[ci],
                    }
                })
                .collect(),
            bytes: 0,
            allocs: 0,
            frees: 0,
            reallocs: 0,
            ops_left: COUNT_FLUSH as u32,
            in_use: 0,
            fresh: false,
        }),
    });
    let addr = Box::into_raw(cache) as usize;
    caches().push(addr);
    let _ = TC.try_with(|c| c.set(addr));
    true
}
