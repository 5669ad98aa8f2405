//! Spans: granule-aligned ranges of chunks, handed out by best fit with splitting and
//! coalescing, and the exact-size list. How chunks come and go is in `chunk`.
//!
//! Every change of a span's state happens under the pool's large lock: a span becomes a slab
//! (`SPAN_SLAB`) inside `take_span`, and a released slab becomes a free span inside
//! `release_slab_span`. A free that reaches a span therefore sees a consistent state: only a
//! `SPAN_USED` span whose start is the pointer is freed, exactly once.

use super::*;
use crate::backing::HUGEPAGE_MIN;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8};
use std::time::Instant;

pub(super) const SPAN_FREE: u8 = 0;
pub(super) const SPAN_USED: u8 = 1;
pub(super) const SPAN_SLAB: u8 = 2;
/// Freed, kept whole in the exact-size list (not in the free set, never merged).
pub(super) const SPAN_CACHED: u8 = 3;
/// Being handed out while its pages are committed (neither free nor a live block yet).
const SPAN_TAKING: u8 = 4;
/// Freed, but held back while a fork child may still read it (see `hold`).
pub(super) const SPAN_HELD: u8 = 5;

/// The generation of memory that is never shared with fork children (never held): the
/// `born` stamp of spans and slabs in pools whose pages fork copies (see `hold`).
pub(super) const NEVER: u64 = u64::MAX;

/// Freed spans kept whole for reuse by a request of exactly their length (PyTorch's and
/// CuPy's common case: the same shapes every iteration). Bounded; the oldest is merged into
/// the free set when it overflows, and all are whenever a request finds nothing else.
const QUICK_MAX: usize = 32;
/// Most bytes the exact-size list holds (and, with idle chunks and kept slabs, never more
/// than the pool's `retain`).
const QUICK_MAX_BYTES: usize = 256 << 20;
/// Free spans from this size give their pages back when the pool grows (`discard_free_pages`).
const DISCARD_FREE_MIN: usize = 1 << 20;
/// Fits looked at for one whose pages are resident (`resident_fit`).
const RESIDENT_CANDIDATES: usize = 16;

/// Descriptor of a span: a granule-aligned range inside one chunk.
pub struct Span {
    pub(super) pool: &'static Pool,
    pub(super) start: AtomicUsize,
    pub(super) len: AtomicUsize,
    pub(super) state: AtomicU8,
    /// Requested bytes while used.
    pub(super) req: AtomicUsize,
    pub(super) chunk_base: AtomicUsize,
    pub(super) chunk_len: AtomicUsize,
    /// Whether the span may hold non-zero bytes (false only for never-used backing memory
    /// that reads as zero).
    pub(super) dirty: AtomicBool,
    /// Lazily committed pools: the epoch the span was last freed in (see `commit`).
    pub(super) free_epoch: AtomicU64,
    /// Managed memory: its pages may be away from the pool's device (see `residency`).
    pub(super) away: AtomicBool,
    /// Used spans: the fork generation the block was allocated in (see `hold`).
    pub(super) born: AtomicU64,
}

