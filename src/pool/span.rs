//! Spans: granule-aligned ranges of chunks, handed out by best fit with splitting and
//! coalescing, and the exact-size list. How chunks come and go is in `chunk`.
//!
//! Every change of a span's state happens under the pool's large lock: a span becomes a slab
//! (`SPAN_SLAB`) inside `take_span`, and a released slab becomes a free span inside
//! `release_slab_span`. A free that reaches a span therefore sees a consistent state: only a
//! `SPAN_USED` span whose start is the pointer is freed, exactly once.
//!
//! This file holds the descriptor ([`Span`]) and the books of a pool's large blocks
//! ([`Large`], [`Lazy`]); what is done with them is in its parts: `take` (finding a span for a
//! request and handing it out), `cut` (new descriptors, cutting a block off a free span) and
//! `free` (giving a span back: the exact-size list, merging into the free set).

mod cut;
mod free;
mod take;

use super::parts::Batch;
use super::{BlockInfo, Fence, Pool};
use crate::backing::Chunk;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
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
    pub(super) fences: VecDeque<(u64, Box<dyn Fence>)>,
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
    events: Vec<(usize, Box<dyn Fence>)>,
    /// The exact-size list (oldest first): spans in state CACHED.
    pub(super) quick: VecDeque<&'static Span>,
    pub(super) quick_bytes: usize,
    /// Pools with a decay: when each wholly free chunk (by base) fell idle.
    pub(super) idle_since: BTreeMap<usize, Instant>,
    /// Lazily committed pools: what is committed and what may be purged.
    pub(super) lazy: Lazy,
    /// Managed stream pools: freed blocks to discard, in one batch (see `residency`).
    pub(super) discards: Batch,
    /// Freed blocks held back for fork children, in state HELD (see `hold`).
    held: Vec<&'static Span>,
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

    /// The fence of wholly free chunk `base`, taken (the chunk is used again or goes).
    pub(super) fn take_event(&mut self, base: usize) -> Option<Box<dyn Fence>> {
        let i = self.events.iter().position(|e| e.0 == base)?;
        Some(self.events.swap_remove(i).1)
    }

    /// Chunk `base` fell idle: `fence` orders its reuse by another stream.
    pub(super) fn set_event(&mut self, base: usize, fence: Box<dyn Fence>) {
        self.events.push((base, fence));
    }

    /// Forget every chunk's fence (a retire fence covers them all).
    pub(super) fn clear_events(&mut self) {
        self.events.clear();
    }

    /// Hold used span `sp` back for fork children.
    pub(super) fn hold(&mut self, sp: &'static Span) {
        self.held.push(sp);
    }

    /// The held spans that `still` no longer holds (by their generation), taken off the held
    /// list.
    pub(super) fn take_unheld(&mut self, still: impl Fn(u64) -> bool) -> Vec<&'static Span> {
        if self.held.is_empty() {
            return Vec::new();
        }
        let (keep, go) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|sp| still(sp.born.load(Ordering::Relaxed)));
        self.held = keep;
        go
    }
}
