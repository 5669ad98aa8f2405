//! The fork-hold part of a pool: whether its freed blocks are held back for fork children (its
//! pages are shared with them), and when the held ones were last looked at (the rules are the
//! pool's `hold.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub(crate) struct ForkHold {
    /// Freed blocks a fork child may still read are held back.
    on: AtomicBool,
    /// `shared::drops()` when the held blocks were last looked at: none can go back before it
    /// changes.
    seen: AtomicU64,
}

impl ForkHold {
    pub(crate) fn new(on: bool) -> ForkHold {
        ForkHold {
            on: AtomicBool::new(on),
            seen: AtomicU64::new(0),
        }
    }

    /// Whether freed blocks are held back.
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub(crate) fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// The children's locks were looked at with `drops` drops so far: whether that changed
    /// since the last look.
    pub(crate) fn drops_changed(&self, drops: u64) -> bool {
        self.seen.swap(drops, Ordering::AcqRel) != drops
    }
}
