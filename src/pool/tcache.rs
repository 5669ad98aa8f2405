//! Per-thread caches of free slots: a cached small alloc+free takes no lock and no atomic
//! read-modify-write.
//!
//! A thread's cache belongs to the host pool (NumPy's side); stream-ordered device pools have
//! none. Slots in a cache count as out of their slab (`out`), so a slab with cached slots is
//! never released. Caches are bounded: at most [`CAP`] slots and [`CLASS_BYTES`] bytes per
//! class (one slot at least), which bounds a thread's cache at [`max_bytes`] (about 2 MiB at
//! the default alignment).
//!
//! **Reclaim from other threads.** `ump_trim`, an out-of-memory retry and `fork()` must empty
//! the caches of every thread, including threads that are alive but idle. Every cache is in a
//! global list, and its owner touches its bins only inside a *busy window*: it stores
//! `busy = true`, then reads `req`; a reclaimer stores `req = true`, then reads `busy`. That is
//! Dekker's protocol, made asymmetric: the owner's side has only a compiler fence, and the
//! reclaimer issues `membarrier(PRIVATE_EXPEDITED)`, which runs a full memory barrier on every
//! thread of the process, so at least one side sees the other's store. Where the kernel lacks
//! membarrier both sides use a `SeqCst` fence. An owner that sees `req` leaves at once and uses
//! the class lists directly; a reclaimer waits until `busy` is false and then owns the bins
//! until it clears `req`. Reclaimers are serialised by the list's lock.
//!
//! This file holds the cache itself, the owner's side of the handshake and the fast path
//! (`pop`, `push`, `alloc_primary`, `note_resize`). Its parts: `refill` (making a thread's
//! cache, how much a refill takes and stashing it), `reclaim` (the reclaimer's side: emptying
//! caches of other threads, and reading their statistics), `dead` (giving back cached slots
//! of slabs with no live block) and `fork` (the caches around `fork()`).

use super::types::{Pool, Slot};
use crate::prim::fork::lock;
use std::cell::{Cell, UnsafeCell};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, compiler_fence, fence};

mod dead;
mod fork;
mod reclaim;
mod refill;

pub(crate) use dead::release_dead;
pub(super) use dead::take_slab;
pub(crate) use fork::{fork_child, fork_parent, fork_prepare};
use reclaim::drain;
pub use reclaim::flush_thread_counts;
pub(crate) use reclaim::{cached_bytes, reclaim, register_membarrier_if_alone};
#[cfg(test)]
pub(super) use refill::max_bytes;
pub(super) use refill::{ensure, fill, stash};

/// Slots a thread keeps per class at most.
pub(super) const CAP: usize = 64;
/// Bytes a thread keeps per class at most (the largest classes keep one slot).
pub(super) const CLASS_BYTES: usize = 64 << 10;
/// Operations counted locally before they are added to the pool's counters.
const COUNT_FLUSH: u64 = 256;
/// Bytes of `in_use` change kept locally before they are added to the pool's counter (so a
/// cached alloc+free costs no atomic read-modify-write on shared statistics). The host side's
/// `in_use` and its peak lag by less than this per thread; `ump_stats` flushes the caller's.
const IN_USE_FLUSH: isize = 256 << 10;

/// The cached slots of one class.
struct Bin {
    slots: Vec<Slot>,
    /// Slots kept at most.
    cap: usize,
    /// The class's slot size.
    size: usize,
}

struct Inner {
    bins: Vec<Bin>,
    /// Bytes of slots held (mirrored in `Cache::bytes` for other threads).
    bytes: usize,
    /// Operations served and not yet added to the pool's counters.
    allocs: u64,
    frees: u64,
    /// Reallocs done in place by the fast path, not yet added to the pool's counter.
    reallocs: u64,
    /// Operations left before the counts are published (counts down from `COUNT_FLUSH`).
    ops_left: u32,
    /// Change of requested bytes in use not yet added to the pool's `in_use`.
    in_use: isize,
    /// Slots came in since `release_dead` last looked.
    fresh: bool,
}

