//! The commit part of a pool: its backing's commit unit where it commits lazily, and when free
//! pages are next purged (the policy is the pool's `commit.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Commit {
    /// The backing's commit unit when it commits lazily (None: it maps whole chunks).
    page: Option<usize>,
    /// The clock's milliseconds (`epoch_ms`) when free spans are next looked at.
    purge_due: AtomicU64,
}

impl Commit {
    pub(crate) fn new(page: Option<usize>) -> Commit {
        Commit {
            page,
            purge_due: AtomicU64::new(0),
        }
    }

    /// Whether the backing commits lazily.
    #[inline]
    pub(crate) fn is_lazy(&self) -> bool {
        self.page.is_some()
    }

    /// Whether free spans are due to be looked at at `ms`; if so, the next look is at
    /// `ms + tick`.
    pub(crate) fn purge_due(&self, ms: u64, tick: u64) -> bool {
        if ms < self.purge_due.load(Ordering::Relaxed) {
            return false;
        }
        self.purge_due.store(ms + tick, Ordering::Relaxed);
        true
    }
}
