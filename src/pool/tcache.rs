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

use super::Pool;
use super::slab::{Slab, Slot};
use crate::prim::fork::lock;
use crate::prim::os;
use std::cell::{Cell, UnsafeCell};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, compiler_fence, fence};

/// Slots a thread keeps per class at most.
pub(super) const CAP: usize = 64;
/// Bytes a thread keeps per class at most (the largest classes keep one slot).
pub(super) const CLASS_BYTES: usize = 64 << 10;
/// Slots a refill takes from a class at once for the cache, at most.
const BATCH: usize = 32;
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

    /// Whether the counts kept here are due to be published (every `COUNT_FLUSH` operations,
    /// or `IN_USE_FLUSH` bytes of change either way).
    #[inline(always)]
    fn counts_due(inner: &Inner) -> bool {
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
        inner.ops_left = inner.ops_left.saturating_sub(1);
        inner.in_use += n as isize;
        if Cache::counts_due(inner) {
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
    debug_assert!(n <= super::SMALL_MAX);
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
    inner.ops_left = inner.ops_left.saturating_sub(1);
    if Cache::counts_due(inner) {
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
    let overflow = if bin.slots.len() >= bin.cap {
        let old = take_oldest_half(&mut bin.slots);
        inner.bytes -= old.len() * bin.size;
        Some(old)
    } else {
        None
    };
    let len = bin.slots.len();
    debug_assert!(len < bin.slots.capacity());
    // SAFETY: bins are made with room for `cap + 1` slots and hold at most `cap` here (the
    // oldest half went above when the bin was full), so the write is inside the allocation,
    // and the slot at `len` is then initialised.
    unsafe {
        bin.slots.as_mut_ptr().add(len).write(slot);
        bin.slots.set_len(len + 1);
    }
    inner.bytes += bin.size;
    c.bytes.store(inner.bytes, Ordering::Relaxed);
    inner.fresh = true;
    inner.frees += 1;
    inner.ops_left = inner.ops_left.saturating_sub(1);
    inner.in_use -= n as isize;
    if Cache::counts_due(inner) {
        c.flush_counts(inner);
    }
    c.leave();
    if let Some(old) = overflow {
        spill(pool, ci, old);
    }
    true
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

/// How many slots of class `ci` a refill should take for this thread's cache (0: none).
pub(super) fn fill(pool: &'static Pool, ci: usize) -> usize {
    if mine(pool).is_none() {
        return 0;
    }
    let cap = caps_for(pool, ci);
    (cap / 2).min(BATCH)
}

/// Put `slots` (of class `ci`, fresh from a refill) into this thread's cache. Returns those
/// that did not fit.
pub(super) fn stash(pool: &'static Pool, ci: usize, mut slots: Vec<Slot>) -> Vec<Slot> {
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
pub(super) fn max_bytes(pool: &Pool) -> usize {
    (0..pool.table.len())
        .map(|ci| caps_for(pool, ci) * pool.table.sizes[ci])
        .sum()
}

/// Make this thread's cache for `pool` if it has none. Only the host pool (not stream-ordered)
/// caches, and a thread has one cache. Returns whether this thread caches for `pool`.
pub(super) fn ensure(pool: &'static Pool) -> bool {
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

fn probe_membarrier() {
    if !ASYM_PROBED.swap(true, Ordering::AcqRel) {
        ASYM.store(os::membarrier_register(), Ordering::Release);
    }
}

/// The heavy side of the handshake.
fn heavy_barrier() {
    if !(ASYM.load(Ordering::Acquire) && os::membarrier()) {
        fence(Ordering::SeqCst);
    }
}

/// Take the bins of `c` away from its owner: after this, until `req` is cleared, the owner
/// does not touch them. The caller holds the list lock.
fn quiesce(c: &Cache) {
    c.req.store(true, Ordering::Relaxed);
    heavy_barrier();
    wait_idle(c);
}

/// The rest of the handshake, once `req` is stored and a barrier ran: wait until the owner is
/// outside its busy window.
fn wait_idle(c: &Cache) {
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
fn drain(c: &Cache) {
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

// ---- slots that pin memory the pool would give back ---------------------------------------
//
// A cached slot keeps its slab in use, and the slab its chunk. When the pool holds more free
// memory than its `retain` allows and cannot give any back, slots cached for slabs that hold
// no live block any more (by the slab's hint) go back to their slabs: then the slabs, and
// their chunks, can go back too. The freeing thread's own cache at once (`free_small` for the
// slab it just emptied, `release_dead` after a large free); other threads' caches, which
// their owners may never touch again, at most every `DEAD_RECLAIM_MS`.

/// How often the caches of other threads are searched for such slots, at most (one
/// `membarrier` for all of them each time).
const DEAD_RECLAIM_MS: u64 = 10;
/// When they last were (milliseconds since `EPOCH`; 0: never).
static DEAD_RECLAIMED: AtomicU64 = AtomicU64::new(0);

/// Take this thread's cached slots of `slab` (class `ci` of `pool`) out of its cache.
pub(super) fn take_slab(pool: &'static Pool, ci: usize, slab: &'static Slab) -> Vec<Slot> {
    let Some(c) = mine(pool) else {
        return Vec::new();
    };
    if !c.enter() {
        return Vec::new();
    }
    // SAFETY: inside our busy window.
    let inner = unsafe { c.inner() };
    let bin = &mut inner.bins[ci];
    let mut taken = Vec::new();
    bin.slots.retain(|&(s, i)| {
        let mine = std::ptr::eq(s, slab);
        if mine {
            taken.push((s, i));
        }
        !mine
    });
    inner.bytes -= taken.len() * bin.size;
    c.bytes.store(inner.bytes, Ordering::Relaxed);
    c.leave();
    taken
}

/// The slots of `c`'s bins whose slab holds no live block, taken out. The caller holds the
/// bins (a busy window, or the handshake).
fn take_dead(c: &Cache) -> Vec<(usize, Vec<Slot>)> {
    // SAFETY: forwarded from the caller.
    let inner = unsafe { c.inner() };
    inner.fresh = false;
    let mut out = Vec::new();
    for (ci, bin) in inner.bins.iter_mut().enumerate() {
        // One look at each slot's hint (other threads change it meanwhile): a slot is either
        // taken or kept, never both.
        let mut dead = Vec::new();
        bin.slots.retain(|&s| {
            let d = s.0.maybe_dead();
            if d {
                dead.push(s);
            }
            !d
        });
        if !dead.is_empty() {
            inner.bytes -= dead.len() * bin.size;
            out.push((ci, dead));
        }
    }
    c.bytes.store(inner.bytes, Ordering::Relaxed);
    out
}

/// `pool` holds more free memory than its `retain` allows and could give none back: slots
/// cached for slabs with no live block go back to their slabs, this thread's at once, other
/// threads' at most every `DEAD_RECLAIM_MS`. The caller holds no lock of `pool`.
#[cold]
pub(crate) fn release_dead(pool: &'static Pool) {
    if let Some(c) = mine(pool) {
        let dead = if c.enter() {
            // SAFETY: inside our busy window.
            let fresh = unsafe { c.inner() }.fresh;
            let d = if fresh { take_dead(c) } else { Vec::new() };
            c.leave();
            d
        } else {
            Vec::new()
        };
        for (ci, slots) in dead {
            pool.return_slots(ci, slots);
        }
    }
    if !pool.over_retain() {
        return;
    }
    let now = super::epoch_ms(std::time::Instant::now());
    let last = DEAD_RECLAIMED.load(Ordering::Relaxed);
    if last != 0 && now < last + DEAD_RECLAIM_MS
        || DEAD_RECLAIMED
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let own = TC.try_with(|c| c.get()).unwrap_or(0);
    let list = caches();
    let others: Vec<&Cache> = list
        .iter()
        .filter(|&&addr| addr != own)
        // SAFETY: caches in the list are live (their owner removes them under the lock first).
        .map(|&addr| unsafe { &*(addr as *const Cache) })
        .filter(|c| std::ptr::eq(c.owner, pool) && c.bytes.load(Ordering::Relaxed) > 0)
        .collect();
    // One handshake for all of them: every request first, then one barrier.
    for c in &others {
        c.req.store(true, Ordering::Relaxed);
    }
    if !others.is_empty() {
        heavy_barrier();
    }
    let mut dead = Vec::new();
    for c in others {
        wait_idle(c);
        dead.extend(take_dead(c));
        c.req.store(false, Ordering::Release);
    }
    drop(list);
    for (ci, slots) in dead {
        pool.return_slots(ci, slots);
    }
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