/// One thread's cache.
pub(super) struct Cache {
    owner: &'static Pool,
    /// The owner is the host side's primary pool (the allocation fast path serves it).
    primary: bool,
    /// The owner is inside a busy window.
    busy: AtomicBool,
    /// A reclaimer asks for the bins.
    req: AtomicBool,
    /// Bytes of slots held (written by whoever holds the bins, read by statistics).
    bytes: AtomicUsize,
    inner: UnsafeCell<Inner>,
}

// SAFETY: `inner` is touched only by the owner inside a busy window or by a reclaimer after
// the handshake described in the module documentation; every other field is atomic.
unsafe impl Sync for Cache {}

/// Whether `membarrier(PRIVATE_EXPEDITED)` is registered for this process (else both sides
/// of the handshake fence).
static ASYM: AtomicBool = AtomicBool::new(false);
static ASYM_PROBED: AtomicBool = AtomicBool::new(false);

/// Addresses of every live cache. Its lock also serialises reclaimers.
static CACHES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn caches() -> std::sync::MutexGuard<'static, Vec<usize>> {
    lock(&CACHES)
}

/// `TC` holds 0 before the thread has a cache and `GONE` after it was destroyed.
const GONE: usize = 1;

thread_local! {
    /// This thread's cache, as a raw pointer in a thread-local *without* a destructor: one TLS
    /// access on the fast path, readable at any point of thread exit. glibc runs thread-local
    /// destructors before pthread-key destructors, so a free from a key destructor must find
    /// "gone" here rather than create a cache whose destructor would never run.
    static TC: Cell<usize> = const { Cell::new(0) };
    /// Owns the cache: touched once, when the cache is made; its destructor empties it.
    static TC_GUARD: Guard = const { Guard };
}

struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        let p = TC.try_with(|c| c.replace(GONE)).unwrap_or(0);
        if p <= GONE {
            return;
        }
        // Out of the list first: no reclaimer can reach the cache afterwards.
        caches().retain(|&c| c != p);
        // SAFETY: `p` came from Box::into_raw in `ensure`; it is unique to this thread and no
        // longer reachable from TC or the list.
        let cache = unsafe { Box::from_raw(p as *mut Cache) };
        drain(&cache);
    }
}

impl Cache {
    /// Open a busy window; false when a reclaimer holds the bins.
    #[inline(always)]
    fn enter(&self) -> bool {
        self.busy.store(true, Ordering::Relaxed);
        if ASYM.load(Ordering::Relaxed) {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        if self.req.load(Ordering::Acquire) {
            self.busy.store(false, Ordering::Release);
            return false;
        }
        true
    }

    #[inline(always)]
    fn leave(&self) {
        self.busy.store(false, Ordering::Release);
    }

    /// The bins, inside a busy window or with the bins reclaimed.
    ///
    /// # Safety
    /// The caller is the owner inside a busy window, or a reclaimer that completed the
    /// handshake (or the only thread left after fork), and holds no other reference.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn inner(&self) -> &mut Inner {
        // SAFETY: forwarded from the caller.
        unsafe { &mut *self.inner.get() }
    }

    /// Count one operation (its `in_use` change already added); whether the counts kept here
    /// are then due to be published (every `COUNT_FLUSH` operations, or `IN_USE_FLUSH` bytes
    /// of change either way). `ops_left` starts at `COUNT_FLUSH` and is set back there by
    /// every publication, which follows as soon as it reaches 0: it is never 0 here.
    #[inline(always)]
    fn count_op(inner: &mut Inner) -> bool {
        debug_assert!(inner.ops_left > 0);
        inner.ops_left = inner.ops_left.wrapping_sub(1);
        inner.ops_left == 0 || (inner.in_use + IN_USE_FLUSH) as usize > 2 * IN_USE_FLUSH as usize
    }

