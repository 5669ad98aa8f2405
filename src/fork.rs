//! `fork()` safety. ump-alloc is a process-wide allocator, and PyTorch's DataLoader and
//! `multiprocessing` fork by default on Linux: a child must find every allocator lock free
//! and every structure consistent, whatever the other threads were doing at the fork.
//!
//! `pthread_atfork` handlers (registered when the library is loaded) take every lock of the
//! allocator before the fork, in one fixed order, and release them in the parent and in the
//! child afterwards. The order is the one every code path nests them in, so taking them all
//! cannot deadlock with a thread that is inside the allocator:
//!
//! 1. `allocator::INIT`, `allocator::OVERRIDES`, the CUDA loader lock;
//! 2. the lock that makes device pool sets, then each device's lock that makes stream pools;
//! 3. the thread-cache list, and every thread cache is quiesced (no thread is inside one);
//! 4. every pool's class locks, then every pool's large lock, then every pool's retire-event
//!    lock (host pool first, then each device's pools);
//! 5. each device's orphan list, each device's table of blocks recorded on other streams,
//!    each device's virtual-memory space, the CUDA event cache, the scope table, the queue of
//!    background migrations;
//! 6. the host side's list of chunks waiting to be pinned (`backing::registered`), the shared
//!    pinned memory's lock, then its table of live ranges (`backing::shared`).
//!
//! In the child, the shared pinned memory is mapped again, private (`backing::shared`), and
//! the caches of threads that do not exist there go back to their pools.
//!
//! This is the protocol; the mechanism (the registration, the child flag, the guards held and
//! the lock helper every module takes its locks with) is `prim::fork`'s, at the bottom.

use crate::prim::cuda;
use crate::prim::fork::{ForkHandlers, Held, at_fork};
use crate::{allocator, backing, migrate, pool, scope};
use std::cell::RefCell;

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Before `fork()`: take every allocator lock in the order above.
fn prepare() {
    let mut held = Held::default();
    let h = &mut held;
    allocator::fork_lock_settings(h);
    cuda::fork_lock_load(h);
    if let Some(a) = allocator::get() {
        a.fork_lock_device_pools(h);
        let groups = a.device_groups();
        for g in &groups {
            g.fork_lock_create(h);
        }
        pool::tcache_fork_prepare(h);
        let pools = a.pools();
        for p in &pools {
            p.fork_lock_classes(h);
        }
        for p in &pools {
            p.fork_lock_large(h);
        }
        for p in &pools {
            p.fork_lock_retire(h);
        }
        for g in &groups {
            g.fork_lock_orphans(h);
        }
        for g in &groups {
            g.fork_lock_recorded(h);
        }
        for g in &groups {
            g.fork_lock_backing(h);
        }
    } else {
        pool::tcache_fork_prepare(h);
    }
    cuda::fork_lock_events(h);
    scope::fork_lock(h);
    migrate::fork_lock(h);
    backing::registered::fork_lock(h);
    backing::shared::fork_prepare(h);
    HELD.with(|h| *h.borrow_mut() = Some(held));
}

fn parent() {
    backing::shared::fork_parent();
    pool::tcache_fork_parent();
    HELD.with(|h| h.borrow_mut().take());
}

fn child() {
    HELD.with(|h| h.borrow_mut().take());
    // Before anything else touches memory made before the fork.
    backing::shared::fork_child();
    pool::tcache_fork_child();
    migrate::after_fork_child();
}

/// Register the fork handlers (at library load).
pub(crate) fn install() {
    at_fork(ForkHandlers {
        prepare,
        parent,
        child,
    });
}
