//! A pool's blocks in and out: allocate (small from slabs, large as spans, or a chunk of its
//! own), free, and resize in place.

use super::class::SMALL_MAX;
use super::entry::{Entry, entry_at, free_block, pool_at};
use super::types::{Alloc, BlockInfo, MAX_REQUEST, Pool};
use crate::error::{Error, Result};
use crate::registry::GRANULE;
use std::sync::atomic::Ordering;

impl Pool {
    /// Allocate `n` bytes (0 is allowed and yields a unique block).
    #[inline]
    pub fn alloc(&'static self, n: usize) -> Result<Alloc> {
        if n > MAX_REQUEST {
            return Err(Error::bad_size(format!(
                "size {n} is too large (the limit is {MAX_REQUEST})"
            )));
        }
        if n <= SMALL_MAX {
            self.alloc_small(n)
        } else {
            let a = self.alloc_large(n)?;
            self.stats.allocs.fetch_add(1, Ordering::Relaxed);
            self.stats.add_in_use(n);
            Ok(a)
        }
    }

    /// Allocate `n` bytes (more than [`SMALL_MAX`]) as a whole chunk of its own, exactly as
    /// long as the request rounded to the granule: its start is the start of what the backing
    /// mapped. CUDA IPC exports a driver allocation whole (a handle opens at the allocation's
    /// base), so a block shared between processes must be an allocation of its own.
    pub fn alloc_whole(&'static self, n: usize) -> Result<Alloc> {
        if n > MAX_REQUEST || n <= SMALL_MAX {
            return Err(Error::bad_size(format!(
                "size {n} is outside {}..={MAX_REQUEST} for a chunk of its own",
                SMALL_MAX + 1
            )));
        }
        let span = self.take_whole(n.next_multiple_of(GRANULE), n)?;
        let zeroed = !span.dirty.swap(true, Ordering::Relaxed);
        self.stats.allocs.fetch_add(1, Ordering::Relaxed);
        self.stats.add_in_use(n);
        Ok(Alloc {
            ptr: span.start(),
            zeroed,
        })
    }

    /// Free the block starting at `ptr`. Errors leave everything as it was.
    pub fn free(&'static self, ptr: usize) -> Result<usize> {
        match pool_at(ptr) {
            Some(p) if std::ptr::eq(p, self) => free_block(ptr),
            _ => Err(Error::not_ours(format!(
                "{ptr:#x} was not allocated by this pool"
            ))),
        }
    }
    /// Resize without copying: a small block whose class still fits `n`, a large block whose
    /// span shrinks or grows (see `grow`). Returns where the block is now (a large block on
    /// plain host memory may move with its pages, no byte copied), or None when resizing needs
    /// a copy (nothing changed then).
    pub fn resize_in_place(&'static self, info: &BlockInfo, n: usize) -> Option<usize> {
        if n > MAX_REQUEST {
            return None; // refused by the allocation the caller falls back to
        }
        match entry_at(info.base)? {
            Entry::Slab(s) => {
                // realloc frees the old block: one a fork child may read moves (`hold`).
                let fits = n <= info.capacity
                    && n <= SMALL_MAX
                    && self.table.class_of(n) == s.class
                    && !s.held_for_children();
                if fits && s.resize(info.base, n) {
                    self.stats.on_resize(info.size, n);
                    return Some(info.base);
                }
                None
            }
            Entry::Span(sp) if n > SMALL_MAX => self.resize_large(sp, info.base, n),
            Entry::Span(_) => None,
        }
    }
}
