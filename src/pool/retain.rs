//! What a pool keeps and gives back: its limit, the decay of idle chunks above `retain`, the
//! memory that pins chunks past it, `trim`, and what an out-of-memory retry gives back first
//! (with the pool it shares its counters and limit with).

use super::parts::Charge;
use super::types::{Limit, Pool};
use super::{commit, tcache};
use crate::error::Result;
use crate::prim::fork::lock;

impl Pool {
    /// The limit on this pool's mapped bytes (its group's, for a stream pool), and what set it.
    pub(crate) fn limit(&self) -> Option<Limit> {
        match self.group {
            Some(g) => g.limit(),
            None => self.limit.map(Limit::configured),
        }
    }

    /// Count `n` bytes about to be mapped against the limit in force (`need`: what the
    /// caller needs at least, for the error).
    pub(super) fn charge(&self, n: usize, need: usize) -> Result<Charge<'_>> {
        Charge::new(self.stats, n, self.limit(), need)
    }

    /// Keep wholly free chunks above `retain` for `decay` before they go back (pinned memory:
    /// a loop that frees and allocates large arrays reuses them instead of pinning anew).
    pub fn set_decay(&self, decay: std::time::Duration) {
        self.idle.set(decay);
    }

    pub(super) fn decay(&self) -> Option<std::time::Duration> {
        self.idle.get()
    }

    pub(super) fn set_decay_due(&self, at: std::time::Instant) {
        self.idle.set_due(at);
    }

    pub(super) fn clear_decay_due(&self) {
        self.idle.clear_due();
    }

    /// Whether idle chunks wait for their decay and the first is due (cheap when none wait).
    #[inline]
    pub(super) fn decay_is_due(&self) -> bool {
        self.idle.is_due()
    }
    /// Whether the pool held more free memory than `retain` allows at its last look, with
    /// nothing it could give back (see `enforce_retain`).
    #[inline]
    pub(crate) fn over_retain(&self) -> bool {
        self.retention.is_over()
    }

    /// The pool holds more free memory than `retain` allows and could give none back: what
    /// may pin its chunks goes back to the spans (slots cached for slabs with no live block,
    /// then kept empty slabs), so that the chunks can go. The caller holds no lock of the pool.
    #[cold]
    pub(super) fn release_pinning(&'static self) {
        tcache::release_dead(self);
        if self.over_retain() {
            self.release_empty_slabs();
        }
    }

    pub(super) fn set_over_retain(&self, over: bool) {
        self.retention.set_over(over);
    }
    /// Return every cached byte that can be returned, whichever thread cached it: thread
    /// caches go back to their slabs, empty slabs to the spans, the exact-size list to the
    /// free set, and wholly free chunks to the backing. Returns the bytes given back to the
    /// backing meanwhile.
    pub fn trim(&'static self) -> usize {
        let before = self.retention.unmapped();
        self.release_held(true);
        if self.is_stream_ordered() {
            self.drain_hot();
        } else {
            tcache::reclaim(Some(self));
        }
        self.release_empty_slabs();
        let mut lg = lock(&self.large);
        self.flush_quick(&mut lg);
        self.flush_discards(&mut lg);
        if self.lazy() {
            self.purge(&mut lg, commit::Purge::All);
        }
        self.release_free_chunks(&mut lg, 0);
        drop(lg);
        self.retention.unmapped() - before
    }

    /// Everything an out-of-memory retry may give back first: the device's idle memory of
    /// every stream for a stream-ordered pool, this pool's whole cache otherwise, and that of
    /// the pool it shares its counters and limit with (see [`share_limit_with`]).
    ///
    /// [`share_limit_with`]: Self::share_limit_with
    pub(super) fn reclaim_for_retry(&'static self) {
        match self.group {
            Some(g) => {
                g.release_idle();
            }
            None => {
                self.trim();
                if let Some(peer) = self.peer.get() {
                    peer.trim();
                }
            }
        }
    }
    /// `self` and `other` share their counters, and so the limit (`new_shared`: the host
    /// side's primary and fallback pools): an allocation refused for the limit in one first
    /// gives back what both cache.
    pub fn share_limit_with(&'static self, other: &'static Pool) {
        debug_assert!(std::ptr::eq(self.stats, other.stats));
        let _ = self.peer.set(other);
        let _ = other.peer.set(self);
    }
}
