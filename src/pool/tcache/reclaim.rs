//! The reclaimer's side of the handshake (see `tcache`): registering for membarrier, the
//! heavy barrier, waiting for an owner to leave its busy window, draining a cache into its
//! slabs, and `reclaim`, which empties every thread's cache (`ump_trim`, an out-of-memory
//! retry). Also the statistics read from outside the fast path: the bytes cached by every
//! thread, and publishing the calling thread's counts. Part of `tcache`; `dead` and `fork` use
//! the handshake from here.

use super::{ASYM, ASYM_PROBED, Cache, GONE, TC, caches};
use crate::pool::types::Pool;
use crate::prim::os;
use std::sync::atomic::{Ordering, fence};

/// At the library's load: register for membarrier now if the process has a single thread,
/// where registering is cheap. With several threads the kernel waits for an RCU grace period
/// (`synchronize_rcu`): 5-24 ms at the first allocation on the 2-core CPU box. A C program
/// that links the library, or a process that loads it first thing, pays nothing then; the
/// Python hook registers before NumPy's import for the same reason.
pub(crate) fn register_membarrier_if_alone() {
    if crate::prim::os::thread_count() == Some(1) {
        probe_membarrier();
    }
}

pub(super) fn probe_membarrier() {
    if !ASYM_PROBED.swap(true, Ordering::AcqRel) {
        ASYM.store(os::membarrier_register(), Ordering::Release);
    }
}

/// The heavy side of the handshake.
pub(super) fn heavy_barrier() {
    if !(ASYM.load(Ordering::Acquire) && os::membarrier()) {
        fence(Ordering::SeqCst);
    }
}

/// Take the bins of `c` away from its owner: after this, until `req` is cleared, the owner
/// does not touch them. The caller holds the list lock.
pub(super) fn quiesce(c: &Cache) {
    c.req.store(true, Ordering::Relaxed);
    heavy_barrier();
    wait_idle(c);
}

/// The rest of the handshake, once `req` is stored and a barrier ran: wait until the owner is
/// outside its busy window.
pub(super) fn wait_idle(c: &Cache) {
    let mut spins = 0u32;
    while c.busy.load(Ordering::Acquire) {
        spins += 1;
        if spins < 128 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Give every slot of `c` back to its slabs and publish its counts. The caller holds the bins.
pub(super) fn drain(c: &Cache) {
    // SAFETY: the caller holds the bins (handshake done, or the owner at thread exit).
    let inner = unsafe { c.inner() };
    c.flush_counts(inner);
    for (ci, bin) in inner.bins.iter_mut().enumerate() {
        if !bin.slots.is_empty() {
            c.owner.return_slots(ci, bin.slots.drain(..));
        }
    }
    inner.bytes = 0;
    c.bytes.store(0, Ordering::Relaxed);
}

/// Empty the caches of every thread that caches for `pool` (all pools: None), idle threads
/// included. Returns the bytes of slots given back.
pub(crate) fn reclaim(pool: Option<&'static Pool>) -> usize {
    let list = caches();
    let mut bytes = 0;
    for &addr in list.iter() {
        // SAFETY: caches in the list are live (their owner removes them under the lock first).
        let c = unsafe { &*(addr as *const Cache) };
        if pool.is_some_and(|p| !std::ptr::eq(p, c.owner)) {
            continue;
        }
        quiesce(c);
        bytes += c.bytes.load(Ordering::Relaxed);
        drain(c);
        c.req.store(false, Ordering::Release);
    }
    bytes
}

/// Bytes held in the caches of every thread for `pool`.
pub(crate) fn cached_bytes(pool: &'static Pool) -> usize {
    let list = caches();
    list.iter()
        // SAFETY: caches in the list are live.
        .map(|&a| unsafe { &*(a as *const Cache) })
        .filter(|c| std::ptr::eq(c.owner, pool))
        .map(|c| c.bytes.load(Ordering::Relaxed))
        .sum()
}

/// Publish the calling thread's cached operation counts and bytes in use to its pool's
/// statistics.
pub fn flush_thread_counts() {
    let p = TC.try_with(|c| c.get()).unwrap_or(GONE);
    if p <= GONE {
        return;
    }
    // SAFETY: this thread's live cache.
    let c = unsafe { &*(p as *const Cache) };
    if c.enter() {
        // SAFETY: inside our busy window.
        c.flush_counts(unsafe { c.inner() });
        c.leave();
    }
}