impl Span {
    pub(super) fn start(&self) -> usize {
        self.start.load(Ordering::Acquire)
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub(super) fn key(&self) -> (usize, usize) {
        (self.len(), self.start())
    }

    pub(super) fn is_whole_chunk(&self) -> bool {
        self.start() == self.chunk_base.load(Ordering::Relaxed)
            && self.len() == self.chunk_len.load(Ordering::Relaxed)
    }

    /// The live block containing `addr`, if this span is one now.
    #[inline]
    pub(super) fn lookup(&'static self, addr: usize) -> Option<BlockInfo> {
        if self.state.load(Ordering::Acquire) != SPAN_USED {
            return None;
        }
        let start = self.start();
        let len = self.len();
        if addr < start || addr >= start + len {
            return None;
        }
        Some(BlockInfo {
            pool: self.pool,
            base: start,
            size: self.req.load(Ordering::Relaxed),
            capacity: len,
        })
    }
}

/// Where a block is cut from: a free span (out of the free set), which end of it, and, when
/// known, how many bytes committing that end takes.
#[derive(Clone, Copy)]
pub(super) struct Fit {
    pub(super) span: &'static Span,
    pub(super) head: bool,
    pub(super) need: Option<usize>,
}

impl Fit {
    pub(super) fn tail(span: &'static Span) -> Fit {
        Fit {
            span,
            head: false,
            need: None,
        }
    }
}

/// The books of a lazily committed pool (under its large lock), kept by `commit`.
#[derive(Default)]
pub(crate) struct Lazy {
    /// Bytes committed in this pool's chunks.
    pub(super) committed: usize,
    /// Bytes of spans handed out or cut into slabs (all committed).
    pub(super) used: usize,
    /// The current epoch: spans freed now are stamped with it.
    pub(super) epoch: u64,
    /// Fences recorded on the pool's stream, oldest first: (epoch closed, event).
    pub(super) fences: VecDeque<(u64, cuda::Event)>,
    /// Every epoch below this is over on the device.
    pub(super) safe: u64,
    /// Free spans that may hold committed pages, oldest first, by start. Entries go stale
    /// when spans merge or are reused; they are checked when read.
    pub(super) queue: VecDeque<usize>,
    /// Most bytes of `used` in the current window and in the one before.
    pub(super) window_peak: usize,
    pub(super) last_window_peak: usize,
    /// When the current window began (`epoch_ms`; 0: not yet).
    pub(super) window_start: u64,
}

impl Lazy {
    /// The epoch frees are stamped with now.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// The large-block state of a pool (under its large lock).
#[derive(Default)]
pub(crate) struct Large {
    /// Free spans by (length, start).
    pub(super) free: BTreeMap<(usize, usize), &'static Span>,
    pub(super) free_bytes: usize,
    /// The wholly free chunks among `free` (what can go back to the backing).
    pub(super) idle: BTreeMap<(usize, usize), &'static Span>,
    pub(super) idle_bytes: usize,
    /// Chunks of this pool by base.
    pub(super) chunks: BTreeMap<usize, Chunk>,
    pub(super) spare: Vec<&'static Span>,
    /// Stream-ordered pools only: for each wholly free chunk (by base), the event recorded on
    /// the pool's stream when it fell idle. Another stream may use the chunk once it waits
    /// for the event; this stream may use it at once.
    pub(super) events: Vec<(usize, cuda::Event)>,
    /// The exact-size list (oldest first): spans in state CACHED.
    pub(super) quick: VecDeque<&'static Span>,
    pub(super) quick_bytes: usize,
    /// Pools with a decay: when each wholly free chunk (by base) fell idle.
    pub(super) idle_since: BTreeMap<usize, Instant>,
    /// Lazily committed pools: what is committed and what may be purged.
    pub(super) lazy: Lazy,
    /// Managed stream pools: freed blocks to discard, in one batch (see `residency`).
    pub(super) discards: Vec<(usize, usize)>,
    pub(super) discard_bytes: usize,
    /// Freed blocks held back for fork children, in state HELD (see `hold`).
    pub(super) held: Vec<&'static Span>,
    /// Chunks (by base) that are no longer the backing's kind of memory (`Growth::Degraded`):
    /// given back as soon as they are wholly free, never reused.
    pub(super) doomed: Vec<usize>,
}

impl Large {
    /// Bytes of the chunks this pool holds (address space, for a lazily committed pool).
    pub(super) fn chunk_bytes(&self) -> usize {
        self.chunks.values().map(|c| c.size).sum()
    }

    /// Free committed bytes of a lazily committed pool (free spans, the exact-size list).
    pub(super) fn free_committed(&self) -> usize {
        self.lazy.committed.saturating_sub(self.lazy.used)
    }

    /// The largest block that fits without mapping more: the largest free span once the
    /// exact-size list is merged into the free set (as an allocation that finds nothing does),
    /// i.e. adjacent free and listed spans of one chunk count as one.
    pub(super) fn largest_free(&self) -> usize {
        if self.quick.is_empty() {
            return self.free.keys().next_back().map_or(0, |k| k.0);
        }
        let mut spans: Vec<(usize, usize, usize)> = self
            .free
            .values()
            .chain(self.quick.iter())
            .map(|sp| (sp.start(), sp.len(), sp.chunk_base.load(Ordering::Relaxed)))
            .collect();
        spans.sort_unstable();
        let (mut best, mut run_end, mut run_len, mut run_chunk) = (0, 0, 0, usize::MAX);
        for (start, len, chunk) in spans {
            if start == run_end && chunk == run_chunk {
                run_len += len;
            } else {
                run_len = len;
                run_chunk = chunk;
            }
            run_end = start + len;
            best = best.max(run_len);
        }
        best
    }

    /// Free bytes in spans and the exact-size list.
    pub(super) fn free_bytes(&self) -> usize {
        self.free_bytes + self.quick_bytes
    }

