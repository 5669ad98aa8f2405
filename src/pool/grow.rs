//! realloc without a copy. A large block shrinks by giving its tail back; it grows into the
//! free memory after it in its chunk (free spans, and spans of the exact-size list, which are
//! merged into the free set for it), or, when it holds its chunk alone, with its chunk: the
//! backing maps more after it (pinned memory, into the room its chunk was reserved with) or
//! moves its pages (plain host memory, `mremap`). NumPy's `ndarray.resize`, `np.fromiter` and
//! the readers that grow their result as they go (`np.loadtxt`, `np.fromfile` with a separator)
//! then copy nothing, as they copy nothing on glibc's malloc.

use super::entry::{Entry, entry_at};
use super::parts::Charge;
use super::types::{Large, Pool, SPAN_CACHED, SPAN_FREE, SPAN_USED, Span, TAG_SPAN};
use crate::backing::Kind;
use crate::backing::{Growth, RangeBook};
use crate::prim::fork::lock;
use crate::registry::{self, GRANULE};
use std::sync::atomic::Ordering;

/// A chunk of pinned memory grows by at least half its size at a time: registering it again
/// costs about its size (25 ms per GiB), so a loop that grows it step by step re-registers it
/// a logarithmic number of times.
const PINNED_GROWTH: usize = 2;

/// The registry's side of a chunk that changes size under span `sp` (see [`RangeBook`]). The
/// chunk's range holds `sp` and, after it, the free spans `rest`; a range left and then kept
/// after all points at them again.
struct Book<'a> {
    sp: &'static Span,
    rest: &'a [&'static Span],
}

impl RangeBook for Book<'_> {
    fn claim(&mut self, base: usize, len: usize) -> bool {
        registry::reserve(base, len)
    }
    fn leave(&mut self, base: usize, len: usize) {
        registry::set_range(base, len, 0);
    }
    fn stay(&mut self, base: usize, len: usize) {
        for s in std::iter::once(self.sp).chain(self.rest.iter().copied()) {
            let (a, b) = (s.start().max(base), (s.start() + s.len()).min(base + len));
            if a < b {
                registry::set_range(a, b - a, s as *const Span as usize | TAG_SPAN);
            }
        }
    }
}

impl Pool {
    /// Resize the large block starting at `base` (span `sp`) to `n` bytes (more than
    /// `SMALL_MAX`) without copying. Returns where the block is now, or None when that needs
    /// a copy (nothing changed then: the block, the free memory around it and the books).
    pub(super) fn resize_large(
        &'static self,
        sp: &'static Span,
        base: usize,
        n: usize,
    ) -> Option<usize> {
        let mut lg = lock(&self.large);
        if sp.state.load(Ordering::Acquire) != SPAN_USED || sp.start() != base {
            return None;
        }
        if sp.born.load(Ordering::Relaxed) < crate::backing::shared::live_max() {
            // realloc frees the old block, and a fork child may read it: the block moves
            // (the caller copies), and the old one is held back when it is freed (`hold`).
            return None;
        }
        let len = sp.len();
        let want = n.next_multiple_of(GRANULE);
        let at = if want <= len {
            if !(sp.is_whole_chunk() && self.shrink_chunk(&mut lg, sp, want)) {
                self.shrink_span(&mut lg, sp, want);
            }
            Some(base)
        } else if self.grow_into_next(&mut lg, sp, want) {
            Some(base)
        } else if let Some(rest) = self.rest_of_chunk(&lg, sp) {
            self.grow_chunk(&mut lg, sp, &rest, want)
        } else {
            None
        }?;
        let old = sp.req.swap(n, Ordering::Relaxed);
        self.stats.on_resize(old, n);
        Some(at)
    }

    /// Give the tail of used span `sp` past `len` bytes back to the free set.
    fn shrink_span(&'static self, lg: &mut Large, sp: &'static Span, len: usize) {
        let old = sp.len();
        if len == old {
            return;
        }
        sp.len.store(len, Ordering::Release);
        let tail = self.carve(lg, sp, sp.start() + len, old - len);
        tail.dirty.store(true, Ordering::Relaxed);
        if self.lazy() {
            lg.lazy.on_unuse(old - len);
        }
        self.insert_free(lg, tail);
    }

