//! The registry's entries: decoding the descriptor an address points to, and the entry points
//! that start from an address alone (free, the thread-cache fast paths, lookup), lock-free up
//! to the pool that owns the block.

use super::types::{BlockInfo, Pool, Slab, Span, TAG_MASK, TAG_SLAB, TAG_SPAN};
use crate::error::{Error, Result};
use crate::registry;
use std::sync::atomic::Ordering;

/// Descriptor a registry entry points at.
#[derive(Clone, Copy)]
pub enum Entry {
    Span(&'static Span),
    Slab(&'static Slab),
}

/// Decode a registry entry.
#[inline]
pub fn entry_at(addr: usize) -> Option<Entry> {
    let e = registry::get(addr);
    let p = e & !TAG_MASK;
    if p == 0 {
        return None;
    }
    // SAFETY: the registry holds only tagged pointers to leaked, never-freed descriptors.
    match e & TAG_MASK {
        TAG_SPAN => Some(Entry::Span(unsafe { &*(p as *const Span) })),
        TAG_SLAB => Some(Entry::Slab(unsafe { &*(p as *const Slab) })),
        _ => None,
    }
}

impl Entry {
    /// The pool whose descriptor this is.
    #[inline]
    pub fn pool(self) -> &'static Pool {
        match self {
            Entry::Slab(s) => s.pool,
            Entry::Span(sp) => sp.pool,
        }
    }

    /// The live block containing `addr`, if this descriptor (found for `addr`) has one there.
    #[inline]
    pub fn lookup(self, addr: usize) -> Option<BlockInfo> {
        match self {
            Entry::Slab(s) => s.lookup(addr),
            Entry::Span(sp) => sp.lookup(addr),
        }
    }

    /// Free the block starting at `ptr`, this descriptor being the one found for `ptr`.
    /// Returns the bytes it held. Errors leave everything as it was.
    #[inline]
    pub fn free(self, ptr: usize) -> Result<usize> {
        match self {
            Entry::Slab(s) => s.pool.free_small(s, ptr),
            Entry::Span(sp) => {
                let n = sp.pool.free_large(sp, ptr)?;
                sp.pool.stats.frees.fetch_add(1, Ordering::Relaxed);
                sp.pool.stats.sub_in_use(n);
                if sp.pool.over_retain() {
                    sp.pool.release_pinning();
                }
                Ok(n)
            }
        }
    }
}

/// Free the block starting at `ptr`, whichever pool it belongs to (one registry lookup).
/// Returns the bytes it held. Errors leave everything as it was.
#[inline]
pub fn free_block(ptr: usize) -> Result<usize> {
    match entry_at(ptr) {
        Some(e) => e.free(ptr),
        None => Err(Error::not_ours(format!(
            "{ptr:#x} was not allocated by ump-alloc"
        ))),
    }
}

/// The host side's small-block free fast path: free the block at `ptr` into this thread's
/// cache when it is a slot of a pool this thread caches for. None: not handled, nothing
/// changed (use `free_block`); else what `free_block` would give.
#[inline(always)]
pub fn free_cached(ptr: usize) -> Option<Result<usize>> {
    match entry_at(ptr)? {
        Entry::Slab(s) => s.pool.free_cached(s, ptr),
        Entry::Span(_) => None,
    }
}

/// The host side's realloc fast path: the small block at `ptr` resized in place to `n` bytes
/// when `n` falls in its size class, counted in this thread's cache of its pool. None: not
/// handled, nothing changed (use the full realloc).
#[inline(always)]
pub fn resize_cached(ptr: usize, n: usize) -> Option<usize> {
    match entry_at(ptr)? {
        Entry::Slab(s) => s.pool.resize_cached(s, ptr, n),
        Entry::Span(_) => None,
    }
}

/// The pool whose memory holds `addr` (live block or cached), if any. Lock-free.
pub fn pool_at(addr: usize) -> Option<&'static Pool> {
    entry_at(addr).map(Entry::pool)
}

/// Find the live block containing `addr` (any pool). Lock-free.
#[inline]
pub fn lookup(addr: usize) -> Option<BlockInfo> {
    entry_at(addr)?.lookup(addr)
}
