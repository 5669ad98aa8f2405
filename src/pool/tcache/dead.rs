//! Cached slots that pin memory the pool would give back: slots of slabs with no live block
//! go back to their slabs, from this thread's cache at once and from other threads' caches
//! (through the handshake in `reclaim`) at most every `DEAD_RECLAIM_MS`. Part of `tcache`.

use super::reclaim::{heavy_barrier, wait_idle};
use super::{Cache, TC, caches, mine};
use crate::pool::parts::epoch_ms;
use crate::pool::types::{Pool, Slab, Slot};
use std::sync::atomic::{AtomicU64, Ordering};

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
pub(in crate::pool) fn take_slab(pool: &'static Pool, ci: usize, slab: &'static Slab) -> Vec<Slot> {
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
    let now = epoch_ms(std::time::Instant::now());
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
