//! Spans: granule-aligned ranges of chunks, handed out by best fit with splitting and
//! coalescing, the exact-size list, and the chunks' way back to the backing.

use super::*;

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
}

#[derive(Default)]
pub(super) struct Large {
    /// Free spans keyed by (length, start).
    pub(super) free: BTreeSet<(usize, usize)>,
    pub(super) chunks: Vec<Chunk>,
    pub(super) spare: Vec<&'static Span>,
    /// Bytes in free spans that cover a whole chunk (what can go back to the backing).
    pub(super) idle: usize,
    /// Stream-ordered pools only: for each wholly free chunk (by base), the event recorded on
    /// the pool's stream when it fell idle. Another stream may use the chunk once it waits
    /// for the event; this stream may use it at once.
    pub(super) events: Vec<(usize, cuda::Event)>,
    /// The exact-size list (oldest first): spans in state CACHED.
    pub(super) quick: std::collections::VecDeque<&'static Span>,
    pub(super) quick_bytes: usize,
}

/// Where a live block is, as the registry and descriptors say.
impl Pool {
    // ---- large blocks ------------------------------------------------------------------

    pub(super) fn alloc_large(&'static self, n: usize) -> Result<Alloc> {
        let len = n.next_multiple_of(GRANULE);
        let span = self.take_span(len)?;
        span.req.store(n, Ordering::Relaxed);
        let zeroed = !span.dirty.swap(true, Ordering::Relaxed);
        let start = span.start.load(Ordering::Relaxed);

        Ok(Alloc { ptr: start, zeroed })
    }

    pub(super) fn free_large(&'static self, sp: &'static Span, ptr: usize) -> Result<usize> {
        let mut lg = lock(&self.large);
        let state = sp.state.load(Ordering::Acquire);
        let start = sp.start.load(Ordering::Acquire);
        if (state == SPAN_FREE || state == SPAN_CACHED)
            && ptr >= start
            && ptr < start + sp.len.load(Ordering::Relaxed)
        {
            return Err(double_free(ptr));
        }
        if state != SPAN_USED {
            return Err(Error::not_ours(format!("{ptr:#x} is not a live block")));
        }
        if ptr != start {
            return Err(Error::not_ours(format!(
                "{ptr:#x} points inside a block, not at its start"
            )));
        }
        let n = sp.req.load(Ordering::Relaxed);
        let len = sp.len.load(Ordering::Relaxed);
        if is_whole_chunk(sp) || len > QUICK_MAX_BYTES.min(self.retain) {
            // A chunk of its own (the free set reuses it as cheaply, and it may go idle), or
            // more than the list may hold.
            sp.state.store(SPAN_FREE, Ordering::Release);
            self.insert_free(&mut lg, sp);
            self.maybe_release(&mut lg);
        } else {
            sp.state.store(SPAN_CACHED, Ordering::Release);
            lg.quick.push_back(sp);
            lg.quick_bytes += len;
            while lg.quick.len() > QUICK_MAX || lg.quick_bytes > QUICK_MAX_BYTES.min(self.retain) {
                let old = lg.quick.pop_front().expect("non-empty");
                self.uncache(&mut lg, old);
            }
        }
        Ok(n)
    }

    /// Move a span from the exact-size list into the free set (merging it).
    pub(super) fn uncache(&'static self, lg: &mut Large, sp: &'static Span) {
        lg.quick_bytes -= sp.len.load(Ordering::Relaxed);
        sp.state.store(SPAN_FREE, Ordering::Release);
        self.insert_free(lg, sp);
        self.maybe_release(lg);
    }

    /// Merge every span of the exact-size list into the free set. Returns whether any was.
    pub(super) fn flush_quick(&'static self, lg: &mut Large) -> bool {
        let any = !lg.quick.is_empty();
        while let Some(sp) = lg.quick.pop_front() {
            self.uncache(lg, sp);
        }
        any
    }

    /// Return a used (not slab) span to the free set, under the large lock.
    pub(super) fn release_span(&'static self, sp: &'static Span) {
        let mut lg = lock(&self.large);
        sp.state.store(SPAN_FREE, Ordering::Release);
        self.insert_free(&mut lg, sp);
        self.maybe_release(&mut lg);
    }

