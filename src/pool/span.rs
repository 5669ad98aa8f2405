//! Spans: granule-aligned ranges of chunks, handed out by best fit with splitting and
//! coalescing, the exact-size list, and the chunks' way back to the backing.
//!
//! Every change of a span's state happens under the pool's large lock: a span becomes a slab
//! (`SPAN_SLAB`) inside `take_span`, and a released slab becomes a free span inside
//! `release_slab_span`. A free that reaches a span therefore sees a consistent state: only a
//! `SPAN_USED` span whose start is the pointer is freed, exactly once.

use super::commit::Lazy;
use super::*;
use crate::backing::HUGEPAGE_MIN;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8};
use std::time::Instant;

pub(super) const SPAN_FREE: u8 = 0;
pub(super) const SPAN_USED: u8 = 1;
pub(super) const SPAN_SLAB: u8 = 2;
/// Freed, kept whole in the exact-size list (not in the free set, never merged).
const SPAN_CACHED: u8 = 3;
/// Being handed out while its pages are committed (neither free nor a live block yet).
const SPAN_TAKING: u8 = 4;

/// Freed spans kept whole for reuse by a request of exactly their length (PyTorch's and
/// CuPy's common case: the same shapes every iteration). Bounded; the oldest is merged into
/// the free set when it overflows, and all are whenever a request finds nothing else.
const QUICK_MAX: usize = 32;
/// Most bytes the exact-size list holds (and, with idle chunks and kept slabs, never more
/// than the pool's `retain`).
const QUICK_MAX_BYTES: usize = 256 << 20;

/// Descriptor of a span: a granule-aligned range inside one chunk.
pub struct Span {
    pub(super) pool: &'static Pool,
    start: AtomicUsize,
    len: AtomicUsize,
    pub(super) state: AtomicU8,
    /// Requested bytes while used.
    pub(super) req: AtomicUsize,
    chunk_base: AtomicUsize,
    chunk_len: AtomicUsize,
    /// Whether the span may hold non-zero bytes (false only for never-used backing memory
    /// that reads as zero).
    dirty: AtomicBool,
    /// Lazily committed pools: the epoch the span was last freed in (see `commit`).
    pub(super) free_epoch: AtomicU64,
}

