//! Physical memory of lazily committed pools (a backing with a `commit_page`: the device
//! side's virtual-memory pool, see `backing::vmm`).
//!
//! A chunk of such a pool is address space. A span handed out (a block, or a slab) has every
//! page it touches committed first; a free span keeps its pages until they are *purged*
//! (decommitted), mimalloc's word for giving idle pages back without moving anything:
//!
//! - **When memory grows past the peak.** Before committing `n` more bytes, a pool whose
//!   mapped bytes would pass its peak in use by more than [`slack`] purges free spans first,
//!   oldest first, until it is back under. Free spans the device may still use are skipped,
//!   unless mapped would pass the peak by twice the slack: then the pool waits for that work
//!   and purges them too. So at any peak, mapped ≤ in use + pages shared with live blocks +
//!   twice the slack, whatever the pattern of sizes.
//! - **When memory stays idle.** Every [`WINDOW`] the pool compares what it has committed
//!   with the most it had handed out over the last two windows; free spans beyond that (and
//!   the slack) are purged at the next large allocation or free of the pool, so mapped memory
//!   falls back within about [`PURGE_DELAY`] after a workload's big phase, without `trim`.
//! - **`trim`** (and an out-of-memory retry) purges every free span, waiting if it must.
//!
//! **Stream order.** A freed block may still be used by work queued on its stream before the
//! free, and `cuMemUnmap` does not wait for it. Frees are stamped with the pool's *epoch*; a
//! purge records a fence (an event on the pool's stream) closing the epoch, and a span is
//! purged only once the fence of its epoch has completed (queried, never waited for, except by
//! `trim`). A retired stream's spans wait for its retire event instead. Pools that are not
//! stream-ordered (host memory, or no CUDA driver) need no fence.

use super::entry::{Entry, entry_at};
use super::parts::{Ask, FreeSpans, epoch_ms};
use super::types::{Fit, Large, Pool, SPAN_FREE, Span};
use crate::error::{Error, Result};
use crate::prim::fork::lock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long committed memory that no block needs stays committed, at most (two windows).
#[allow(dead_code)] // the bound the docs state; the tests wait for it
pub(crate) const PURGE_DELAY: Duration = Duration::from_millis(2 * WINDOW_MS);
/// The working-set window: memory handed out at some point of the last two is kept.
const WINDOW_MS: u64 = 500;
/// How often a pool looks at its window (at most).
const PURGE_TICK_MS: u64 = 50;
/// Free committed memory a pool may hold above its peak in use before committing more
/// purges free spans (the larger of this and [`SLACK_SHIFT`]).
const SLACK_MIN: usize = 32 << 20;
/// ... and of the peak in use divided by 2^this (1/64: 1.6 %).
const SLACK_SHIFT: u32 = 6;
/// Free spans a lazily committed pool looks at for one whose pages are committed.
const FIT_CANDIDATES: usize = 16;

/// The free committed memory a pool keeps above its peak in use of `peak` bytes.
pub(crate) fn slack(peak: usize) -> usize {
    SLACK_MIN.max(peak >> SLACK_SHIFT)
}

/// What a purge is for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Purge {
    /// Committing would pass the peak by this many bytes: give back at least as much (with
    /// `true`, waiting for the device's work on freed memory where needed).
    Need(usize, bool),
    /// Keep what the last two windows used (and the slack), without waiting.
    Decay,
    /// Give back every free page, waiting for the device where needed.
    All,
}

impl Pool {
    /// Whether this pool commits physical memory lazily.
    #[inline]
    pub(super) fn lazy(&self) -> bool {
        self.commit.is_lazy()
    }

    /// Commit the pages of `[start, start+len)` (a span being handed out), purging free spans
    /// first when that would take the pool past its peak in use. Returns whether the backing
    /// was called. On failure nothing changed.
    pub(super) fn commit_span(
        &'static self,
        lg: &mut Large,
        start: usize,
        len: usize,
        need: Option<usize>,
    ) -> Result<bool> {
        let need = need.unwrap_or_else(|| self.backing.uncommitted(start, len));
        if need == 0 {
            return Ok(false);
        }
        // The peak in use once this block is handed out, and what may be mapped beside it.
        let peak = (self.stats.in_use_peak.load(Ordering::Relaxed)).max(self.stats.in_use() + len);
        let soft = peak + slack(peak);
        let over = |p: &Pool| p.stats.mapped.load(Ordering::Relaxed) + need;
        // The span being handed out is out of the free set: a purge cannot touch it.
        if over(self) > soft {
            self.purge(lg, Purge::Need(over(self) - soft, false));
        }
        // Free memory the device may still use (its epoch is not over) is purged too, after
        // waiting for it, rather than letting mapped memory run away from the peak.
        if over(self) > soft + slack(peak) {
            self.purge(lg, Purge::Need(over(self) - soft, true));
        }
        let charge = self.charge(need, need)?;
        match self.backing.commit(start, len) {
            Ok(n) => {
                // `n == need`: the pool's lock keeps others off its chunks.
                charge.keep_as(n);
                lg.lazy.on_commit(n);
                Ok(true)
            }
            Err(e) => {
                drop(charge);
                Err(Error::oom(format!(
                    "cannot commit {need} bytes of {} memory: {}",
                    self.kind().name(),
                    e.msg
                )))
            }
        }
    }

    /// A span went into the free set (merged with its neighbours, its epoch the newest of
    /// theirs): queue it for purging.
    pub(super) fn on_span_free(&self, lg: &mut Large, sp: &Span) {
        let Large { lazy, free, .. } = lg;
        let free_spans = free.len();
        lazy.queue(sp.start(), free_spans, |s| self.is_free_span(free, s));
    }

