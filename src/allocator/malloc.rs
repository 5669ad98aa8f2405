//! The host malloc family (NumPy's contract, the C `ump_malloc` family): malloc, calloc,
//! realloc and free over the host side's pools, with their thread-cache fast paths.

use super::blocks::{block_at, deferred_twice};
use super::init::{get, instance};
use crate::error::{Error, Result};
use crate::pool;
use crate::prim::os;
use std::sync::atomic::Ordering;

/// malloc's fast path: a small block from this thread's cache of the host side's primary pool
/// (the host side serves small blocks from it first), when no scope is open; None: use
/// [`malloc`].
#[inline(always)]
pub fn malloc_cached(n: usize) -> Option<usize> {
    if crate::scope::any_open() {
        return None;
    }
    pool::alloc_cached(n)
}

/// malloc: `n` bytes, aligned; 0 yields a unique block.
#[inline]
pub fn malloc(n: usize) -> Result<usize> {
    let ptr = instance()?.host.alloc(n)?.ptr;
    crate::scope::on_alloc(ptr, n);
    Ok(ptr)
}

/// calloc: zeroed `nelem * elsize` bytes; overflow is an error (ENOMEM at the C layer).
pub fn calloc(nelem: usize, elsize: usize) -> Result<usize> {
    let n = nelem
        .checked_mul(elsize)
        .ok_or_else(|| Error::bad_size(format!("{nelem} * {elsize} bytes overflows")))?;
    let a = instance()?.host.alloc(n)?;
    if !a.zeroed && n > 0 {
        // SAFETY: host-accessible block of at least n bytes, just allocated.
        unsafe { std::ptr::write_bytes(a.ptr as *mut u8, 0, n) };
    }
    crate::scope::on_alloc(a.ptr, n);
    Ok(a.ptr)
}

/// The alignment a host-side block of `n` bytes gets: the configured alignment, or for a block
/// smaller than it, the natural alignment of its size class (see `pool::class`).
pub fn block_alignment(n: usize) -> Result<usize> {
    let t = instance()?.host_pool().classes();
    Ok(if n <= crate::pool::SMALL_MAX {
        t.alignment_of(t.class_of(n))
    } else {
        t.alignment_of(t.len() - 1)
    })
}

/// realloc's fast path: a small block of a host pool that keeps its size class is resized in
/// place, counted in this thread's cache, when no scope is open. None: use [`realloc`].
#[inline(always)]
pub fn realloc_cached(ptr: usize, n: usize) -> Option<usize> {
    if crate::scope::any_open() {
        return None;
    }
    pool::resize_cached(ptr, n)
}

/// realloc: contents kept up to the smaller size, alignment kept; on failure the old block
/// stays valid. `ptr == 0` is malloc.
pub fn realloc(ptr: usize, n: usize) -> Result<usize> {
    if ptr == 0 {
        return malloc(n);
    }
    let info = block_at(ptr)?;
    if !info.pool.kind().host_accessible() {
        return Err(Error::invalid(format!(
            "{ptr:#x} is device memory; the host cannot reallocate it"
        )));
    }
    let stats = info.pool.stats;
    let ordered = info.pool.is_stream_ordered();
    if let Some(at) = info.pool.resize_in_place(&info, n) {
        if ordered && n > info.size {
            // The block may have grown over memory freed in its stream's order: the caller
            // writes it from the host once realloc returns.
            info.pool.host_wait();
        }
        crate::scope::on_resize(ptr, at, n);
        stats.reallocs_in_place.fetch_add(1, Ordering::Relaxed);
        return Ok(at);
    }
    let new = if ordered {
        // A retired stream's handle is never used again: the new block is the legacy default
        // stream's, which orders with every blocking stream.
        let pool = match get().and_then(|a| a.group_of(info.pool)) {
            Some(g) if info.pool.is_retired() => g.pool_for(0)?,
            _ => info.pool,
        };
        let new = pool.alloc(n)?.ptr;
        // The copy below writes it from the host.
        pool.host_wait();
        new
    } else {
        instance()?.host.alloc(n)?.ptr
    };
    let kept = info.size.min(n);
    // SAFETY: both blocks are host-accessible, distinct, and at least this long.
    unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, kept) };
    crate::scope::on_resize(ptr, new, n);
    info.pool.free(ptr)?;
    stats.reallocs_copied.fetch_add(1, Ordering::Relaxed);
    stats
        .realloc_copied_bytes
        .fetch_add(kept as u64, Ordering::Relaxed);
    Ok(new)
}

/// free's fast path: a small block of a host pool back into this thread's cache, when no scope
/// is open (host blocks are never deferred: that is device memory). None: use [`free`].
#[inline(always)]
pub fn free_cached(ptr: usize) -> Option<Result<()>> {
    if crate::scope::any_open() {
        return None;
    }
    pool::free_cached(ptr).map(|r| r.map(|_| ()))
}

/// free: any live block of ours; `ptr == 0` is a no-op.
#[inline]
pub fn free(ptr: usize) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    if crate::stream::any_deferred() {
        refuse_deferred(ptr)?;
    }
    // Before the free: once freed, another thread may get the same address.
    crate::scope::on_free(ptr);
    pool::free_block(ptr).map(|_| ())
}

/// A block whose free waits for other streams was freed already: another free is a double free.
#[cold]
fn refuse_deferred(ptr: usize) -> Result<()> {
    let deferred = pool::lookup(ptr)
        .filter(|i| i.pool.is_stream_ordered())
        .and_then(|i| get().and_then(|a| a.group_of(i.pool)))
        .is_some_and(|g| g.is_deferred(ptr));
    if deferred {
        return Err(deferred_twice(ptr));
    }
    Ok(())
}

/// Set errno to ENOMEM (the malloc family's way of saying why NULL came back).
pub fn set_enomem() {
    os::set_errno(libc::ENOMEM);
}