    /// Publish the operation counts and the change of bytes in use to the owner's statistics.
    #[cold]
    #[inline(never)]
    fn flush_counts(&self, inner: &mut Inner) {
        let st = self.owner.stats;
        self.flush_in_use(inner);
        inner.ops_left = COUNT_FLUSH as u32;
        if inner.reallocs > 0 {
            st.reallocs_in_place
                .fetch_add(std::mem::take(&mut inner.reallocs), Ordering::Relaxed);
        }
        if inner.allocs + inner.frees == 0 {
            return;
        }
        st.allocs.fetch_add(inner.allocs, Ordering::Relaxed);
        st.hits.fetch_add(inner.allocs, Ordering::Relaxed);
        st.frees.fetch_add(inner.frees, Ordering::Relaxed);
        inner.allocs = 0;
        inner.frees = 0;
    }

    fn flush_in_use(&self, inner: &mut Inner) {
        let d = std::mem::take(&mut inner.in_use);
        if d > 0 {
            self.owner.stats.add_in_use(d as usize);
        } else if d < 0 {
            self.owner.stats.sub_in_use(d.unsigned_abs());
        }
    }
}

/// This thread's cache if it exists and belongs to `pool`.
#[inline(always)]
pub(super) fn mine(pool: &'static Pool) -> Option<&'static Cache> {
    let p = TC.try_with(|c| c.get()).unwrap_or(GONE);
    if p <= GONE {
        return None;
    }
    // SAFETY: `p` is this thread's live cache (freed only by this thread's exit).
    let c = unsafe { &*(p as *const Cache) };
    std::ptr::eq(c.owner, pool).then_some(c)
}

/// Take a cached slot of class `ci` for a block of `n` bytes (counted in use here).
#[inline]
pub(super) fn pop(pool: &'static Pool, ci: usize, n: usize) -> Option<Slot> {
    pop_from(mine(pool)?, ci, n)
}

/// `pop` from cache `c` (this thread's).
#[inline(always)]
fn pop_from(c: &Cache, ci: usize, n: usize) -> Option<Slot> {
    if !c.enter() {
        return None;
    }
    // SAFETY: inside our busy window.
    let inner = unsafe { c.inner() };
    debug_assert!(ci < inner.bins.len());
    // SAFETY: `ci` is a class of the owner's table, which has one bin per class.
    let bin = unsafe { inner.bins.get_unchecked_mut(ci) };
    let x = bin.slots.pop();
    if x.is_some() {
        inner.bytes -= bin.size;
        c.bytes.store(inner.bytes, Ordering::Relaxed);
        inner.allocs += 1;
        inner.in_use += n as isize;
        if Cache::count_op(inner) {
            c.flush_counts(inner);
        }
    }
    c.leave();
    x
}

/// The allocation fast path (`pool::alloc_cached`): a block of `n <= SMALL_MAX` bytes from
/// this thread's cache, if the cache serves the host side's primary pool and holds a slot of
/// `n`'s class. Counted here as `pop` counts. `n <= SMALL_MAX`.
#[inline(always)]
pub(super) fn alloc_primary(n: usize) -> Option<usize> {
    debug_assert!(n <= super::class::SMALL_MAX);
    let p = TC.try_with(|c| c.get()).unwrap_or(GONE);
    if p <= GONE {
        return None;
    }
    // SAFETY: `p` is this thread's live cache (freed only by this thread's exit).
    let c = unsafe { &*(p as *const Cache) };
    if !c.primary {
        return None;
    }
    // SAFETY: `n <= SMALL_MAX` (the caller, `pool::alloc_cached`, checks it).
    let ci = unsafe { c.owner.table.class_of_unchecked(n) };
    let (slab, idx) = pop_from(c, ci, n)?;
    Some(slab.hand_out(idx, n))
}

/// A small block of the cache's pool was resized in place from `old` to `new` requested bytes
/// (the realloc fast path): counted here, as `pop` and `push` count. Returns false when a
/// reclaimer holds the bins (the caller then counts it on the pool).
#[inline(always)]
pub(super) fn note_resize(c: &Cache, old: usize, new: usize) -> bool {
    if !c.enter() {
        return false;
    }
    // SAFETY: inside our busy window.
    let inner = unsafe { c.inner() };
    inner.in_use += new as isize - old as isize;
    inner.reallocs += 1;
    if Cache::count_op(inner) {
        c.flush_counts(inner);
    }
    c.leave();
    true
}

/// Keep a freed slot of class `ci` (of a block of `n` bytes) in this thread's cache. When the
/// bin is full, its oldest half goes back to the slabs. Returns false when this thread has no
/// cache for `pool` (the caller then returns the slot itself); the free and its bytes are then
/// not counted here either.
#[inline]
pub(super) fn push(pool: &'static Pool, ci: usize, slot: Slot, n: usize) -> bool {
    let Some(c) = mine(pool) else {
        return false;
    };
    push_to(c, pool, ci, slot, n)
}

/// `push` into cache `c` (this thread's, for `pool`).
#[inline(always)]
pub(super) fn push_to(c: &Cache, pool: &'static Pool, ci: usize, slot: Slot, n: usize) -> bool {
    if !c.enter() {
        return false;
    }
    // SAFETY: inside our busy window.
    let inner = unsafe { c.inner() };
    debug_assert!(ci < inner.bins.len());
    // SAFETY: `ci` is a class of the owner's table, which has one bin per class.
    let bin = unsafe { inner.bins.get_unchecked_mut(ci) };
    if bin.slots.len() >= bin.cap {
        push_spilling(c, pool, ci, slot, n);
        return true;
    }
    put(c, inner, ci, slot, n);
    c.leave();
    true
}

/// `push_to` into a full bin (inside the busy window, which it closes): the bin's oldest half
/// goes back to the slabs, then the slot goes in. Out of line, so that the common push keeps
/// no spill state.
#[cold]
#[inline(never)]
fn push_spilling(c: &Cache, pool: &'static Pool, ci: usize, slot: Slot, n: usize) {
    // SAFETY: inside our busy window (opened by `push_to`).
    let inner = unsafe { c.inner() };
    // SAFETY: as in `push_to`.
    let bin = unsafe { inner.bins.get_unchecked_mut(ci) };
    let old = take_oldest_half(&mut bin.slots);
    inner.bytes -= old.len() * bin.size;
    put(c, inner, ci, slot, n);
    c.leave();
    spill(pool, ci, old);
}

/// Put `slot` into bin `ci`, which has room, and count the free (inside the busy window).
#[inline(always)]
fn put(c: &Cache, inner: &mut Inner, ci: usize, slot: Slot, n: usize) {
    // SAFETY: `ci` is a class of the owner's table, which has one bin per class.
    let bin = unsafe { inner.bins.get_unchecked_mut(ci) };
    let len = bin.slots.len();
    debug_assert!(len <= bin.cap && len < bin.slots.capacity());
    // SAFETY: bins are made with room for `cap + 1` slots and hold at most `cap` here (fewer
    // from `push_to`; after a spill, `cap` minus its oldest half, which is `cap` itself for a
    // bin of one slot), so the write is inside the allocation, and the slot at `len` is then
    // initialised.
    unsafe {
        bin.slots.as_mut_ptr().add(len).write(slot);
        bin.slots.set_len(len + 1);
    }
    inner.bytes += bin.size;
    c.bytes.store(inner.bytes, Ordering::Relaxed);
    inner.fresh = true;
    inner.frees += 1;
    inner.in_use -= n as isize;
    if Cache::count_op(inner) {
        c.flush_counts(inner);
    }
}

#[cold]
fn take_oldest_half(slots: &mut Vec<Slot>) -> Vec<Slot> {
    slots.drain(..slots.len() / 2).collect()
}

#[cold]
#[inline(never)]
fn spill(pool: &'static Pool, ci: usize, old: Vec<Slot>) {
    pool.return_slots(ci, old);
}