impl Span {
    pub(super) fn start(&self) -> usize {
        self.start.load(Ordering::Acquire)
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Record a new requested size for the live block that starts at `base`.
    pub(super) fn resize(&self, base: usize, n: usize) -> bool {
        if self.state.load(Ordering::Acquire) != SPAN_USED || self.start() != base {
            return false;
        }
        self.req.store(n, Ordering::Relaxed);
        true
    }

    fn key(&self) -> (usize, usize) {
        (self.len(), self.start())
    }

    fn is_whole_chunk(&self) -> bool {
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

/// The large-block state of a pool (under its large lock).
#[derive(Default)]
pub(crate) struct Large {
    /// Free spans by (length, start).
    pub(super) free: BTreeMap<(usize, usize), &'static Span>,
    free_bytes: usize,
    /// The wholly free chunks among `free` (what can go back to the backing).
    idle: BTreeMap<(usize, usize), &'static Span>,
    idle_bytes: usize,
    /// Chunks of this pool by base.
    chunks: BTreeMap<usize, Chunk>,
    spare: Vec<&'static Span>,
    /// Stream-ordered pools only: for each wholly free chunk (by base), the event recorded on
    /// the pool's stream when it fell idle. Another stream may use the chunk once it waits
    /// for the event; this stream may use it at once.
    events: Vec<(usize, cuda::Event)>,
    /// The exact-size list (oldest first): spans in state CACHED.
    pub(super) quick: VecDeque<&'static Span>,
    quick_bytes: usize,
    /// Pools with a decay: when each wholly free chunk (by base) fell idle.
    idle_since: BTreeMap<usize, Instant>,
    /// Lazily committed pools: what is committed and what may be purged.
    pub(super) lazy: Lazy,
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

    fn take_event(&mut self, base: usize) -> Option<cuda::Event> {
        let i = self.events.iter().position(|e| e.0 == base)?;
        Some(self.events.swap_remove(i).1)
    }
}

impl Pool {
    pub(super) fn alloc_large(&'static self, n: usize) -> Result<Alloc> {
        let len = n.next_multiple_of(GRANULE);
        let span = self.take_span_for(len, SPAN_USED, n)?;
        let zeroed = !span.dirty.swap(true, Ordering::Relaxed);
        Ok(Alloc {
            ptr: span.start(),
            zeroed,
        })
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
            SPAN_FREE | SPAN_CACHED if ptr % GRANULE == 0 => return Err(double_free(ptr)),
            SPAN_FREE | SPAN_CACHED => {
                return Err(Error::not_ours(format!(
                    "{ptr:#x} points into freed memory, not at the start of a block"
                )));
            }
            _ => return Err(Error::not_ours(format!("{ptr:#x} is not a live block"))),
        }
        let n = sp.req.load(Ordering::Relaxed);
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
            self.insert_free(&mut lg, sp);
        } else {
            sp.state.store(SPAN_CACHED, Ordering::Release);
            lg.quick.push_back(sp);
            lg.quick_bytes += len;
            while lg.quick.len() > QUICK_MAX || lg.quick_bytes > QUICK_MAX_BYTES {
                let old = lg.quick.pop_front().expect("non-empty");
                self.uncache(&mut lg, old);
            }
        }
        self.enforce_retain(&mut lg);
        if self.lazy() {
            self.purge_if_due(&mut lg);
        }
        Ok(n)
    }

    /// Move a span from the exact-size list into the free set (merging it).
    fn uncache(&'static self, lg: &mut Large, sp: &'static Span) {
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

    /// Keep the free memory the pool holds (free spans, the exact-size list, kept slabs)
    /// within `retain`: wholly free chunks go back first, largest first; then the oldest
    /// exact-size spans are merged into the free set (which may make more chunks wholly free).
    /// What remains above `retain` is free space inside chunks that still hold live blocks.
    /// With a decay (pinned memory, costly to make), a wholly free chunk goes back only once
    /// it has been idle that long; until then the pool stays above `retain` and `decay_due`
    /// says when to look again.
    fn enforce_retain(&'static self, lg: &mut Large) {
        let budget = self
            .retain
            .saturating_sub(self.kept_slabs.load(Ordering::Relaxed));
        let decay = self.decay();
        let mut now = None;
        while lg.free_bytes + lg.quick_bytes > budget {
            let expired = match decay {
                None => lg.idle.values().next_back().copied(),
                Some(d) => {
                    let t = *now.get_or_insert_with(Instant::now);
                    lg.idle
                        .values()
                        .rev()
                        .find(|sp| {
                            lg.idle_since
                                .get(&sp.start())
                                .is_none_or(|&since| t.duration_since(since) >= d)
                        })
                        .copied()
                }
            };
            if let Some(sp) = expired {
                self.release_chunk(lg, sp);
            } else if decay.is_some() && !lg.idle.is_empty() {
                // Idle chunks wait out their decay; look again once the oldest is due.
                let oldest = lg.idle_since.values().min().copied();
                if let (Some(o), Some(d)) = (oldest, decay) {
                    self.set_decay_due(o + d);
                }
                return;
            } else if let Some(old) = lg.quick.pop_front() {
                self.uncache(lg, old);
            } else {
                break;
            }
        }
        self.clear_decay_due();
    }

    /// With a decay: if idle chunks are due to go back, give them back now.
    pub(super) fn decay_if_due(&'static self) {
        if self.decay_is_due() {
            let mut lg = lock(&self.large);
            self.enforce_retain(&mut lg);
        }
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

    fn take_span_for(&'static self, len: usize, state: u8, req: usize) -> Result<&'static Span> {
        self.decay_if_due();
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
    fn try_take(
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
        let chunk = self.map_chunk(&mut lg, chunk_len, len)?;
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let dirty = !self.backing.fresh_is_zero();
        let sp = self.chunk_span(&mut lg, &chunk, dirty);
        self.finish_take(&mut lg, Fit::tail(sp), len, state, req, false)
    }

    /// Best fit for `len` bytes from this pool's free spans, out of the set.
    fn take_fit(&'static self, lg: &mut Large, len: usize) -> Option<Fit> {
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
        // A lazily committed pool prefers memory that needs no commit.
        let fit = if self.lazy() {
            self.committed_fit(lg, len, sp)
        } else {
            Fit::tail(sp)
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
    fn finish_take(
        &'static self,
        lg: &mut Large,
        fit: Fit,
        len: usize,
        state: u8,
        req: usize,
        hit: bool,
    ) -> Result<&'static Span> {
        let taken = if fit.head {
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
        taken.req.store(req, Ordering::Relaxed);
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

    /// Map a chunk of `want` bytes (or, when the limit or the backing refuses that, of `need`
    /// bytes), honouring the limit, with the registry's range reserved for it.
    fn map_chunk(&'static self, lg: &mut Large, want: usize, need: usize) -> Result<Chunk> {
        let mut last = None;
        for size in [want, need] {
            if last.is_some() && size == want {
                continue;
            }
            let limit = self.limit();
            // A lazily committed chunk is address space: its pages count when committed.
            let charge = if self.lazy() { 0 } else { size };
            if charge > 0 && !self.stats.reserve_mapped(charge, limit.map(|l| l.0)) {
                let mapped = self.stats.mapped.load(Ordering::Relaxed);
                let (bytes, source) = limit.unwrap_or((0, "the limit"));
                last = Some(Error::limit(format!(
                    "{source} of {bytes} bytes reached ({mapped} mapped, {need} more needed)"
                )));
                continue;
            }
            let chunk = match self.backing.map(size) {
                Ok(c) => c,
                Err(e) if e.status == crate::error::Status::UMP_ERR_UNSUPPORTED => {
                    self.stats.on_unmap(charge);
                    return Err(e);
                }
                Err(e) => {
                    self.stats.on_unmap(charge);
                    last = Some(Error::oom(format!(
                        "cannot get {size} bytes of {} memory: {}",
                        self.kind().name(),
                        e.msg
                    )));
                    continue;
                }
            };
            if !registry::reserve(chunk.base, chunk.size) {
                // SAFETY: just mapped, never handed out or registered.
                unsafe { self.backing.unmap(&chunk) };
                self.stats.on_unmap(charge);
                return Err(Error::oom(format!(
                    "no memory for the registry entries of a {size}-byte chunk at {:#x}",
                    chunk.base
                )));
            }
            self.stats.on_reserve(chunk.raw_size);
            lg.chunks.insert(chunk.base, chunk);
            return Ok(chunk);
        }
        Err(last.unwrap_or_else(|| Error::oom("out of memory")))
    }

    /// A free span covering all of `chunk` (just mapped or adopted).
    fn chunk_span(&'static self, lg: &mut Large, chunk: &Chunk, dirty: bool) -> &'static Span {
        self.new_span(lg, chunk.base, chunk.size, (chunk.base, chunk.size), dirty)
    }

    fn new_span(
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
            }))
        });
        sp.state.store(SPAN_FREE, Ordering::Release);
        sp.start.store(start, Ordering::Release);
        sp.len.store(len, Ordering::Release);
        sp.chunk_base.store(chunk_base, Ordering::Relaxed);
        sp.chunk_len.store(chunk_len, Ordering::Relaxed);
        sp.dirty.store(dirty, Ordering::Relaxed);
        // Whatever ran on the range before is covered by the epoch open now.
        sp.free_epoch.store(lg.lazy.epoch(), Ordering::Relaxed);
        // Inside a chunk whose range was reserved when it was mapped.
        registry::set_range(start, len, sp as *const Span as usize | TAG_SPAN);
        sp
    }

    /// Cut `len` bytes off the end of free span `sp` (already out of the free set) and return
    /// the span for them; the front stays free. Only the granules of the cut part are
    /// re-registered, so the cost follows the size handed out.
    fn split_tail(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> &'static Span {
        let flen = sp.len();
        if flen == len {
            return sp;
        }
        let start = sp.start();
        let chunk = (
            sp.chunk_base.load(Ordering::Relaxed),
            sp.chunk_len.load(Ordering::Relaxed),
        );
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start), sp);
        lg.free_bytes += flen - len;
        self.new_span(
            lg,
            start + flen - len,
            len,
            chunk,
            sp.dirty.load(Ordering::Relaxed),
        )
    }

    /// Cut `len` bytes off the front of free span `sp` (already out of the free set) and
    /// return the span for them; the rest stays free (and is queued for purging again).
    fn split_head(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> &'static Span {
        let flen = sp.len();
        if flen == len {
            return sp;
        }
        let start = sp.start();
        let chunk = (
            sp.chunk_base.load(Ordering::Relaxed),
            sp.chunk_len.load(Ordering::Relaxed),
        );
        // The descriptor keeps the rest (its granules still point at it); the head gets a new
        // one, registered over the head's granules only.
        sp.start.store(start + len, Ordering::Release);
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start + len), sp);
        lg.free_bytes += flen - len;
        if self.lazy() {
            self.on_span_free(lg, sp);
        }
        self.new_span(lg, start, len, chunk, sp.dirty.load(Ordering::Relaxed))
    }

