//! Blocks held back for `fork()` children: a pool over pages shared with fork children
//! (`Backing::fork_shared`, the pinned host side: see `backing::shared`) must not reuse a
//! block that was live at a fork while a child of that fork may still read it, for the
//! parent's next writes there would show in the child's view of the old block.
//!
//! - Every large block and every slab is stamped with the fork *generation* it was allocated
//!   in (`birth_gen`; `NEVER` in pools whose pages fork copies). A block of generation `g` was
//!   live at every fork after `g`, so while `g < shared::live_max()` its free **holds** it:
//!   out of use, counted in `stats.fork_held`, but not free memory (a large block's span is in
//!   state `SPAN_HELD`; a slab slot stays out of its slab, so its slab stays too).
//! - Slabs follow a per-slab rule (a slot's own generation is not kept): a slab's stamp is
//!   renewed whenever its last slot out comes back, so a slab holds back frees only if it had
//!   blocks out at a fork a child of which may live (or was emptied before that fork and used
//!   again after it). That bounds what a long life of children holds back by the slabs in use
//!   at their forks.
//! - Held blocks go back (`release_held`) once the children's locks say no child that may
//!   read them lives: looked at when the pool needs a span (a large block or a new slab) at
//!   most every few milliseconds, and at once by `trim` and the statistics.
//!
//! While no child may live (`live_max() == 0`), a free costs one relaxed load more.

use super::types::{Large, NEVER, Pool, SPAN_HELD, Slab, Span};
use crate::backing::shared;
use crate::error::Result;
use crate::prim::fork::lock;
use std::sync::atomic::Ordering;

impl Pool {
    /// The generation a block (or slab) allocated now belongs to.
    #[inline]
    pub(super) fn birth_gen(&self) -> u64 {
        if self.hold.is_on() {
            shared::generation()
        } else {
            NEVER
        }
    }

    /// Whether blocks freed by this pool are held back for fork children (its pages are
    /// shared with them). `false` turns it off: for tests that show what it prevents.
    pub fn set_fork_hold(&self, on: bool) {
        self.hold.set_on(on && self.backing.fork_shared());
    }

    /// Hold used span `sp` (its free was validated, under the large lock) instead of freeing it.
    pub(super) fn hold_span(&'static self, lg: &mut Large, sp: &'static Span) {
        sp.state.store(SPAN_HELD, Ordering::Release);
        lg.hold(sp);
        self.stats.on_hold(sp.len());
    }

    /// Hold slot `idx` of slab `s` (its word already cleared by a free of `n` bytes) instead of
    /// returning it to its slab.
    #[cold]
    pub(super) fn hold_slot(&'static self, s: &'static Slab, idx: u32, n: usize) -> Result<usize> {
        {
            // Counted before another thread can see it on the list (and give it back).
            let mut st = lock(&self.classes[s.class]);
            self.stats.on_hold(s.slot);
            st.hold((s, idx));
        }
        self.stats.frees.fetch_add(1, Ordering::Relaxed);
        self.stats.sub_in_use(n);
        Ok(n)
    }

    /// If blocks are held and the children's locks are due to be looked at, give back those
    /// no child may read any more. Called with no lock of this pool held.
    #[inline]
    pub(super) fn release_held_if_due(&'static self) {
        if self.stats.fork_held_blocks.load(Ordering::Relaxed) != 0 {
            self.release_held(false);
        }
    }

    /// Give back the held blocks no child may read any more (`force`: look at the children's
    /// locks now, else at most every few milliseconds). Returns the bytes given back.
    pub fn release_held(&'static self, force: bool) -> usize {
        if self.stats.fork_held_blocks.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        // Lowers `live_max` where children have gone. The value it returns is not used: a
        // fork may come between this call and the locks below and raise `live_max` for blocks
        // held since (a stale value would hand them back while that child reads them). Under a
        // lock of this pool no fork can begin (fork's prepare takes them all before it opens a
        // generation), so `live_max` read under it holds until the lock is dropped.
        shared::refresh(force);
        // A block was held because `live_max` was above its generation; only a drop of
        // `live_max` since the last look can have freed one.
        let drops = shared::drops();
        if !self.hold.drops_changed(drops) && !force {
            return 0;
        }
        let still = |born: u64| born < shared::live_max();
        let mut freed = 0;
        {
            let mut lg = lock(&self.large);
            for sp in lg.take_unheld(still) {
                let len = sp.len();
                self.stats.on_unhold(len);
                freed += len;
                self.put_back(&mut lg, sp);
            }
        }
        for ci in 0..self.classes.len() {
            let go = lock(&self.classes[ci]).take_unheld(still);
            if go.is_empty() {
                continue;
            }
            for &(s, _) in &go {
                self.stats.on_unhold(s.slot);
                freed += s.slot;
            }
            self.return_slots(ci, go);
        }
        freed
    }
}
