//! `fork()`'s mechanism: the `pthread_atfork` registration, whether this process is a fork
//! child, the lock guards held across a fork, and the one way every lock of ump-alloc is taken
//! (ignoring poison). Which locks are held, in which order, and what the parent and the child
//! do afterwards is the protocol, `crate::fork`'s.

use std::any::Any;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Lock a mutex, ignoring poisoning: a panic caught at the C boundary must not wedge the
/// allocator. Every critical section keeps its state consistent at each point a panic could
/// occur. Every lock a fork holds is taken this way.
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lock guards held across a fork, released in the parent and the child.
#[derive(Default)]
pub struct Held(Vec<Box<dyn Any>>);

impl Held {
    /// Keep `guard` until the fork is over.
    pub fn push<G: 'static>(&mut self, guard: G) {
        self.0.push(Box::new(guard));
    }
}

/// How many `fork()`s, made while ump-alloc was loaded, lie between this process and the one
/// that loaded it (0 there). Raised in each child before its handler runs.
static DEPTH: AtomicU32 = AtomicU32::new(0);

/// Whether this process is a `fork()` child of a process that had ump-alloc loaded.
#[inline]
pub fn is_fork_child() -> bool {
    depth() != 0
}

/// How many forks deep this process is (see [`is_fork_child`]): state made at one depth and
/// seen at another was made by an ancestor, before a fork.
#[inline]
pub fn depth() -> u32 {
    DEPTH.load(Ordering::Relaxed)
}

/// The process-wide `fork()` handlers (see `crate::fork`).
#[derive(Clone, Copy)]
pub struct ForkHandlers {
    pub prepare: fn(),
    pub parent: fn(),
    pub child: fn(),
}

static FORK_HANDLERS: OnceLock<ForkHandlers> = OnceLock::new();
static FORK_SETS: AtomicU8 = AtomicU8::new(0);

thread_local! {
    /// Which registered set ran `prepare` in the fork this thread is doing (0: none).
    static FORK_RAN: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

fn fork_step(set: u8, step: u8) {
    let Some(h) = FORK_HANDLERS.get() else { return };
    let ran = FORK_RAN.with(|r| r.get());
    match step {
        0 if ran == 0 => {
            FORK_RAN.with(|r| r.set(set));
            (h.prepare)();
        }
        1 if ran == set => {
            FORK_RAN.with(|r| r.set(0));
            (h.parent)();
        }
        2 if ran == set => {
            FORK_RAN.with(|r| r.set(0));
            DEPTH.fetch_add(1, Ordering::Relaxed);
            (h.child)();
        }
        _ => {}
    }
}

macro_rules! fork_set {
    ($set:literal, $p:ident, $a:ident, $c:ident) => {
        extern "C" fn $p() {
            fork_step($set, 0)
        }
        extern "C" fn $a() {
            fork_step($set, 1)
        }
        extern "C" fn $c() {
            fork_step($set, 2)
        }
    };
}
fork_set!(1, fork_prepare_1, fork_parent_1, fork_child_1);
fork_set!(2, fork_prepare_2, fork_parent_2, fork_child_2);

/// Register `h` with `pthread_atfork` (once per process; later calls do nothing).
pub fn at_fork(h: ForkHandlers) {
    if FORK_HANDLERS.set(h).is_err() {
        return;
    }
    // SAFETY: the handlers are plain functions that live as long as the process.
    if unsafe {
        libc::pthread_atfork(
            Some(fork_prepare_1),
            Some(fork_parent_1),
            Some(fork_child_1),
        )
    } == 0
    {
        FORK_SETS.store(1, Ordering::Release);
    }
}

/// Register the handlers a second time, after a library that registers fork handlers of its
/// own (the CUDA driver) was loaded: `prepare` handlers run in reverse order of registration,
/// so ours then run before that library takes its locks, and a thread of ours that waits for
/// that library inside one of our locks can finish. Whichever set runs `prepare` first in a
/// fork does the work; the other does nothing. Once per process.
pub fn at_fork_again() {
    if FORK_SETS
        .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    // SAFETY: as in `at_fork`.
    unsafe {
        libc::pthread_atfork(
            Some(fork_prepare_2),
            Some(fork_parent_2),
            Some(fork_child_2),
        )
    };
}
