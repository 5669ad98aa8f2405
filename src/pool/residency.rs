//! Managed-memory residency of the device side's stream pools (CUDA 13 drivers,
//! `UMP_ALLOC_MANAGED_DISCARD`):
//!
//! - A freed block whose pages may be away from its device (the host read it, see
//!   [`mark_away`]; or the device's managed memory is oversubscribed, so the driver may have
//!   evicted them) is *discarded*: its contents are dead, so neither an eviction nor its next
//!   use migrates them. Discards wait in a batch per pool (one driver call for many blocks),
//!   issued in the pool's stream order before any of its memory is handed out again, before a
//!   chunk falls idle (its idle event then covers them), at retire and on trim.
//! - A block handed out over pages that may be away is discarded-and-prefetched to the device
//!   on the pool's stream: populated there with no data moved. Measured on the lent H100
//!   (2026-11-24): a GPU write to 1 GiB of discarded pages that were not prefetched took about
//!   2 s (every page faults), discard-and-prefetch then the write 2.1-2.4 ms.
//! - Blocks that never left the device (the common case) cost nothing: no call is made.
//! - A span that reads as zero is never discarded (calloc relies on it).

use super::entry::{Entry, entry_at};
use super::types::{Large, Pool, SPAN_USED, Span};
use crate::backing::Kind;
use std::sync::atomic::Ordering;

/// Blocks below this are not worth a driver call (a large page).
pub(crate) const DISCARD_MIN: usize = 2 << 20;
/// A batch is issued once it holds this many blocks or bytes.
const BATCH_MAX: usize = 32;
const BATCH_BYTES: usize = 1 << 30;

/// The block of ours that starts at or contains `ptr`, handed to the host: from now on its
/// pages may be away from its device. Host-side pools and small blocks are left alone.
pub fn mark_away(ptr: usize, size: usize) {
    if let Some(Entry::Span(sp)) = entry_at(ptr)
        && sp.state.load(Ordering::Acquire) == SPAN_USED
        && ptr + size <= sp.start() + sp.len()
        && sp.pool.is_stream_ordered()
    {
        sp.away.store(true, Ordering::Relaxed);
    }
}

impl Pool {
    /// Whether this pool discards (managed memory of a stream pool whose stream is alive).
    fn discards(&self) -> bool {
        self.group.is_some_and(|g| g.discard()) && !self.is_retired()
    }

    /// `sp`, a used span, is being freed (before it joins the free set or the list).
    pub(super) fn discard_on_free(&'static self, lg: &mut Large, sp: &Span) {
        if !self.discards() {
            return;
        }
        if self.group.is_some_and(|g| g.oversubscribed()) {
            sp.away.store(true, Ordering::Relaxed);
        }
        let len = sp.len();
        if sp.away.load(Ordering::Relaxed) && sp.dirty.load(Ordering::Relaxed) && len >= DISCARD_MIN
        {
            lg.discards.push(sp.start(), len);
            if lg.discards.reaches(BATCH_MAX, BATCH_BYTES) {
                self.flush_discards(lg);
            }
        }
    }

    /// Issue the batch of discards on the pool's stream.
    pub(super) fn flush_discards(&'static self, lg: &mut Large) {
        if lg.discards.is_empty() {
            return;
        }
        let (ranges, bytes) = lg.discards.take();
        if !self.discards() {
            return;
        }
        for &(a, n) in &ranges {
            crate::migrate::quiesce(a, a + n);
        }
        // SAFETY: every range is free memory of this pool (a range handed out again was taken
        // out of the batch first), and the batch runs in its stream's order, after the work
        // queued before the frees.
        let Some(g) = self.group else { return };
        match unsafe { g.queue_discard(&ranges, self.stream()) } {
            Ok(true) => {
                self.stats
                    .discarded
                    .fetch_add(bytes as u64, Ordering::Relaxed);
            }
            Ok(false) => {}
            // Advice that failed leaves correct memory: say why, count nothing.
            Err(e) => crate::error::set_last(&format!("managed discard: {}", e.msg)),
        }
    }

    /// Drop the batch's ranges inside `[a, b)` without issuing them (memory that goes back to
    /// the driver).
    pub(super) fn forget_discards(&self, lg: &mut Large, a: usize, b: usize) {
        lg.discards.forget(a, b);
    }

    /// Take `[a, b)` out of the batch (memory handed out again), cutting ranges that overlap
    /// it.
    fn unqueue_discards(&self, lg: &mut Large, a: usize, b: usize) {
        lg.discards.cut(a, b);
    }

    /// `[a, b)`, free memory, joins a live block that grows over it (realloc in place): out of
    /// the batch (a discard issued later would drop the block's contents there) and of the
    /// background migrations.
    pub(super) fn residency_on_grow(&'static self, lg: &mut Large, a: usize, b: usize) {
        self.unqueue_discards(lg, a, b);
        if self.kind == Kind::UMP_KIND_MANAGED {
            crate::migrate::quiesce(a, b);
        }
    }

