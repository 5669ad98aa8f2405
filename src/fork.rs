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
//! 6. the shared pinned memory's lock, then its table of live ranges (`backing::shared`).
//!
//! In the child, the shared pinned memory is mapped again, private (`backing::shared`), and
//! the caches of threads that do not exist there go back to their pools.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Lock guards held across a fork, released in the parent and the child.
pub(crate) struct Held(Vec<Box<dyn Any>>);

impl Held {
    /// Keep `guard` until the fork is over.
    pub(crate) fn push<G: 'static>(&mut self, guard: G) {
        self.0.push(Box::new(guard));
    }
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Set in a child process made by `fork()`.
static CHILD: AtomicBool = AtomicBool::new(false);

/// Whether this process is a `fork()` child of a process that had ump-alloc loaded.
pub fn is_fork_child() -> bool {
    CHILD.load(Ordering::Relaxed)
}

fn prepare() {
    let mut held = Held(Vec::new());
    crate::allocator::fork_prepare(&mut held);
    HELD.with(|h| *h.borrow_mut() = Some(held));
}

fn parent() {
    crate::backing::shared::fork_parent();
    crate::pool::tcache_fork_parent();
    HELD.with(|h| h.borrow_mut().take());
}

fn child() {
    CHILD.store(true, Ordering::Relaxed);
    crate::prim::cuda::after_fork_child();
    HELD.with(|h| h.borrow_mut().take());
    // Before anything else touches memory made before the fork.
    crate::backing::shared::fork_child();
    crate::pool::tcache_fork_child();
    crate::migrate::after_fork_child();
}

/// Register the fork handlers (at library load).
pub(crate) fn install() {
    crate::prim::os::at_fork(crate::prim::os::ForkHandlers {
        prepare,
        parent,
        child,
    });
}