    /// The span of this pool's free set starting at `start`, if there is one.
    fn free_span_at(&self, free: &FreeSpans<&'static Span>, start: usize) -> Option<&'static Span> {
        match entry_at(start)? {
            Entry::Span(sp)
                if std::ptr::eq(sp.pool, self)
                    && sp.start() == start
                    && sp.state.load(Ordering::Acquire) == SPAN_FREE
                    && free.contains((sp.len(), start)) =>
            {
                Some(sp)
            }
            _ => None,
        }
    }

    fn is_free_span(&self, free: &FreeSpans<&'static Span>, start: usize) -> bool {
        self.free_span_at(free, start).is_some()
    }

    /// Whether spans freed in `epoch` are over on the device. Asked about the current epoch,
    /// the books close it with a fence on the pool's stream (a device sync where the stream
    /// takes none); a retired stream's spans wait for its retire fence instead.
    fn epoch_safe(&self, lg: &mut Large, epoch: u64, ask: Ask) -> bool {
        // Not stream-ordered (`ordered()`): nothing on the device to wait for.
        let Some(g) = self.group.filter(|g| g.ordered()) else {
            return true;
        };
        if self.is_retired() {
            return lock(&self.retire_event)
                .as_ref()
                .is_none_or(|fence| ask.reached(&**fence));
        }
        lg.lazy.epoch_over(epoch, ask, || g.fence(self.stream()))
    }

    /// Purge free spans (see the module docs). Returns the bytes given back.
    pub(super) fn purge(&'static self, lg: &mut Large, how: Purge) -> usize {
        let mut freed = 0;
        if matches!(how, Purge::All) {
            let spans: Vec<&'static Span> = lg.free.values().collect();
            let newest = spans
                .iter()
                .map(|s| s.free_epoch.load(Ordering::Relaxed))
                .max();
            if newest.is_some_and(|e| !self.epoch_safe(lg, e, Ask::Wait)) {
                return 0;
            }
            for sp in spans {
                freed += self.decommit_span(lg, sp);
            }
            lg.lazy.clear_queue();
            return freed;
        }
        let keep = match how {
            Purge::Decay => {
                let peak = lg.lazy.recent_peak();
                peak + slack(peak)
            }
            _ => 0,
        };
        // One pass over the queue, oldest first; spans whose epoch is not over yet wait at
        // the back.
        let mut left = lg.lazy.queued();
        while left > 0
            && let Some(start) = lg.lazy.next_queued()
        {
            left -= 1;
            if matches!(how, Purge::Decay) && lg.lazy.committed() <= keep {
                lg.lazy.requeue_first(start);
                break;
            }
            let Some(sp) = self.free_span_at(&lg.free, start) else {
                continue;
            };
            let ask = match how {
                Purge::Need(_, true) => Ask::Wait,
                _ => Ask::Query,
            };
            if !self.epoch_safe(lg, sp.free_epoch.load(Ordering::Relaxed), ask) {
                lg.lazy.requeue_last(start);
                continue;
            }
            freed += self.decommit_span(lg, sp);
            if let Purge::Need(n, _) = how
                && freed >= n
            {
                break;
            }
        }
        freed
    }

    /// Give back the committed pieces inside free span `sp`.
    fn decommit_span(&'static self, lg: &mut Large, sp: &'static Span) -> usize {
        // SAFETY: the span is free (no live block overlaps it) and its epoch is over on the
        // device (checked by the callers).
        let n = unsafe { self.backing.decommit(sp.start(), sp.len()) };
        if n > 0 {
            lg.lazy.on_decommit(n);
            self.stats.on_unmap(n);
            self.retention.note_unmapped(n);
        }
        n
    }

    /// At most once per tick: when a window is over, purge what the last two did not need.
    pub(super) fn purge_if_due(&'static self, lg: &mut Large) {
        let ms = epoch_ms(Instant::now());
        if !self.commit.purge_due(ms, PURGE_TICK_MS) {
            return;
        }
        if lg.lazy.window_over(ms, WINDOW_MS) {
            self.purge(lg, Purge::Decay);
        }
    }

    /// Where to cut `len` bytes for a block: `best` (the best fit) if its tail is committed,
    /// else, among the next few fits, the end (head or tail) with the fewest bytes to commit,
    /// so that committed memory is reused before fresh pages are committed and old ones
    /// purged.
    pub(super) fn committed_fit(&self, lg: &Large, len: usize, best: &'static Span) -> Fit {
        let tail = |sp: &Span| self.backing.uncommitted(sp.start() + sp.len() - len, len);
        let mut pick = Fit {
            span: best,
            head: false,
            need: Some(tail(best)),
        };
        if pick.need == Some(0) {
            return pick;
        }
        for sp in lg.free.fits(len).take(FIT_CANDIDATES) {
            for (head, need) in [
                (false, tail(sp)),
                (true, self.backing.uncommitted(sp.start(), len)),
            ] {
                if Some(need) < pick.need {
                    pick = Fit {
                        span: sp,
                        head,
                        need: Some(need),
                    };
                }
            }
            if pick.need == Some(0) {
                break;
            }
        }
        pick
    }

    /// The largest free block that needs no commit: the longest committed run of a free span.
    pub(super) fn largest_committed_free(&self, lg: &Large) -> usize {
        lg.free
            .values()
            .map(|sp| self.backing.longest_committed(sp.start(), sp.len()))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