    /// Take a span of exactly `len` bytes (granule multiple), mapping a chunk if needed.
    /// The span comes back in state USED (so no concurrent free merges it), with the registry
    /// pointing at it. A stream-ordered pool that has nothing free that fits first adopts a
    /// wholly free chunk of another stream of its device (ordered after that stream's work)
    /// before it maps a new one.
    pub(super) fn take_span(&'static self, len: usize) -> Result<&'static Span> {
        let chunk_len = if len >= ARENA / 2 { len } else { ARENA };
        if let Some(g) = self.group {
            {
                let mut lg = lock(&self.large);
                if let Some(sp) = self.take_fit(&mut lg, len) {
                    return Ok(self.finish_take(&mut lg, sp, len));
                }
            }
            // Neither lock of ours is held while other pools' locks are taken.
            if let Some(chunk) = g.steal(self, len) {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                let mut lg = lock(&self.large);
                lg.chunks.push(chunk);
                let sp = self.new_span(&mut lg, chunk.base, chunk.size, &chunk, true);
                return Ok(self.finish_take(&mut lg, sp, len));
            }
            g.make_room(chunk_len, len);
        }
        let mut lg = lock(&self.large);
        let sp = match self.take_fit(&mut lg, len) {
            Some(sp) => sp,
            None => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                let chunk = match (self.map_chunk(&mut lg, chunk_len, len), self.group) {
                    (Ok(c), _) => c,
                    (Err(e), None) => return Err(e),
                    (Err(_), Some(g)) => {
                        // Out of memory: give back what every stream of the device holds
                        // idle, then try once more.
                        drop(lg);
                        g.release_idle();
                        lg = lock(&self.large);
                        self.map_chunk(&mut lg, chunk_len, len)?
                    }
                };
                self.new_span(
                    &mut lg,
                    chunk.base,
                    chunk.size,
                    &chunk,
                    !self.backing.fresh_is_zero(),
                )
            }
        };
        Ok(self.finish_take(&mut lg, sp, len))
    }

    /// Best fit for `len` bytes from this pool's free set, out of the set.
    pub(super) fn take_fit(&'static self, lg: &mut Large, len: usize) -> Option<&'static Span> {
        if let Some(i) = lg
            .quick
            .iter()
            .rposition(|sp| sp.len.load(Ordering::Relaxed) == len)
        {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            let sp = lg.quick.remove(i).expect("index in range");
            lg.quick_bytes -= len;
            // State FREE for `finish_take`, which cuts nothing off an exact fit.
            sp.state.store(SPAN_FREE, Ordering::Release);
            return Some(sp);
        }
        let fit = lg.free.range((len, 0)..).next().copied();
        let (flen, fstart) = match fit {
            Some(f) => f,
            None => {
                // Merge the exact-size list and look again before mapping more memory.
                if !self.flush_quick(lg) {
                    return None;
                }
                *lg.free.range((len, 0)..).next()?
            }
        };
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        lg.free.remove(&(flen, fstart));
        let Some(Entry::Span(sp)) = entry_at(fstart) else {
            unreachable!("free set entries are registered spans")
        };
        if is_whole_chunk(sp) {
            lg.idle -= flen;
            // This stream may reuse its own idle chunk at once: its event is moot.
            take_event(lg, fstart);
        }
        Some(sp)
    }

    /// Cut `len` bytes from free span `sp` and mark them used.
    pub(super) fn finish_take(
        &'static self,
        lg: &mut Large,
        sp: &'static Span,
        len: usize,
    ) -> &'static Span {
        let taken = self.split_tail(lg, sp, len);
        taken.state.store(SPAN_USED, Ordering::Release);
        // Huge pages (NumPy's default does this for blocks of 4 MiB and more): advise the whole
        // chunk the first time such a block lands in it, so reuse costs no system call.
        if len >= crate::backing::HUGEPAGE_MIN {
            let base = taken.chunk_base.load(Ordering::Relaxed);
            if let Some(c) = lg.chunks.iter_mut().find(|c| c.base == base)
                && !c.advised
            {
                c.advised = true;
                self.backing.advise_block(c.base, c.size);
            }
        }
        taken
    }

    /// Hand a wholly free chunk of at least `min` bytes (the smallest such) to another pool of
    /// the same backing kind, with the event that orders it after this pool's stream.
    pub(crate) fn take_idle_chunk(
        &'static self,
        min: usize,
    ) -> Option<(Chunk, Option<cuda::Event>)> {
        let mut lg = lock(&self.large);
        self.flush_quick(&mut lg);
        if lg.idle < min {
            return None;
        }
        let (len, start) = lg
            .free
            .range((min, 0)..)
            .copied()
            .find(|&(len, start)| lg.chunks.iter().any(|c| c.base == start && c.size == len))?;
        let Some(Entry::Span(sp)) = entry_at(start) else {
            unreachable!("free spans are registered")
        };
        self.unlist_free(&mut lg, sp);
        registry::set_range(start, len, 0);
        let pos = lg
            .chunks
            .iter()
            .position(|c| c.base == start)
            .expect("chunk record");
        let chunk = lg.chunks.swap_remove(pos);
        sp.len.store(0, Ordering::Release);
        lg.spare.push(sp);
        let ev = take_event(&mut lg, start);
        Some((chunk, ev))
    }

