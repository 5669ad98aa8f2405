//! Taking a span: the best fit out of the free set (or the exact-size list), another
//! stream's idle chunk, or a new chunk, then `finish_take` cuts the block off and gives it its
//! state. Part of `span`, which holds the descriptors and the books (`Large`) these work on;
//! cutting a descriptor out of a free span is in `cut`, giving spans back in `free`.

use crate::backing::HUGEPAGE_MIN;
use crate::error::Result;
use crate::pool::types::{
    Alloc, Fit, Large, Pool, SPAN_FREE, SPAN_SLAB, SPAN_TAKING, SPAN_USED, Span,
};
use crate::prim::fork::lock;
use crate::registry::GRANULE;
use std::sync::atomic::Ordering;

/// Free spans from this size give their pages back when the pool grows (`discard_free_pages`).
const DISCARD_FREE_MIN: usize = 1 << 20;
/// Fits looked at for one whose pages are resident (`resident_fit`).
const RESIDENT_CANDIDATES: usize = 16;

impl Pool {
    pub(in crate::pool) fn alloc_large(&'static self, n: usize) -> Result<Alloc> {
        let len = n.next_multiple_of(GRANULE);
        let span = self.take_span_for(len, SPAN_USED, n)?;
        // Never written, and its backing's fresh pages still read as zero here.
        let zeroed = !span.dirty.swap(true, Ordering::Relaxed) && self.backing.fresh_is_zero();
        Ok(Alloc {
            ptr: span.start(),
            zeroed,
        })
    }

