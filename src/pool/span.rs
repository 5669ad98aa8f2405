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

use super::types::{BlockInfo, Fit, Large, SPAN_USED, Span};
use std::sync::atomic::Ordering;

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

impl Fit {
    pub(super) fn tail(span: &'static Span) -> Fit {
        Fit {
            span,
            head: false,
            need: None,
        }
    }
}

impl Large {
    /// The largest block that fits without mapping more: the largest free span once the
    /// exact-size list is merged into the free set (as an allocation that finds nothing does),
    /// i.e. adjacent free and listed spans of one chunk count as one.
    pub(super) fn largest_free(&self) -> usize {
        if self.quick.is_empty() {
            return self.free.largest_len();
        }
        let mut spans: Vec<(usize, usize, usize)> = self
            .free
            .values()
            .chain(self.quick.values())
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
        self.free.bytes() + self.quick.bytes()
    }
}