    /// Give back every wholly free chunk of this pool (waiting for its stream first).
    pub(crate) fn release_idle(&'static self) -> usize {
        let mut lg = lock(&self.large);
        self.flush_quick(&mut lg);
        self.release_free_chunks(&mut lg, 0)
    }

    /// Map a chunk of `want` bytes (falling back to `need` bytes), honouring the limit and
    /// retrying once after giving cached chunks back.
    pub(super) fn map_chunk(
        &'static self,
        lg: &mut Large,
        want: usize,
        need: usize,
    ) -> Result<Chunk> {
        let mapped = self.stats.mapped.load(Ordering::Relaxed);
        let size = match self.limit {
            Some(limit) if mapped + want > limit => {
                if mapped + need > limit {
                    self.release_free_chunks(lg, 0);
                    let mapped = self.stats.mapped.load(Ordering::Relaxed);
                    if mapped + need > limit {
                        return Err(Error::oom(format!(
                            "UMP_ALLOC_LIMIT of {limit} bytes reached ({mapped} mapped, {need} more needed)"
                        )));
                    }
                }
                need
            }
            _ => want,
        };
        let chunk = match self.backing.map(size) {
            Ok(c) => c,
            Err(_) => {
                // Out of memory in the backing: give back what is cached and try once more,
                // with the smallest chunk that serves the request.
                self.release_free_chunks(lg, 0);
                self.backing.map(need).map_err(|e| {
                    Error::oom(format!(
                        "cannot get {need} bytes of {} memory: {}",
                        self.kind().name(),
                        e.msg
                    ))
                })?
            }
        };
        self.stats.on_map(chunk.size);
        lg.chunks.push(chunk);
        Ok(chunk)
    }

