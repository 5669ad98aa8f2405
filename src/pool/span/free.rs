//! Giving a span back: a freed block goes to the exact-size list or into the free set, where
//! it merges with its free neighbours (and a wholly free chunk falls idle). Part of `span`,
//! which holds the descriptors and the books (`Large`) these work on; taking spans is in
//! `take`.

use crate::error::{Error, Result};
use crate::pool::entry::{Entry, entry_at};
use crate::pool::types::{
    Large, Pool, SPAN_CACHED, SPAN_FREE, SPAN_HELD, SPAN_USED, Span, TAG_SPAN, double_free,
};
use crate::prim::fork::lock;
use crate::registry::{self, GRANULE};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Freed spans kept whole for reuse by a request of exactly their length (PyTorch's and
/// CuPy's common case: the same shapes every iteration). Bounded; the oldest is merged into
/// the free set when it overflows, and all are whenever a request finds nothing else.
const QUICK_MAX: usize = 32;
/// Most bytes the exact-size list holds (and, with idle chunks and kept slabs, never more
/// than the pool's `retain`).
const QUICK_MAX_BYTES: usize = 256 << 20;

impl Pool {
    pub(in crate::pool) fn free_large(
        &'static self,
        sp: &'static Span,
        ptr: usize,
    ) -> Result<usize> {
        let mut lg = lock(&self.large);
        let start = sp.start();
        let len = sp.len();
        if ptr < start || ptr >= start + len {
            // The descriptor moved on to another range since the registry was read.
            return Err(Error::not_ours(format!("{ptr:#x} is not a live block")));
        }
        match sp.state.load(Ordering::Acquire) {
            SPAN_USED if ptr == start => {}
            SPAN_USED => {
                return Err(Error::not_ours(format!(
                    "{ptr:#x} points inside the block at {start:#x}, not at its start"
                )));
            }
            SPAN_FREE | SPAN_CACHED | SPAN_HELD if ptr % GRANULE == 0 => {
                return Err(double_free(ptr));
            }
            SPAN_FREE | SPAN_CACHED | SPAN_HELD => {
                return Err(Error::not_ours(format!(
                    "{ptr:#x} points into freed memory, not at the start of a block"
                )));
            }
            _ => return Err(Error::not_ours(format!("{ptr:#x} is not a live block"))),
        }
        let n = sp.req.load(Ordering::Relaxed);
        if sp.born.load(Ordering::Relaxed) < crate::backing::shared::live_max() {
            // A fork child may still read it.
            self.hold_span(&mut lg, sp);
        } else {
            self.put_back(&mut lg, sp);
        }
        Ok(n)
    }

    /// Make used (or held) span `sp` free memory of the pool again: the free set or the
    /// exact-size list, within the pool's `retain`.
    pub(in crate::pool) fn put_back(&'static self, lg: &mut Large, sp: &'static Span) {
        let len = sp.len();
        self.discard_on_free(lg, sp);
        if self.lazy() {
            lg.lazy.on_unuse(len);
            sp.free_epoch.store(lg.lazy.epoch(), Ordering::Relaxed);
        }
        if sp.is_whole_chunk()
            || len > QUICK_MAX_BYTES.min(self.retention.bound())
            || self.is_retired()
            || self.lazy()
        {
            // A chunk of its own (the free set reuses it as cheaply, and it may go idle), more
            // than the list may hold, a retired stream's block (its chunk must fall idle), or
            // a lazily committed pool's (holes kept apart from their free neighbours make
            // requests of other sizes commit fresh pages while the holes stay mapped: the
            // fragmentation that pool exists to avoid).
            sp.state.store(SPAN_FREE, Ordering::Release);
            self.insert_free(lg, sp);
        } else {
            sp.state.store(SPAN_CACHED, Ordering::Release);
            lg.quick.push(len, sp);
            while lg.quick.over(QUICK_MAX, QUICK_MAX_BYTES) {
                let old = lg.quick.pop_oldest().expect("non-empty");
                self.uncache(lg, old);
            }
        }
        self.enforce_retain(lg);
        if self.lazy() {
            self.purge_if_due(lg);
        }
    }

    /// Move a span taken off the exact-size list into the free set (merging it).
    pub(in crate::pool) fn uncache(&'static self, lg: &mut Large, sp: &'static Span) {
        sp.state.store(SPAN_FREE, Ordering::Release);
        self.insert_free(lg, sp);
    }

    /// Merge every span of the exact-size list into the free set. Returns whether any was.
    pub(in crate::pool) fn flush_quick(&'static self, lg: &mut Large) -> bool {
        let any = !lg.quick.is_empty();
        while let Some(sp) = lg.quick.pop_oldest() {
            self.uncache(lg, sp);
        }
        any
    }

    /// A released slab's span (state SLAB) becomes a free span again.
    pub(in crate::pool) fn release_slab_span(&'static self, sp: &'static Span) {
        let mut lg = lock(&self.large);
        // Back to the span descriptor first: from here on a free that reaches this range
        // takes the span path and sees a free span.
        registry::set_range(sp.start(), sp.len(), sp as *const Span as usize | TAG_SPAN);
        sp.state.store(SPAN_FREE, Ordering::Release);
        if self.lazy() {
            lg.lazy.on_unuse(sp.len());
            sp.free_epoch.store(lg.lazy.epoch(), Ordering::Relaxed);
        }
        self.insert_free(&mut lg, sp);
        self.enforce_retain(&mut lg);
        if self.lazy() {
            self.purge_if_due(&mut lg);
        }
    }

    /// Put free span `sp` into the free set, merging it with free neighbours in its chunk. A
    /// chunk that becomes wholly free is idle: stamped with an event (stream-ordered pools),
    /// or handed to the group (a retired stream's pool).
    pub(in crate::pool) fn insert_free(&'static self, lg: &mut Large, sp: &'static Span) {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        let mut cur = sp;
        // Merge with the next span.
        let end = cur.start() + cur.len();
        if end < cend
            && let Some(Entry::Span(next)) = entry_at(end)
            && next.state.load(Ordering::Acquire) == SPAN_FREE
            && next.chunk_base.load(Ordering::Relaxed) == cbase
        {
            self.unlist_free(lg, next);
            self.absorb_into(lg, cur, next);
        }
        // Merge into the previous span.
        let start = cur.start();
        if start > cbase
            && let Some(Entry::Span(prev)) = entry_at(start - 1)
            && prev.state.load(Ordering::Acquire) == SPAN_FREE
            && prev.chunk_base.load(Ordering::Relaxed) == cbase
        {
            self.unlist_free(lg, prev);
            self.absorb_into(lg, prev, cur);
            cur = prev;
        }
        if cur.is_whole_chunk() && self.is_retired() {
            if let Some(g) = self.group {
                let chunk = self.detach_chunk(lg, cur);
                let fence = lock(&self.retire_event).clone();
                g.adopt(chunk, fence);
                return;
            }
        }
        let key = cur.key();
        lg.free.insert(key, cur);
        if self.lazy() {
            self.on_span_free(lg, cur);
        }
        if cur.is_whole_chunk() {
            let since = self.decay().is_some().then(Instant::now);
            lg.idle.insert(key, cur, since);
            if let Some(i) = lg.doomed.iter().position(|&b| b == key.1) {
                lg.doomed.swap_remove(i);
                self.release_chunk(lg, cur);
                return;
            }
            if self.ordered() {
                self.stamp_idle(lg, key.1);
            }
        }
    }

    /// Take free span `sp` out of the free set (and the idle set).
    pub(in crate::pool) fn unlist_free(&self, lg: &mut Large, sp: &Span) {
        let key = sp.key();
        lg.free.remove(key);
        lg.idle.remove(key);
    }

    /// `a` takes over its right neighbour `b` (out of the free set); `b`'s descriptor is
    /// recycled.
    pub(in crate::pool) fn absorb_into(
        &'static self,
        lg: &mut Large,
        a: &'static Span,
        b: &'static Span,
    ) {
        let blen = b.len();
        registry::set_range(b.start(), blen, a as *const Span as usize | TAG_SPAN);
        a.len.fetch_add(blen, Ordering::AcqRel);
        let dirty = a.dirty.load(Ordering::Relaxed) || b.dirty.load(Ordering::Relaxed);
        a.dirty.store(dirty, Ordering::Relaxed);
        a.free_epoch
            .fetch_max(b.free_epoch.load(Ordering::Relaxed), Ordering::Relaxed);
        a.away
            .fetch_or(b.away.load(Ordering::Relaxed), Ordering::Relaxed);
        b.len.store(0, Ordering::Release);
        lg.spare.push(b);
    }
}