    /// Shrink the chunk that used span `sp` holds alone to `len` bytes, giving the rest back
    /// to the backing (plain host memory: glibc's realloc does the same). Returns whether it
    /// did.
    fn shrink_chunk(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> bool {
        let Some(old) = lg.chunks.get(sp.start()) else {
            return false;
        };
        let mut book = Book { sp, rest: &[] };
        // SAFETY: the chunk is this pool's and holds `sp` alone, whose owner is inside
        // realloc and keeps only the first `len` bytes. The backing clears the tail's registry
        // entries before the OS takes the tail back.
        let Some(new) = (unsafe { self.backing.shrink(&old, len, &mut book) }) else {
            return false;
        };
        debug_assert_eq!(new.base, old.base, "a chunk shrinks in place");
        lg.chunks.insert(new);
        self.stats.on_unmap(old.size - new.size);
        self.stats.on_reserve(new.raw_size);
        self.stats.on_unreserve(old.raw_size);
        sp.len.store(len, Ordering::Release);
        sp.chunk_len.store(len, Ordering::Relaxed);
        true
    }

    /// The free memory that starts right after used span `sp` in its chunk, looked at until it
    /// offers `want` bytes: its bytes, and the spans of the exact-size list among it, in
    /// address order. It is a row of spans of the free set and of the exact-size list (one
    /// free span once those are merged into the free set). Nothing is changed.
    fn free_after(&self, lg: &Large, sp: &Span, want: usize) -> (usize, Vec<&'static Span>) {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        let (mut room, mut listed) = (0, Vec::new());
        let mut a = sp.start() + sp.len();
        while a < cend && room < want {
            let Some(Entry::Span(f)) = entry_at(a) else {
                break;
            };
            if f.start() != a || f.chunk_base.load(Ordering::Relaxed) != cbase {
                break;
            }
            match f.state.load(Ordering::Acquire) {
                SPAN_FREE if lg.free.contains((f.len(), a)) => {}
                SPAN_CACHED if lg.quick.contains_where(|q| std::ptr::eq(q, f)) => listed.push(f),
                _ => break,
            }
            room += f.len();
            a += f.len();
        }
        (room, listed)
    }

    /// Grow used span `sp` to `len` bytes over the free memory right after it in its chunk
    /// (spans of the free set and of the exact-size list). Returns whether it did; when not,
    /// nothing changed.
    fn grow_into_next(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> bool {
        let end = sp.start() + sp.len();
        let extra = len - sp.len();
        let (room, listed) = self.free_after(lg, sp, extra);
        if room < extra {
            return false;
        }
        // Spans of the exact-size list among it go into the free set first, in address order:
        // each merges with the free spans beside it, so one free span starts at `end`.
        for f in listed {
            lg.quick
                .take_where(|q| std::ptr::eq(q, f))
                .expect("free_after found it listed");
            self.uncache(lg, f);
        }
        let Some(Entry::Span(next)) = entry_at(end) else {
            unreachable!("a free span starts right after the block");
        };
        debug_assert!(next.start() == end && next.len() >= extra);
        self.unlist_free(lg, next);
        if self.lazy() {
            // A lazily committed pool keeps no exact-size list: nothing was merged above.
            if self.commit_span(lg, end, extra, None).is_err() {
                self.insert_free(lg, next);
                return false;
            }
            lg.lazy.on_use(extra);
        }
        let rest = next.len() - extra;
        registry::set_range(end, extra, sp as *const Span as usize | TAG_SPAN);
        let away = next.away.load(Ordering::Relaxed);
        if rest == 0 {
            next.len.store(0, Ordering::Release);
            lg.spare.push(next);
        } else {
            next.start.store(end + extra, Ordering::Release);
            next.len.store(rest, Ordering::Release);
            lg.free.insert((rest, end + extra), next);
            if self.lazy() {
                self.on_span_free(lg, next);
            }
        }
        let dirty = sp.dirty.load(Ordering::Relaxed) || next.dirty.load(Ordering::Relaxed);
        sp.dirty.store(dirty, Ordering::Relaxed);
        sp.away.fetch_or(away, Ordering::Relaxed);
        sp.len.store(len, Ordering::Release);
        // Free memory handed out: out of the pending discards and migrations.
        self.residency_on_grow(lg, end, end + extra);
        true
    }

    /// When used span `sp` starts its chunk and everything after it in the chunk is free
    /// (spans of the free set or of the exact-size list: say a tail it gave back when it
    /// shrank), those spans, in address order (none when `sp` is the whole chunk). Nothing is
    /// changed.
    fn rest_of_chunk(&self, lg: &Large, sp: &'static Span) -> Option<Vec<&'static Span>> {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        if sp.start() != cbase {
            return None;
        }
        let mut rest = Vec::new();
        let mut a = sp.start() + sp.len();
        while a < cend {
            let Some(Entry::Span(f)) = entry_at(a) else {
                return None;
            };
            let listed = match f.state.load(Ordering::Acquire) {
                SPAN_FREE => lg.free.contains((f.len(), a)),
                SPAN_CACHED => lg.quick.contains_where(|q| std::ptr::eq(q, f)),
                _ => false,
            };
            if !listed || f.start() != a || f.chunk_base.load(Ordering::Relaxed) != cbase {
                return None;
            }
            rest.push(f);
            a += f.len();
        }
        Some(rest)
    }

    /// Take the free spans `rest` (after `sp` in its chunk, from `rest_of_chunk`) out of the
    /// free set and the exact-size list: their range now belongs to `sp`'s chunk growth.
    fn take_rest(&'static self, lg: &mut Large, sp: &'static Span, rest: &[&'static Span]) {
        debug_assert!(!self.lazy(), "lazily committed chunks do not grow");
        for &f in rest {
            sp.dirty
                .fetch_or(f.dirty.load(Ordering::Relaxed), Ordering::Relaxed);
            sp.away
                .fetch_or(f.away.load(Ordering::Relaxed), Ordering::Relaxed);
            if f.state.load(Ordering::Acquire) == SPAN_CACHED {
                lg.quick.take_where(|q| std::ptr::eq(q, f));
            } else {
                self.unlist_free(lg, f);
            }
            f.state.store(SPAN_FREE, Ordering::Release);
            f.len.store(0, Ordering::Release);
            lg.spare.push(f);
        }
    }

    /// Grow span `sp`, which starts its chunk and is followed by nothing but the free spans
    /// `rest`, with the chunk (see the module docs). Returns where the block is now; on
    /// failure nothing changed (unless the backing degraded the chunk: see `doom`).
    fn grow_chunk(
        &'static self,
        lg: &mut Large,
        sp: &'static Span,
        rest: &[&'static Span],
        len: usize,
    ) -> Option<usize> {
        let old = lg.chunks.get(sp.start())?;
        if len <= old.size {
            // The chunk holds `len` already: `grow_into_next`, which takes every free and
            // listed span after `sp`, would have served it. Nothing for the chunk to grow by
            // (and `len - old.size` below would overflow); the caller moves the block.
            return None;
        }
        let mut sizes = vec![len];
        if self.kind == Kind::UMP_KIND_REGISTERED {
            let step = (old.size + old.size / PINNED_GROWTH).next_multiple_of(GRANULE);
            if step > len {
                sizes.insert(0, step);
            }
        }
        for size in sizes {
            let delta = size - old.size;
            let Some(charge) = Charge::within(self.stats, delta, self.limit()) else {
                continue;
            };
            let mut book = Book { sp, rest };
            // SAFETY: the chunk is this pool's and holds `sp` (whose owner is inside realloc)
            // and free spans; the registry follows through `book`.
            let new = match unsafe { self.backing.grow(&old, size, &mut book) } {
                Growth::Grown(new) => new,
                Growth::Refused => continue,
                Growth::Degraded => {
                    drop(charge);
                    self.doom(lg, sp, rest);
                    return None;
                }
            };
            charge.keep();
            // The free spans after `sp` are part of the block now (or gone with the old range).
            self.residency_on_grow(lg, old.base, old.base + old.size);
            self.take_rest(lg, sp, rest);
            self.stats.on_reserve(new.raw_size);
            self.stats.on_unreserve(old.raw_size);
            lg.chunks.remove(old.base);
            lg.chunks.insert(new);
            registry::set_range(new.base, new.size, sp as *const Span as usize | TAG_SPAN);
            sp.start.store(new.base, Ordering::Release);
            sp.len.store(new.size, Ordering::Release);
            sp.chunk_base.store(new.base, Ordering::Relaxed);
            sp.chunk_len.store(new.size, Ordering::Relaxed);
            return Some(new.base);
        }
        None
    }

    /// The chunk of `sp` is no longer the backing's kind of memory (`Growth::Degraded`): none
    /// of it is handed out again (`sp` takes the free spans after it), and it goes back to the
    /// backing as soon as `sp`'s block is freed (see `insert_free`).
    fn doom(&'static self, lg: &mut Large, sp: &'static Span, rest: &[&'static Span]) {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        let end = sp.start() + sp.len();
        self.residency_on_grow(lg, end, cend);
        self.take_rest(lg, sp, rest);
        registry::set_range(end, cend - end, sp as *const Span as usize | TAG_SPAN);
        sp.len.store(cend - cbase, Ordering::Release);
        lg.doomed.push(cbase);
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod refusal_tests;

#[cfg(test)]
mod room_tests;