    /// `taken` (just cut from free memory) is being handed out: the batch goes out without its
    /// range, and if its pages may be away it is discarded-and-prefetched to the device.
    pub(super) fn residency_on_take(&'static self, lg: &mut Large, taken: &Span) {
        if !self.discards() {
            return;
        }
        let (a, b) = (taken.start(), taken.start() + taken.len());
        self.unqueue_discards(lg, a, b);
        self.flush_discards(lg);
        if !taken.away.swap(false, Ordering::Relaxed) {
            return;
        }
        crate::migrate::quiesce(a, b);
        // SAFETY: the block is not handed out yet; the call runs in the stream order of the
        // work that will use it.
        let Some(g) = self.group else { return };
        match unsafe { g.queue_populate(a, b - a, self.stream()) } {
            Ok(true) => {
                self.stats
                    .discarded
                    .fetch_add((b - a) as u64, Ordering::Relaxed);
            }
            // No batch call in this driver: the pages were prefetched in one go.
            Ok(false) => {}
            Err(e) => crate::error::set_last(&format!("managed discard-and-prefetch: {}", e.msg)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::HostBacking;
    use crate::pool::entry::lookup;
    use crate::prim::fork::lock;
    use crate::stream::StreamPools;

    const MB: usize = 1 << 20;

    fn group(device_memory: usize) -> &'static StreamPools {
        let stats = Box::leak(Box::new(crate::pool::stats::PoolStats::default()));
        let g = StreamPools::new(
            0,
            Box::new(|| Box::new(HostBacking::for_device(Kind::UMP_KIND_SYSTEM, 0))),
            512,
            None,
            usize::MAX,
            false,
            stats,
        );
        g.set_managed_discard(true, device_memory);
        g
    }

    fn batch(p: &Pool) -> Vec<(usize, usize)> {
        lock(&p.large).discards.ranges().to_vec()
    }

    #[test]
    fn freed_blocks_the_host_read_are_batched_and_reuse_takes_them_out() {
        let g = group(0);
        let p = g.pool_for(0x10).unwrap();
        let keep = p.alloc(MB).unwrap().ptr; // keeps the arena from falling idle
        let a = p.alloc(8 * MB).unwrap().ptr;
        let b = p.alloc(8 * MB).unwrap().ptr;
        let small = p.alloc(MB).unwrap().ptr;
        mark_away(a + 100, 1000);
        mark_away(small, MB);
        p.free(b).unwrap();
        p.free(a).unwrap();
        p.free(small).unwrap();
        assert_eq!(
            batch(p),
            vec![(a, 8 * MB)],
            "only a: read by the host and large enough"
        );
        // A new block over a's pages: out of the batch (the batch goes out without it), and
        // the block is no longer away once handed out.
        let c = p.alloc(8 * MB).unwrap().ptr;
        assert!(
            batch(p).is_empty(),
            "the batch is issued before memory is handed out"
        );
        if let Some(Entry::Span(sp)) = entry_at(c) {
            assert!(!sp.away.load(Ordering::Relaxed));
        }
        for x in [c, keep] {
            p.free(x).unwrap();
        }
        g.trim();
    }

    /// Issue 21, defect 5: realloc growing a block over its freed neighbour, whose discard was
    /// queued, left (x, 8 MiB) in the batch inside the grown live block: the next flush would
    /// have discarded live contents. Handing memory out by growth takes it out of the batch,
    /// as an allocation does.
    #[test]
    fn a_block_grown_over_a_freed_neighbour_takes_it_out_of_the_batch() {
        let g = group(0);
        let p = g.pool_for(0x40).unwrap();
        let keep = p.alloc(MB).unwrap().ptr; // keeps the arena from falling idle
        let x = p.alloc(8 * MB).unwrap().ptr;
        let y = p.alloc(8 * MB).unwrap().ptr;
        assert_eq!(
            y + 8 * MB,
            x,
            "stream pools cut blocks from the end of free memory"
        );
        mark_away(x, 8 * MB);
        p.free(x).unwrap();
        assert_eq!(batch(p), vec![(x, 8 * MB)], "x is queued for discard");
        let info = lookup(y).unwrap();
        assert_eq!(p.resize_in_place(&info, 16 * MB), Some(y), "y grows over x");
        let live = (y, y + 16 * MB);
        assert!(
            batch(p)
                .iter()
                .all(|&(s, n)| s + n <= live.0 || s >= live.1),
            "a pending discard {:x?} lies inside the live block {live:x?}",
            batch(p)
        );
        // x's pages may be away: the grown block is known to be away too (a free discards it).
        if let Some(Entry::Span(sp)) = entry_at(y) {
            assert!(sp.away.load(Ordering::Relaxed));
        }
        for b in [y, keep] {
            p.free(b).unwrap();
        }
        g.trim();
    }

    #[test]
    fn an_oversubscribed_device_discards_every_large_free() {
        let g = group(4 * MB); // "device memory" smaller than what is mapped
        let p = g.pool_for(0x20).unwrap();
        let keep = p.alloc(MB).unwrap().ptr;
        let a = p.alloc(4 * MB).unwrap().ptr;
        p.free(a).unwrap();
        assert_eq!(batch(p), vec![(a, 4 * MB)]);
        p.free(keep).unwrap();
        g.trim();
        assert!(batch(p).is_empty());
    }

    #[test]
    fn no_discard_without_the_switch_or_on_a_retired_stream() {
        let g = group(0);
        g.set_managed_discard(false, 0);
        let p = g.pool_for(0x30).unwrap();
        let a = p.alloc(4 * MB).unwrap().ptr;
        mark_away(a, 4 * MB);
        p.free(a).unwrap();
        assert!(batch(p).is_empty());
        g.set_managed_discard(true, 0);
        let b = p.alloc(4 * MB).unwrap().ptr;
        mark_away(b, 4 * MB);
        assert!(g.retire(0x30));
        p.free(b).unwrap();
        assert!(
            batch(p).is_empty(),
            "a retired stream's handle is never used again"
        );
        g.trim();
    }
}