    /// A block that is a whole chunk of exactly `len` bytes (a granule multiple): an idle
    /// chunk of that length, else a new one; never a piece of a larger chunk (see
    /// [`Pool::alloc_whole`]). When memory is short, what the pool (or the device's pools)
    /// holds idle is given back once and the request tried again.
    pub(in crate::pool) fn take_whole(
        &'static self,
        len: usize,
        req: usize,
    ) -> Result<&'static Span> {
        let mut retried = false;
        loop {
            {
                let mut lg = lock(&self.large);
                let idle = lg.free.of_len(len).find(|sp| sp.is_whole_chunk());
                if let Some(sp) = idle {
                    self.stats.hits.fetch_add(1, Ordering::Relaxed);
                    self.unlist_free(&mut lg, sp);
                    lg.take_event(sp.start());
                    return self.finish_take(&mut lg, Fit::tail(sp), len, SPAN_USED, req, true);
                }
            }
            if let Some(g) = self.group {
                g.make_room(len, len);
            }
            let e = {
                let mut lg = lock(&self.large);
                match self.map_chunk(&mut lg, len, len) {
                    Ok(chunk) => {
                        self.stats.misses.fetch_add(1, Ordering::Relaxed);
                        let dirty = !self.backing.fresh_is_zero();
                        let sp = self.chunk_span(&mut lg, &chunk, dirty);
                        return self.finish_take(
                            &mut lg,
                            Fit::tail(sp),
                            len,
                            SPAN_USED,
                            req,
                            false,
                        );
                    }
                    Err(e) => e,
                }
            };
            if retried || e.status == crate::error::Status::UMP_ERR_UNSUPPORTED {
                return Err(e);
            }
            self.reclaim_for_retry();
            retried = true;
        }
    }

    /// Take a span of exactly `len` bytes (granule multiple) in state `state` (USED or SLAB),
    /// mapping a chunk if needed. The span comes back with the registry pointing at it. A
    /// stream-ordered pool that has nothing free that fits first adopts a wholly free chunk of
    /// another stream of its device (ordered after that stream's work) before it maps a new
    /// one. When memory is short (the limit or the backing), everything the pool (or the
    /// device's pools) holds idle is given back once and the request tried again.
    pub(in crate::pool) fn take_span(
        &'static self,
        len: usize,
        state: u8,
    ) -> Result<&'static Span> {
        self.take_span_for(len, state, 0)
    }

    pub(in crate::pool) fn take_span_for(
        &'static self,
        len: usize,
        state: u8,
        req: usize,
    ) -> Result<&'static Span> {
        self.decay_if_due();
        self.release_held_if_due();
        let chunk_len = self.backing.chunk_len(len);
        let mut retried = false;
        loop {
            let e = match self.try_take(len, chunk_len, state, req) {
                Ok(sp) => return Ok(sp),
                Err(e) => e,
            };
            // The backing refused by policy (a cap, a fork() child): reclaiming changes
            // nothing, and the caller may fall back to other memory.
            if retried || e.status == crate::error::Status::UMP_ERR_UNSUPPORTED {
                return Err(e);
            }
            self.reclaim_for_retry();
            retried = true;
        }
    }

    /// One try of [`take_span_for`](Self::take_span_for): a fit, another stream's idle chunk,
    /// or a new chunk.
    pub(in crate::pool) fn try_take(
        &'static self,
        len: usize,
        chunk_len: usize,
        state: u8,
        req: usize,
    ) -> Result<&'static Span> {
        if let Some(g) = self.group {
            {
                let mut lg = lock(&self.large);
                if self.lazy() {
                    self.purge_if_due(&mut lg);
                }
                if let Some(fit) = self.take_fit(&mut lg, len) {
                    return self.finish_take(&mut lg, fit, len, state, req, true);
                }
            }
            // No lock of ours is held while other pools' locks are taken.
            if let Some(chunk) = g.steal(self, len) {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                let mut lg = lock(&self.large);
                self.attach_chunk(&mut lg, chunk);
                let sp = self.chunk_span(&mut lg, &chunk, true);
                // Another stream's memory: its pages may be anywhere (see `residency`).
                sp.away.store(true, Ordering::Relaxed);
                return self.finish_take(&mut lg, Fit::tail(sp), len, state, req, true);
            }
            // A lazily committed chunk costs no memory until its pages are committed.
            g.make_room(if self.lazy() { len } else { chunk_len }, len);
        }
        let mut lg = lock(&self.large);
        if self.group.is_none() && self.lazy() {
            self.purge_if_due(&mut lg);
        }
        if let Some(fit) = self.take_fit(&mut lg, len) {
            return self.finish_take(&mut lg, fit, len, state, req, true);
        }
        if !self.lazy() {
            self.discard_free_pages(&lg);
        }
        let chunk = self.map_chunk(&mut lg, chunk_len, len)?;
        if chunk.size > len {
            self.backing.advise_arena(chunk.base, chunk.size);
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let dirty = !self.backing.fresh_is_zero();
        let sp = self.chunk_span(&mut lg, &chunk, dirty);
        self.finish_take(&mut lg, Fit::tail(sp), len, state, req, false)
    }

    /// The free span to cut `len` bytes from: the tightest fit `best`, unless its pages were
    /// never written (a new chunk's, or given back by `discard_free_pages`) while one of the
    /// next [`RESIDENT_CANDIDATES`] fits was written: that one, whose pages are resident
    /// already. Touching new pages while written ones sit free is what raised a program of big
    /// temporaries to 1.04x the peak memory of glibc's malloc (1.004x with this; issue 35).
    fn resident_fit(lg: &Large, len: usize, best: &'static Span) -> &'static Span {
        if best.dirty.load(Ordering::Relaxed) {
            return best;
        }
        lg.free
            .fits(len)
            .take(RESIDENT_CANDIDATES)
            .find(|sp| sp.dirty.load(Ordering::Relaxed))
            .unwrap_or(best)
    }

    /// Before the pool grows by a chunk, the pages of its free spans (from
    /// [`DISCARD_FREE_MIN`]) go back to the OS where the backing allows it (plain host memory):
    /// memory held free but resident would otherwise add to the process's peak beside the new
    /// chunk, where glibc's malloc has unmapped its large blocks at their free. A span comes
    /// back, its pages zeroed, when it is reused; one not written since is skipped.
    fn discard_free_pages(&self, lg: &Large) {
        for sp in lg.free.values() {
            if sp.len() >= DISCARD_FREE_MIN && sp.dirty.load(Ordering::Relaxed) {
                // SAFETY: a free span: no live block overlaps it, and the pool's lock keeps
                // it free meanwhile.
                if unsafe { self.backing.discard_free(sp.start(), sp.len()) } {
                    sp.dirty.store(false, Ordering::Relaxed);
                }
            }
        }
    }

    /// Best fit for `len` bytes from this pool's free spans, out of the set.
    pub(in crate::pool) fn take_fit(&'static self, lg: &mut Large, len: usize) -> Option<Fit> {
        if let Some(sp) = lg.quick.take_newest_of_len(len) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            // State FREE for `finish_take`, which cuts nothing off an exact fit.
            sp.state.store(SPAN_FREE, Ordering::Release);
            return Some(Fit::tail(sp));
        }
        let best = lg.free.fits(len).next();
        let sp = match best {
            Some(sp) => sp,
            None => {
                // Merge the exact-size list and look again before mapping more memory.
                if !self.flush_quick(lg) {
                    return None;
                }
                lg.free.fits(len).next()?
            }
        };
        // A lazily committed pool prefers memory that needs no commit; the others memory
        // already written (resident), over the tightest fit when that one is untouched.
        let fit = if self.lazy() {
            self.committed_fit(lg, len, sp)
        } else {
            Fit::tail(Self::resident_fit(lg, len, sp))
        };
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.unlist_free(lg, fit.span);
        if fit.span.is_whole_chunk() {
            // This stream may reuse its own idle chunk at once: its event is moot.
            lg.take_event(fit.span.start());
        }
        Some(fit)
    }

    /// Cut `len` bytes from free span `sp` (out of the set) and give them state `state`,
    /// committing their pages in a lazily committed pool. `hit`: the span was counted as a
    /// cache hit (a commit makes it a miss). On failure the span is free again.
    pub(in crate::pool) fn finish_take(
        &'static self,
        lg: &mut Large,
        fit: Fit,
        len: usize,
        state: u8,
        req: usize,
        hit: bool,
    ) -> Result<&'static Span> {
        // Host-side blocks are cut from the front of free memory, so that what stays free
        // follows them: room for realloc to grow them in place (see `grow`).
        let head = fit.head || (state == SPAN_USED && !self.is_stream_ordered() && !self.lazy());
        let taken = if head {
            self.split_head(lg, fit.span, len)
        } else {
            self.split_tail(lg, fit.span, len)
        };
        if self.lazy() {
            // A purge that commits may run meanwhile: it must not merge this span.
            taken.state.store(SPAN_TAKING, Ordering::Release);
            match self.commit_span(lg, taken.start(), len, fit.need) {
                Ok(called) => {
                    if called && hit {
                        self.stats.hits.fetch_sub(1, Ordering::Relaxed);
                        self.stats.misses.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    if hit {
                        self.stats.hits.fetch_sub(1, Ordering::Relaxed);
                    }
                    taken.state.store(SPAN_FREE, Ordering::Release);
                    self.insert_free(lg, taken);
                    return Err(e);
                }
            }
            lg.lazy.on_use(len);
        }
        self.residency_on_take(lg, taken);
        taken.req.store(req, Ordering::Relaxed);
        if state == SPAN_USED {
            taken.born.store(self.birth_gen(), Ordering::Relaxed);
        }
        if state == SPAN_SLAB {
            // Its slots will be written: once the slab goes back, the span is not clean.
            taken.dirty.store(true, Ordering::Relaxed);
        }
        taken.state.store(state, Ordering::Release);
        // Huge pages (NumPy's default does this for blocks of 4 MiB and more): advise the whole
        // chunk the first time such a block lands in it, so reuse costs no system call.
        if state == SPAN_USED && len >= HUGEPAGE_MIN {
            let base = taken.chunk_base.load(Ordering::Relaxed);
            if let Some(c) = lg.chunks.first_advice(base) {
                self.backing.advise_block(c.base, c.size);
            }
        }
        Ok(taken)
    }
}