    /// Put free span `sp` into the free set, merging it with free neighbours in its chunk. A
    /// chunk that becomes wholly free is idle: stamped with an event (stream-ordered pools),
    /// or handed to the group (a retired stream's pool).
    fn insert_free(&'static self, lg: &mut Large, sp: &'static Span) {
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
            if self.decay().is_some() {
                lg.idle_since.insert(key.1, Instant::now());
            }
            if self.ordered() {
                self.stamp_idle(lg, key.1);
            }
        }
    }

    /// Record, on this pool's stream, the event after which chunk `base` (now wholly free)
    /// may serve another stream. When the stream cannot take an event (a destroyed stream
    /// handle), wait for the device instead, so the chunk needs none.
    fn stamp_idle(&self, lg: &mut Large, base: usize) {
        lg.take_event(base);
        match cuda::Event::record(self.stream(), self.device) {
            Ok(ev) => lg.events.push((base, ev)),
            Err(_) => {
                if let Some(g) = self.group {
                    g.count_sync();
                }
                let _ = cuda::device_synchronize(self.device);
            }
        }
    }

    /// Take free span `sp` out of the free set (and the idle set).
    fn unlist_free(&self, lg: &mut Large, sp: &Span) {
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
    fn absorb_into(&'static self, lg: &mut Large, a: &'static Span, b: &'static Span) {
        let blen = b.len();
        registry::set_range(b.start(), blen, a as *const Span as usize | TAG_SPAN);
        a.len.fetch_add(blen, Ordering::AcqRel);
        let dirty = a.dirty.load(Ordering::Relaxed) || b.dirty.load(Ordering::Relaxed);
        a.dirty.store(dirty, Ordering::Relaxed);
        a.free_epoch
            .fetch_max(b.free_epoch.load(Ordering::Relaxed), Ordering::Relaxed);
        b.len.store(0, Ordering::Release);
        lg.spare.push(b);
    }

    /// Take wholly free chunk `sp` out of the pool (free set, registry, chunk list) without
    /// giving it back. Its descriptor is recycled; its event stays in `events` for the caller.
    fn detach_chunk(&'static self, lg: &mut Large, sp: &'static Span) -> Chunk {
        let start = sp.start();
        let len = sp.len();
        self.unlist_free(lg, sp);
        registry::set_range(start, len, 0);
        sp.len.store(0, Ordering::Release);
        lg.spare.push(sp);
        let chunk = lg.chunks.remove(&start).unwrap_or(Chunk {
            base: start,
            size: len,
            raw: start,
            raw_size: len,
            advised: false,
        });
        if self.lazy() {
            lg.lazy.committed -= self.backing.physical(&chunk);
        }
        chunk
    }

    /// Take in a wholly free chunk of another pool of the same backing (its pages, committed
    /// or not, come with it).
    fn attach_chunk(&'static self, lg: &mut Large, chunk: Chunk) {
        if self.lazy() {
            lg.lazy.committed += self.backing.physical(&chunk);
        }
        lg.chunks.insert(chunk.base, chunk);
    }

    /// Give wholly free chunk `sp` back to the backing, after the work queued on this pool's
    /// stream that may still touch it. Returns its bytes.
    fn release_chunk(&'static self, lg: &mut Large, sp: &'static Span) -> usize {
        let start = sp.start();
        let chunk = self.detach_chunk(lg, sp);
        if let Some(ev) = lg.take_event(start) {
            if ev.wait().is_err() {
                let _ = cuda::device_synchronize(self.device);
            }
        } else if self.is_retired()
            && let Some(ev) = lock(&self.retire_event).as_ref()
            && ev.wait().is_err()
        {
            let _ = cuda::device_synchronize(self.device);
        }
        let phys = self.backing.physical(&chunk);
        // SAFETY: the chunk is wholly free, no longer registered, and no queued work of its
        // stream uses it.
        unsafe { self.backing.unmap(&chunk) };
        self.stats.on_unmap(phys);
        self.stats.on_unreserve(chunk.raw_size);
        self.unmapped.fetch_add(phys, Ordering::Relaxed);
        phys
    }

    /// Give wholly free chunks back to the backing, largest first, until at most `keep` bytes
    /// of them remain. Returns the bytes given back.
    pub(super) fn release_free_chunks(&'static self, lg: &mut Large, keep: usize) -> usize {
        let mut released = 0;
        while lg.idle_bytes > keep {
            let Some(&sp) = lg.idle.values().next_back() else {
                break;
            };
            released += self.release_chunk(lg, sp);
        }
        released
    }

    /// Hand a wholly free chunk of at least `min` bytes (the smallest such) to another pool of
    /// the same device, with the event that orders it after this pool's stream.
    pub(crate) fn take_idle_chunk(
        &'static self,
        min: usize,
    ) -> Option<(Chunk, Option<cuda::Event>)> {
        let mut lg = lock(&self.large);
        if lg.idle.range((min, 0)..).next().is_none() {
            self.flush_quick(&mut lg);
        }
        let (_, &sp) = lg.idle.range((min, 0)..).next()?;
        let start = sp.start();
        let chunk = self.detach_chunk(&mut lg, sp);
        let ev = lg.take_event(start);
        Some((chunk, ev))
    }

    /// Retire this pool's stream (about to be destroyed): record the event that covers all
    /// its work, never touch the handle again, and hand every idle chunk to the group (so do
    /// the chunks that fall idle later). The pool may be recycled once it holds no chunk.
    pub(crate) fn retire(&'static self) {
        let fence = if self.ordered() {
            match cuda::Event::record(self.stream(), self.device) {
                Ok(ev) => Some(Arc::new(ev)),
                Err(_) => {
                    let _ = cuda::device_synchronize(self.device);
                    None
                }
            }
        } else {
            None
        };
        *lock(&self.retire_event) = fence;
        self.key.fetch_or(1, Ordering::AcqRel);
        self.drain_hot();
        self.release_empty_slabs();
        let mut lg = lock(&self.large);
        // The retire event covers the events recorded on the stream earlier.
        lg.events.clear();
        self.flush_quick(&mut lg);
        if let Some(g) = self.group {
            while let Some(&sp) = lg.idle.values().next() {
                let chunk = self.detach_chunk(&mut lg, sp);
                g.adopt(chunk, lock(&self.retire_event).clone());
            }
        }
    }

    /// Bytes of physical memory this pool holds now.
    pub(crate) fn mapped_bytes(&'static self) -> usize {
        self.mapped_of(&lock(&self.large))
    }

    /// Bytes of physical memory in `lg`'s chunks: what is committed in a lazily committed
    /// pool, the chunks otherwise.
    pub(super) fn mapped_of(&self, lg: &Large) -> usize {
        if self.lazy() {
            lg.lazy.committed
        } else {
            lg.chunk_bytes()
        }
    }

    /// Serve `stream` from now on, if this pool is retired and holds no memory. Returns
    /// whether it does.
    pub(crate) fn recycle(&'static self, stream: usize) -> bool {
        let lg = lock(&self.large);
        if !self.is_retired() || !lg.chunks.is_empty() {
            return false;
        }
        *lock(&self.retire_event) = None;
        self.key.store(stream << 1, Ordering::Release);
        true
    }
}
