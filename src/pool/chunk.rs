//! Chunks: what a pool maps from its backing and gives back. A chunk is mapped when no free
//! span fits a request (`map_chunk`), handed whole to another stream's pool when it falls idle
//! (`take_idle_chunk`, `attach_chunk`), handed to the device's orphans when its stream is
//! retired (`retire`), and given back to the backing (`release_chunk`) under the pool's
//! `retain` and decay (`enforce_retain`), on `trim`, or to make room under a limit.

use super::types::{Fence, Large, Pool, Span};
use crate::backing::{Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::fork::lock;
use crate::registry;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Pool {
    /// Keep the free memory the pool holds (free spans, the exact-size list, kept slabs)
    /// within `retain`: wholly free chunks go back first, largest first; then the oldest
    /// exact-size spans are merged into the free set (which may make more chunks wholly free).
    /// What remains above `retain` is free space inside chunks that still hold live blocks.
    /// With a decay (pinned memory, costly to make), a wholly free chunk goes back only once
    /// it has been idle that long; until then the pool stays above `retain` and `decay_due`
    /// says when to look again.
    pub(super) fn enforce_retain(&'static self, lg: &mut Large) {
        let budget = self
            .retention
            .bound()
            .saturating_sub(self.retention.kept_slabs());
        let decay = self.decay();
        let mut now = None;
        while lg.free_bytes() > budget {
            let expired = match decay {
                None => lg.idle.largest(),
                Some(d) => {
                    let t = *now.get_or_insert_with(Instant::now);
                    lg.idle.largest_expired(t, d)
                }
            };
            if let Some(sp) = expired {
                self.release_chunk(lg, sp);
            } else if decay.is_some() && !lg.idle.is_empty() {
                // Idle chunks wait out their decay; look again once the oldest is due.
                let oldest = lg.idle.oldest();
                if let (Some(o), Some(d)) = (oldest, decay) {
                    self.set_decay_due(o + d);
                }
                self.set_over_retain(true);
                return;
            } else if let Some(old) = lg.quick.pop_oldest() {
                self.uncache(lg, old);
            } else {
                break;
            }
        }
        self.set_over_retain(lg.free_bytes() > budget);
        self.clear_decay_due();
    }

    /// With a decay: if idle chunks are due to go back, give them back now.
    pub(super) fn decay_if_due(&'static self) {
        if self.decay_is_due() {
            let mut lg = lock(&self.large);
            self.enforce_retain(&mut lg);
        }
    }

    /// Map a chunk of `want` bytes (or, when the limit or the backing refuses that, of `need`
    /// bytes), honouring the limit, with the registry's range reserved for it.
    pub(super) fn map_chunk(
        &'static self,
        lg: &mut Large,
        want: usize,
        need: usize,
    ) -> Result<Chunk> {
        let mut last = None;
        for size in [want, need] {
            if last.is_some() && size == want {
                continue;
            }
            // A lazily committed chunk is address space: its pages count when committed.
            let charge = match self.charge(if self.lazy() { 0 } else { size }, need) {
                Ok(c) => c,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            let chunk = match self.backing.map(size) {
                Ok(c) => c,
                Err(e) if e.status == crate::error::Status::UMP_ERR_UNSUPPORTED => {
                    return Err(e);
                }
                Err(e) => {
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
                return Err(Error::oom(format!(
                    "no memory for the registry entries of a {size}-byte chunk at {:#x}",
                    chunk.base
                )));
            }
            charge.keep();
            self.stats.on_reserve(chunk.raw_size);
            lg.chunks.insert(chunk);
            return Ok(chunk);
        }
        Err(last.unwrap_or_else(|| Error::oom("out of memory")))
    }

    /// A free span covering all of `chunk` (just mapped or adopted).
    pub(super) fn chunk_span(
        &'static self,
        lg: &mut Large,
        chunk: &Chunk,
        dirty: bool,
    ) -> &'static Span {
        self.new_span(lg, chunk.base, chunk.size, (chunk.base, chunk.size), dirty)
    }

    /// Record, on this pool's stream, the event after which chunk `base` (now wholly free)
    /// may serve another stream. When the stream cannot take an event (a destroyed stream
    /// handle), wait for the device instead, so the chunk needs none.
    pub(super) fn stamp_idle(&'static self, lg: &mut Large, base: usize) {
        // Discards of the chunk's blocks go first: the event covers them.
        self.flush_discards(lg);
        lg.take_event(base);
        if let Some(g) = self.group
            && let Some(fence) = g.fence(self.stream())
        {
            lg.set_event(base, fence);
        }
    }

    /// Take wholly free chunk `sp` out of the pool (free set, registry, chunk list) without
    /// giving it back. Its descriptor is recycled; its event stays in `events` for the caller.
    pub(super) fn detach_chunk(&'static self, lg: &mut Large, sp: &'static Span) -> Chunk {
        let start = sp.start();
        let len = sp.len();
        self.unlist_free(lg, sp);
        registry::set_range(start, len, 0);
        sp.len.store(0, Ordering::Release);
        lg.spare.push(sp);
        let chunk = lg
            .chunks
            .remove(start)
            .unwrap_or(Chunk::mapped(start, len, len));
        if self.lazy() {
            lg.lazy.on_decommit(self.backing.physical(&chunk));
        }
        chunk
    }

    /// Take in a wholly free chunk of another pool of the same backing (its pages, committed
    /// or not, come with it).
    pub(super) fn attach_chunk(&'static self, lg: &mut Large, chunk: Chunk) {
        if self.lazy() {
            lg.lazy.on_commit(self.backing.physical(&chunk));
        }
        lg.chunks.insert(chunk);
    }

    /// Give wholly free chunk `sp` back to the backing, after the work queued on this pool's
    /// stream that may still touch it. Returns its bytes.
    pub(super) fn release_chunk(&'static self, lg: &mut Large, sp: &'static Span) -> usize {
        let start = sp.start();
        self.forget_discards(lg, start, start + sp.len());
        if self.kind == Kind::UMP_KIND_MANAGED {
            // No prefetch of the background migration may touch memory given back.
            crate::migrate::quiesce(start, start + sp.len());
        }
        let chunk = self.detach_chunk(lg, sp);
        if let Some(fence) = lg.take_event(start) {
            fence.wait();
        } else if self.is_retired()
            && let Some(fence) = lock(&self.retire_event).as_ref()
        {
            fence.wait();
        }
        let phys = self.backing.physical(&chunk);
        // SAFETY: the chunk is wholly free, no longer registered, and no queued work of its
        // stream uses it.
        unsafe { self.backing.unmap(&chunk) };
        self.stats.on_unmap(phys);
        self.stats.on_unreserve(chunk.raw_size);
        self.retention.note_unmapped(phys);
        phys
    }

    /// Give wholly free chunks back to the backing, largest first, until at most `keep` bytes
    /// of them remain. Returns the bytes given back.
    pub(super) fn release_free_chunks(&'static self, lg: &mut Large, keep: usize) -> usize {
        let mut released = 0;
        while lg.idle.bytes() > keep {
            let Some(sp) = lg.idle.largest() else {
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
    ) -> Option<(Chunk, Option<Box<dyn Fence>>)> {
        let mut lg = lock(&self.large);
        if lg.idle.smallest_at_least(min).is_none() {
            self.flush_quick(&mut lg);
        }
        let sp = lg.idle.smallest_at_least(min)?;
        let start = sp.start();
        let chunk = self.detach_chunk(&mut lg, sp);
        let ev = lg.take_event(start);
        Some((chunk, ev))
    }

    /// Retire this pool's stream (about to be destroyed): record the event that covers all
    /// its work, never touch the handle again, and hand every idle chunk to the group (so do
    /// the chunks that fall idle later). The pool may be recycled once it holds no chunk.
    pub(crate) fn retire(&'static self) {
        // The last use of the stream's handle besides the fence below.
        self.flush_discards(&mut lock(&self.large));
        let fence: Option<Arc<dyn Fence>> = match self.group {
            Some(g) if g.ordered() => g.fence(self.stream()).map(Arc::from),
            _ => None,
        };
        *lock(&self.retire_event) = fence;
        self.key.fetch_or(1, Ordering::AcqRel);
        self.drain_hot();
        self.release_empty_slabs();
        let mut lg = lock(&self.large);
        // The retire event covers the events recorded on the stream earlier.
        lg.clear_events();
        self.flush_quick(&mut lg);
        if let Some(g) = self.group {
            while let Some(sp) = lg.idle.smallest() {
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
            lg.lazy.committed()
        } else {
            lg.chunks.bytes()
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
