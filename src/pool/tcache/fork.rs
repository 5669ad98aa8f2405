//! The thread caches around `fork()`: quiesce them all before, give them back to their owners
//! in the parent, and in the child drain those of threads that do not exist there. Part of
//! `tcache`; the handshake is in `reclaim`, the order of the allocator's fork handlers in
//! `crate::fork`.

use super::reclaim::{drain, quiesce};
use super::{ASYM, Cache, GONE, TC, caches};
use crate::prim::os;
use std::sync::atomic::Ordering;

// ---- fork ---------------------------------------------------------------------------------

/// Before `fork()`: hold the list and quiesce every cache, so that no thread is inside a busy
/// window when the process is copied.
pub(crate) fn fork_prepare(held: &mut crate::prim::fork::Held) {
    let list = caches();
    for &addr in list.iter() {
        // SAFETY: live caches (the list lock is held).
        quiesce(unsafe { &*(addr as *const Cache) });
    }
    FORK_SNAPSHOT.with(|v| *v.borrow_mut() = list.clone());
    held.push(list);
}

/// In the parent after `fork()` (the list lock still held by the caller's guards): give every
/// cache back to its owner.
pub(crate) fn fork_parent() {
    for_each_listed(|c| c.req.store(false, Ordering::Release));
}

/// In the child after `fork()`, once every allocator lock is released: the other threads do
/// not exist here, so their caches go back to the pools; this thread keeps its own.
pub(crate) fn fork_child() {
    if ASYM.load(Ordering::Relaxed) {
        // The registration belongs to the parent's address space.
        ASYM.store(os::membarrier_register(), Ordering::Release);
    }
    FORK_SNAPSHOT.with(|v| v.borrow_mut().clear());
    let own = TC.try_with(|c| c.get()).unwrap_or(0);
    let mut list = caches();
    let dead: Vec<usize> = list.iter().copied().filter(|&a| a != own).collect();
    list.retain(|&a| a == own);
    drop(list);
    for addr in dead {
        // SAFETY: the owner thread does not exist in the child, the cache was quiesced before
        // the fork, and it is out of the list: nothing else can reach it.
        let c = unsafe { Box::from_raw(addr as *mut Cache) };
        drain(&c);
    }
    if own > GONE {
        // SAFETY: this thread's live cache.
        unsafe { &*(own as *const Cache) }
            .req
            .store(false, Ordering::Release);
    }
}

fn for_each_listed(f: impl Fn(&Cache)) {
    // The list lock is held by this thread's fork guards: read the snapshot taken with it.
    let list = FORK_SNAPSHOT.with(|v| std::mem::take(&mut *v.borrow_mut()));
    for addr in list {
        // SAFETY: the list lock has been held since the snapshot, so every cache is live.
        f(unsafe { &*(addr as *const Cache) });
    }
}

thread_local! {
    /// The cache list as `fork_prepare` saw it (the forking thread's copy).
    static FORK_SNAPSHOT: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}
