//! The retention part of a pool: the bound on the free memory it keeps in forms that could go
//! back to the backing (`retain`, see the module docs of `pool`), the bytes of wholly free slabs
//! it keeps for reuse (part of what the bound covers), whether it was over the bound with
//! nothing it could give back at its last look, and the bytes it gave back so far.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub(crate) struct Retention {
    bound: usize,
    kept_slabs: AtomicUsize,
    /// Free spans sit in chunks that something pins (`enforce_retain`). A slot cached by a
    /// thread whose slab holds no live block may be what pins one (see `tcache`).
    over: AtomicBool,
    /// What `trim` reports.
    unmapped: AtomicUsize,
}

impl Retention {
    pub(crate) fn new(bound: usize) -> Retention {
        Retention {
            bound,
            kept_slabs: AtomicUsize::new(0),
            over: AtomicBool::new(false),
            unmapped: AtomicUsize::new(0),
        }
    }

    /// The `retain` bound in bytes.
    #[inline]
    pub(crate) fn bound(&self) -> usize {
        self.bound
    }

    /// Bytes of wholly free slabs kept for reuse.
    #[inline]
    pub(crate) fn kept_slabs(&self) -> usize {
        self.kept_slabs.load(Ordering::Relaxed)
    }

    /// A wholly free slab of `bytes` is kept.
    #[inline]
    pub(crate) fn keep_slab(&self, bytes: usize) {
        self.kept_slabs.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Kept slabs of `bytes` in all are in use again or gone back.
    #[inline]
    pub(crate) fn unkeep_slabs(&self, bytes: usize) {
        self.kept_slabs.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// `n` bytes went back to the backing.
    #[inline]
    pub(crate) fn note_unmapped(&self, n: usize) {
        self.unmapped.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes given back to the backing so far.
    pub(crate) fn unmapped(&self) -> usize {
        self.unmapped.load(Ordering::Relaxed)
    }

    /// Whether the pool was over the bound with nothing to give back at its last look.
    #[inline]
    pub(crate) fn is_over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    pub(crate) fn set_over(&self, over: bool) {
        if self.over.load(Ordering::Relaxed) != over {
            self.over.store(over, Ordering::Relaxed);
        }
    }
}
