//! What a pool keeps and gives back: its limit, the decay of idle chunks above `retain`, the
//! memory that pins chunks past it, `trim`, and what an out-of-memory retry gives back first
//! (with the pool it shares its counters and limit with).

use super::{Pool, commit, tcache};
use crate::prim::fork::lock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The retention part of a pool: the bound on the free memory it keeps in forms that could go
/// back to the backing (`retain`, see the module docs of `pool`), the bytes of wholly free slabs
/// it keeps for reuse (part of what the bound covers), whether it was over the bound with
/// nothing it could give back at its last look, and the bytes it gave back so far. Private to
/// this file: the rest of the pool asks through the methods below.
pub(super) struct Retention {
    bound: usize,
    kept_slabs: AtomicUsize,
    /// Free spans sit in chunks that something pins (`enforce_retain`). A slot cached by a
    /// thread whose slab holds no live block may be what pins one (see `tcache`).
    over: AtomicBool,
    /// What `trim` reports.
    unmapped: AtomicUsize,
}

impl Retention {
    pub(super) fn new(bound: usize) -> Retention {
        Retention {
            bound,
            kept_slabs: AtomicUsize::new(0),
            over: AtomicBool::new(false),
            unmapped: AtomicUsize::new(0),
        }
    }

    /// The `retain` bound in bytes.
    #[inline]
    pub(super) fn bound(&self) -> usize {
        self.bound
    }

    /// Bytes of wholly free slabs kept for reuse.
    #[inline]
    pub(super) fn kept_slabs(&self) -> usize {
        self.kept_slabs.load(Ordering::Relaxed)
    }

    /// A wholly free slab of `bytes` is kept.
    #[inline]
    pub(super) fn keep_slab(&self, bytes: usize) {
        self.kept_slabs.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Kept slabs of `bytes` in all are in use again or gone back.
    #[inline]
    pub(super) fn unkeep_slabs(&self, bytes: usize) {
        self.kept_slabs.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// `n` bytes went back to the backing.
    #[inline]
    pub(super) fn note_unmapped(&self, n: usize) {
        self.unmapped.fetch_add(n, Ordering::Relaxed);
    }
}

/// The decay part of a pool: how long a wholly free chunk above `retain` is kept before it goes
/// back, and when the first waiting one is due. Private to this file: the pool asks through
/// `decay`, `set_decay`, `set_decay_due`, `clear_decay_due` and `decay_is_due`.
#[derive(Default)]
pub(super) struct Decay {
    /// Milliseconds a wholly free chunk waits (0: it goes back at once). For memory that is
    /// costly to make, such as pinned host memory.
    ms: AtomicU64,
    /// Milliseconds since `EPOCH` when idle chunks are next due to go back (0: none waiting).
    due: AtomicU64,
}

/// The clock `decay_due` counts from.
static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

pub(super) fn epoch_ms(t: std::time::Instant) -> u64 {
    let e = *EPOCH.get_or_init(std::time::Instant::now);
    t.saturating_duration_since(e).as_millis() as u64 + 1
}
impl Pool {
    /// The limit on this pool's mapped bytes (its group's, for a stream pool), and what set it.
    pub(crate) fn limit(&self) -> Option<(usize, &'static str)> {
        match self.group {
            Some(g) => g.limit(),
            None => self.limit.map(|l| (l, "UMP_ALLOC_LIMIT")),
        }
    }

    /// Keep wholly free chunks above `retain` for `decay` before they go back (pinned memory:
    /// a loop that frees and allocates large arrays reuses them instead of pinning anew).
    pub fn set_decay(&self, decay: std::time::Duration) {
        self.idle
            .ms
            .store(decay.as_millis() as u64, Ordering::Relaxed);
    }

    pub(super) fn decay(&self) -> Option<std::time::Duration> {
        match self.idle.ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        }
    }

    pub(super) fn set_decay_due(&self, at: std::time::Instant) {
        self.idle.due.store(epoch_ms(at), Ordering::Relaxed);
    }

    pub(super) fn clear_decay_due(&self) {
        if self.idle.due.load(Ordering::Relaxed) != 0 {
            self.idle.due.store(0, Ordering::Relaxed);
        }
    }

    /// Whether idle chunks wait for their decay and the first is due (cheap when none wait).
    #[inline]
    pub(super) fn decay_is_due(&self) -> bool {
        let due = self.idle.due.load(Ordering::Relaxed);
        due != 0 && epoch_ms(std::time::Instant::now()) >= due
    }
    /// Whether the pool held more free memory than `retain` allows at its last look, with
    /// nothing it could give back (see `enforce_retain`).
    #[inline]
    pub(crate) fn over_retain(&self) -> bool {
        self.retention.over.load(Ordering::Relaxed)
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
        if self.retention.over.load(Ordering::Relaxed) != over {
            self.retention.over.store(over, Ordering::Relaxed);
        }
    }
    /// Return every cached byte that can be returned, whichever thread cached it: thread
    /// caches go back to their slabs, empty slabs to the spans, the exact-size list to the
    /// free set, and wholly free chunks to the backing. Returns the bytes given back to the
    /// backing meanwhile.
    pub fn trim(&'static self) -> usize {
        let before = self.retention.unmapped.load(Ordering::Relaxed);
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
        self.retention.unmapped.load(Ordering::Relaxed) - before
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