    pub(super) fn new_span(
        &'static self,
        lg: &mut Large,
        start: usize,
        len: usize,
        chunk: &Chunk,
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
            }))
        });
        sp.start.store(start, Ordering::Release);
        sp.len.store(len, Ordering::Release);
        sp.state.store(SPAN_FREE, Ordering::Release);
        sp.chunk_base.store(chunk.base, Ordering::Relaxed);
        sp.chunk_len.store(chunk.size, Ordering::Relaxed);
        sp.dirty.store(dirty, Ordering::Relaxed);

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
        let flen = sp.len.load(Ordering::Relaxed);
        if flen == len {
            return sp;
        }
        let start = sp.start.load(Ordering::Relaxed);
        let chunk = chunk_of(sp);
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start));
        self.new_span(
            lg,
            start + flen - len,
            len,
            &chunk,
            sp.dirty.load(Ordering::Relaxed),
        )
    }

    /// Put free span `sp` into the free set, merging it with free neighbours in its chunk.
    pub(super) fn insert_free(&'static self, lg: &mut Large, sp: &'static Span) {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        let mut cur = sp;
        // Merge with the next span.
        let end = cur.start.load(Ordering::Relaxed) + cur.len.load(Ordering::Relaxed);
        if end < cend {
            if let Some(Entry::Span(next)) = entry_at(end) {
                if next.state.load(Ordering::Acquire) == SPAN_FREE
                    && next.chunk_base.load(Ordering::Relaxed) == cbase
                {
                    self.absorb(lg, cur, next);
                }
            }
        }
        // Merge into the previous span.
        let start = cur.start.load(Ordering::Relaxed);
        if start > cbase {
            if let Some(Entry::Span(prev)) = entry_at(start - 1) {
                if prev.state.load(Ordering::Acquire) == SPAN_FREE
                    && prev.chunk_base.load(Ordering::Relaxed) == cbase
                {
                    self.unlist_free(lg, prev);
                    self.absorb_into(lg, prev, cur);
                    cur = prev;
                }
            }
        }
        let len = cur.len.load(Ordering::Relaxed);
        let start = cur.start.load(Ordering::Relaxed);
        lg.free.insert((len, start));
        if is_whole_chunk(cur) {
            lg.idle += len;
            if self.ordered() {
                self.stamp_idle(lg, start);
            }
        }
    }

    /// Record, on this pool's stream, the event after which chunk `base` (now wholly free)
    /// may serve another stream. When the stream cannot take an event (a destroyed stream
    /// handle), wait for the device instead, so the chunk needs none.
    pub(super) fn stamp_idle(&self, lg: &mut Large, base: usize) {
        take_event(lg, base);
        if self.is_retired() {
            return; // the retire event orders the chunk
        }
        match cuda::Event::record(self.stream, self.device) {
            Ok(ev) => lg.events.push((base, ev)),
            Err(_) => {
                if let Some(g) = self.group {
                    g.count_sync();
                }
                let _ = cuda::device_synchronize(self.device);
            }
        }
    }

    /// `a` (not in the free set) takes over its free right neighbour `b` (in the free set).
    pub(super) fn absorb(&'static self, lg: &mut Large, a: &'static Span, b: &'static Span) {
        self.unlist_free(lg, b);
        self.absorb_into(lg, a, b);
    }

    /// Take free span `sp` out of the free set (keeping the idle count right).
    pub(super) fn unlist_free(&self, lg: &mut Large, sp: &Span) {
        let len = sp.len.load(Ordering::Relaxed);
        lg.free.remove(&(len, sp.start.load(Ordering::Relaxed)));
        if is_whole_chunk(sp) {
            lg.idle -= len;
        }
    }

    /// `a` takes over its right neighbour `b`; `b`'s descriptor is recycled.
    pub(super) fn absorb_into(&'static self, lg: &mut Large, a: &'static Span, b: &'static Span) {
        let blen = b.len.load(Ordering::Relaxed);
        let bstart = b.start.load(Ordering::Relaxed);
        registry::set_range(bstart, blen, a as *const Span as usize | TAG_SPAN);
        a.len.fetch_add(blen, Ordering::AcqRel);
        let dirty = a.dirty.load(Ordering::Relaxed) || b.dirty.load(Ordering::Relaxed);
        a.dirty.store(dirty, Ordering::Relaxed);

        b.len.store(0, Ordering::Release);
        lg.spare.push(b);
    }

    /// Give wholly free chunks back while more than `retain` bytes sit free in them.
    /// O(1) unless there is something to give back.
    pub(super) fn maybe_release(&'static self, lg: &mut Large) {
        if lg.idle > self.retain {
            self.release_free_chunks(lg, self.retain);
        }
    }

    /// Give wholly free chunks back to the backing, largest first, until at most `keep` bytes
    /// of them remain. Returns the bytes given back.
    pub(super) fn release_free_chunks(&'static self, lg: &mut Large, keep: usize) -> usize {
        let whole: Vec<(usize, usize)> = lg
            .free
            .iter()
            .rev()
            .copied()
            .filter(|&(len, start)| lg.chunks.iter().any(|c| c.base == start && c.size == len))
            .collect();
        let mut kept: usize = whole.iter().map(|w| w.0).sum();
        let mut released = 0;
        for (len, start) in whole {
            if kept <= keep {
                break;
            }
            let Some(Entry::Span(sp)) = entry_at(start) else {
                unreachable!("free spans are registered")
            };
            self.unlist_free(lg, sp);
            registry::set_range(start, len, 0);
            let pos = lg
                .chunks
                .iter()
                .position(|c| c.base == start)
                .expect("chunk record");
            let chunk = lg.chunks.swap_remove(pos);
            // Work queued on this pool's stream may still touch the chunk: wait for it.
            if let Some(ev) = take_event(lg, start)
                && ev.wait().is_err()
            {
                let _ = cuda::device_synchronize(self.device);
            }
            // SAFETY: the chunk is wholly free, no longer registered, and no queued work of
            // its stream uses it.
            unsafe { self.backing.unmap(&chunk) };
            self.stats.on_unmap(chunk.size);
            sp.len.store(0, Ordering::Release);
            lg.spare.push(sp);
            kept -= len;
            released += len;
        }
        released
    }
}

/// Take the idle event of chunk `base` out of the list, if it has one.
pub(super) fn take_event(lg: &mut Large, base: usize) -> Option<cuda::Event> {
    let i = lg.events.iter().position(|e| e.0 == base)?;
    Some(lg.events.swap_remove(i).1)
}

pub(super) fn is_whole_chunk(sp: &Span) -> bool {
    sp.start.load(Ordering::Relaxed) == sp.chunk_base.load(Ordering::Relaxed)
        && sp.len.load(Ordering::Relaxed) == sp.chunk_len.load(Ordering::Relaxed)
}

pub(super) fn chunk_of(sp: &Span) -> Chunk {
    let base = sp.chunk_base.load(Ordering::Relaxed);
    let size = sp.chunk_len.load(Ordering::Relaxed);
    Chunk {
        base,
        size,
        raw: base,
        raw_size: size,
        advised: false,
    }
}