    pub(super) fn take_event(&mut self, base: usize) -> Option<cuda::Event> {
        let i = self.events.iter().position(|e| e.0 == base)?;
        Some(self.events.swap_remove(i).1)
    }
}

impl Pool {
    pub(super) fn alloc_large(&'static self, n: usize) -> Result<Alloc> {
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
    pub(super) fn take_whole(&'static self, len: usize, req: usize) -> Result<&'static Span> {
        let mut retried = false;
        loop {
            {
                let mut lg = lock(&self.large);
                let idle = lg
                    .free
                    .range((len, 0)..=(len, usize::MAX))
                    .map(|(_, &sp)| sp)
                    .find(|sp| sp.is_whole_chunk());
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

    pub(super) fn free_large(&'static self, sp: &'static Span, ptr: usize) -> Result<usize> {
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
    pub(super) fn put_back(&'static self, lg: &mut Large, sp: &'static Span) {
        let len = sp.len();
        self.discard_on_free(lg, sp);
        if self.lazy() {
            lg.lazy.used -= len;
            sp.free_epoch.store(lg.lazy.epoch(), Ordering::Relaxed);
        }
        if sp.is_whole_chunk()
            || len > QUICK_MAX_BYTES.min(self.retain)
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
            lg.quick.push_back(sp);
            lg.quick_bytes += len;
            while lg.quick.len() > QUICK_MAX || lg.quick_bytes > QUICK_MAX_BYTES {
                let old = lg.quick.pop_front().expect("non-empty");
                self.uncache(lg, old);
            }
        }
        self.enforce_retain(lg);
        if self.lazy() {
            self.purge_if_due(lg);
        }
    }

    /// Move a span from the exact-size list into the free set (merging it).
    pub(super) fn uncache(&'static self, lg: &mut Large, sp: &'static Span) {
        lg.quick_bytes -= sp.len();
        sp.state.store(SPAN_FREE, Ordering::Release);
        self.insert_free(lg, sp);
    }

    /// Merge every span of the exact-size list into the free set. Returns whether any was.
    pub(super) fn flush_quick(&'static self, lg: &mut Large) -> bool {
        let any = !lg.quick.is_empty();
        while let Some(sp) = lg.quick.pop_front() {
            self.uncache(lg, sp);
        }
        any
    }

    /// A released slab's span (state SLAB) becomes a free span again.
    pub(super) fn release_slab_span(&'static self, sp: &'static Span) {
        let mut lg = lock(&self.large);
        // Back to the span descriptor first: from here on a free that reaches this range
        // takes the span path and sees a free span.
        registry::set_range(sp.start(), sp.len(), sp as *const Span as usize | TAG_SPAN);
        sp.state.store(SPAN_FREE, Ordering::Release);
        if self.lazy() {
            lg.lazy.used -= sp.len();
            sp.free_epoch.store(lg.lazy.epoch(), Ordering::Relaxed);
        }
        self.insert_free(&mut lg, sp);
        self.enforce_retain(&mut lg);
        if self.lazy() {
            self.purge_if_due(&mut lg);
        }
    }

    /// Take a span of exactly `len` bytes (granule multiple) in state `state` (USED or SLAB),
    /// mapping a chunk if needed. The span comes back with the registry pointing at it. A
    /// stream-ordered pool that has nothing free that fits first adopts a wholly free chunk of
    /// another stream of its device (ordered after that stream's work) before it maps a new
    /// one. When memory is short (the limit or the backing), everything the pool (or the
    /// device's pools) holds idle is given back once and the request tried again.
    pub(super) fn take_span(&'static self, len: usize, state: u8) -> Result<&'static Span> {
        self.take_span_for(len, state, 0)
    }

    pub(super) fn take_span_for(
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
    pub(super) fn try_take(
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
            .range((len, 0)..)
            .take(RESIDENT_CANDIDATES)
            .map(|(_, &sp)| sp)
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
    pub(super) fn take_fit(&'static self, lg: &mut Large, len: usize) -> Option<Fit> {
        if let Some(i) = lg.quick.iter().rposition(|sp| sp.len() == len) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            let sp = lg.quick.remove(i).expect("index in range");
            lg.quick_bytes -= len;
            // State FREE for `finish_take`, which cuts nothing off an exact fit.
            sp.state.store(SPAN_FREE, Ordering::Release);
            return Some(Fit::tail(sp));
        }
        let sp = match lg.free.range((len, 0)..).next() {
            Some((_, &sp)) => sp,
            None => {
                // Merge the exact-size list and look again before mapping more memory.
                if !self.flush_quick(lg) {
                    return None;
                }
                *lg.free.range((len, 0)..).next()?.1
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
    pub(super) fn finish_take(
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
            self.on_span_used(lg, len);
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
            if let Some(c) = lg.chunks.get_mut(&base)
                && !c.advised
            {
                c.advised = true;
                self.backing.advise_block(c.base, c.size);
            }
        }
        Ok(taken)
    }

    pub(super) fn new_span(
        &'static self,
        lg: &mut Large,
        start: usize,
        len: usize,
        (chunk_base, chunk_len): (usize, usize),
        dirty: bool,
    ) -> &'static Span {
        let sp = lg.spare.pop().unwrap_or_else(|| {
            Box::leak(Box::new(Span {
                pool: self,
                start: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                state: AtomicU8::new(SPAN_FREE),
                req: AtomicUsize::new(0),
                chunk_base: AtomicUsize::new(0),
                chunk_len: AtomicUsize::new(0),
                dirty: AtomicBool::new(false),
                free_epoch: AtomicU64::new(0),
                away: AtomicBool::new(false),
                born: AtomicU64::new(NEVER),
            }))
        });
        sp.state.store(SPAN_FREE, Ordering::Release);
        sp.start.store(start, Ordering::Release);
        sp.len.store(len, Ordering::Release);
        sp.chunk_base.store(chunk_base, Ordering::Relaxed);
        sp.chunk_len.store(chunk_len, Ordering::Relaxed);
        sp.dirty.store(dirty, Ordering::Relaxed);
        sp.away.store(false, Ordering::Relaxed);
        // Whatever ran on the range before is covered by the epoch open now.
        sp.free_epoch.store(lg.lazy.epoch(), Ordering::Relaxed);
        // Inside a chunk whose range was reserved when it was mapped.
        registry::set_range(start, len, sp as *const Span as usize | TAG_SPAN);
        sp
    }

    /// Cut `len` bytes off the end of free span `sp` (already out of the free set) and return
    /// the span for them; the front stays free. Only the granules of the cut part are
    /// re-registered, so the cost follows the size handed out.
    pub(super) fn split_tail(
        &'static self,
        lg: &mut Large,
        sp: &'static Span,
        len: usize,
    ) -> &'static Span {
        let flen = sp.len();
        if flen == len {
            return sp;
        }
        let start = sp.start();
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start), sp);
        lg.free_bytes += flen - len;
        self.carve(lg, sp, start + flen - len, len)
    }

    /// A new span for `[start, start+len)`, cut from free span `sp`: same chunk, and `sp`'s
    /// dirtiness and residency.
    pub(super) fn carve(
        &'static self,
        lg: &mut Large,
        sp: &Span,
        start: usize,
        len: usize,
    ) -> &'static Span {
        let chunk = (
            sp.chunk_base.load(Ordering::Relaxed),
            sp.chunk_len.load(Ordering::Relaxed),
        );
        let taken = self.new_span(lg, start, len, chunk, sp.dirty.load(Ordering::Relaxed));
        taken
            .away
            .store(sp.away.load(Ordering::Relaxed), Ordering::Relaxed);
        taken
    }

    /// Cut `len` bytes off the front of free span `sp` (already out of the free set) and
    /// return the span for them; the rest stays free (and is queued for purging again).
    pub(super) fn split_head(
        &'static self,
        lg: &mut Large,
        sp: &'static Span,
        len: usize,
    ) -> &'static Span {
        let flen = sp.len();
        if flen == len {
            return sp;
        }
        let start = sp.start();
        // The descriptor keeps the rest (its granules still point at it); the head gets a new
        // one, registered over the head's granules only.
        sp.start.store(start + len, Ordering::Release);
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start + len), sp);
        lg.free_bytes += flen - len;
        if self.lazy() {
            self.on_span_free(lg, sp);
        }
        self.carve(lg, sp, start, len)
    }

    /// Put free span `sp` into the free set, merging it with free neighbours in its chunk. A
    /// chunk that becomes wholly free is idle: stamped with an event (stream-ordered pools),
    /// or handed to the group (a retired stream's pool).
    pub(super) fn insert_free(&'static self, lg: &mut Large, sp: &'static Span) {
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
        lg.free_bytes += key.0;
        if self.lazy() {
            self.on_span_free(lg, cur);
        }
        if cur.is_whole_chunk() {
            lg.idle.insert(key, cur);
            lg.idle_bytes += key.0;
            if let Some(i) = lg.doomed.iter().position(|&b| b == key.1) {
                lg.doomed.swap_remove(i);
                self.release_chunk(lg, cur);
                return;
            }
            if self.decay().is_some() {
                lg.idle_since.insert(key.1, Instant::now());
            }
            if self.ordered() {
                self.stamp_idle(lg, key.1);
            }
        }
    }

    /// Take free span `sp` out of the free set (and the idle set).
    pub(super) fn unlist_free(&self, lg: &mut Large, sp: &Span) {
        let key = sp.key();
        if lg.free.remove(&key).is_some() {
            lg.free_bytes -= key.0;
        }
        if lg.idle.remove(&key).is_some() {
            lg.idle_bytes -= key.0;
            lg.idle_since.remove(&key.1);
        }
    }

    /// `a` takes over its right neighbour `b` (out of the free set); `b`'s descriptor is
    /// recycled.
    pub(super) fn absorb_into(&'static self, lg: &mut Large, a: &'static Span, b: &'static Span) {
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
