//! The pool: a caching sub-allocator over one backing (RMM's pool adaptor over a resource).
//!
//! - Chunks come from the backing (large, granule-aligned; `chunk`) and are cut into *spans*
//!   (granule multiples) by best fit, with splitting and coalescing. Free spans sit in an
//!   ordered map keyed by (length, address), so finding the best fit costs O(log n) in the
//!   number of free spans, never a scan (`span`).
//! - Over a lazily committed backing (virtual memory), chunks are address space and a span's
//!   pages are committed when it is handed out and purged when no block needs them (`commit`).
//! - Small requests (up to [`SMALL_MAX`]) are served from *slabs*: spans cut into equal slots
//!   of one size class (`class`). Each slab keeps its own free slots and a class keeps the list
//!   of slabs with free slots, so a slab whose last slot comes back is found at once and goes
//!   back to the spans on its own (`slab`). Each thread caches a few free slots per class, so a
//!   cached small alloc+free takes no lock (`tcache`); a small request goes to the cache
//!   first and to the slabs when it has none (`small`).
//! - All bookkeeping lives outside the memory itself (device memory is not host-readable), in
//!   descriptors the registry points to. Descriptors are never freed, only recycled inside
//!   their pool, so lock-free readers (`lookup`) can always dereference what they load, and
//!   then check that the descriptor still describes the address.
//!
//! **What a pool keeps.** `retain` bounds the free memory a pool holds in a form it could give
//! back: wholly free chunks, the exact-size list and wholly free slabs. Past it, memory goes
//! back to the backing as it is freed. Free space inside partly used chunks and slabs is kept
//! (it cannot go back without moving live blocks); thread caches are bounded on their own.
//!
//! **Locks** (each a `std::sync::Mutex`, never held across a call into another pool unless
//! this order allows it): a class lock, then the large lock, then `retire_event`. `fork`
//! takes them all in that order (every pool's class locks, then every pool's large lock, ...).
//!
//! The files, bottom up: the parts that own their state (`parts/`), the size classes (`class`)
//! and the counters (`stats`); the data model (`types`: the pool, its descriptors and books);
//! then what is done with it: decoding the registry's entries and the entry points by address
//! (`entry`), making a pool and what it is (`make`), its blocks in and out (`blocks`), spans,
//! chunks and slabs (`span/`, `chunk`, `slab`, `small`, `tcache/`), lazy commitment
//! (`commit`), realloc in place (`grow`), fork-hold (`hold`), managed residency
//! (`residency`), what it keeps and gives back (`retain`) and what it reports (`report`). This
//! file only names what the rest of the crate uses.

mod blocks;
mod chunk;
mod class;
mod commit;
mod entry;
mod grow;
mod hold;
mod make;
mod parts;
mod report;
mod residency;
mod retain;
mod slab;
mod small;
mod span;
pub mod stats;
mod tcache;
mod types;

pub use class::ClassTable;
pub(crate) use class::SMALL_MAX;
pub use entry::{Entry, entry_at, free_block, free_cached, lookup, pool_at, resize_cached};
pub use residency::mark_away;
pub use stats::PoolStats;
pub use tcache::flush_thread_counts;
pub(crate) use tcache::{
    fork_child as tcache_fork_child, fork_parent as tcache_fork_parent,
    fork_prepare as tcache_fork_prepare, register_membarrier_if_alone,
};
pub use types::{Alloc, BlockInfo, Fence, Group, Limit, Pool, PoolReport};

/// The host side's small-block fast path: `n` bytes (counted in use) from this thread's cache
/// of the host side's primary pool, if it holds a slot of `n`'s class; None sends the caller
/// to the full path (no cache yet, another pool's cache, an empty bin, a large request).
#[inline(always)]
pub fn alloc_cached(n: usize) -> Option<usize> {
    if n > SMALL_MAX {
        return None;
    }
    tcache::alloc_primary(n)
}

#[cfg(test)]
mod tests;
