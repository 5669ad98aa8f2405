//! NumPy's contract, through the `numpy_allocator` package: C-linkage aligned malloc, calloc,
//! realloc and free with exactly the signatures NumPy's `PyDataMem_Handler` calls (no context
//! argument). Also usable as a plain aligned C allocator.

use super::guard;
use crate::allocator;
use crate::error;
use std::ffi::c_void;
use std::ptr::null_mut;

#[inline(always)]
fn out(name: &str, r: crate::error::Result<usize>) -> *mut c_void {
    match r {
        Ok(p) => p as *mut c_void,
        Err(e) => {
            allocator::set_enomem();
            error::report(&e.context(name));
            null_mut()
        }
    }
}

/// Allocate `size` bytes aligned to the configured alignment (512 by default). `size == 0`
/// returns a unique pointer that must be freed. Returns NULL (errno ENOMEM, message in
/// `ump_last_error()`) when memory or the configuration fails.
#[unsafe(no_mangle)]
pub extern "C" fn ump_malloc(size: usize) -> *mut c_void {
    guard("ump_malloc", || match allocator::malloc_cached(size) {
        Some(p) => p as *mut c_void,
        None => malloc_full(size),
    })
}

/// `ump_malloc` past its fast path (kept out of line, so the fast path's frame stays small).
#[cold]
#[inline(never)]
fn malloc_full(size: usize) -> *mut c_void {
    out("ump_malloc", allocator::malloc(size))
}

/// Allocate `nelem * elsize` zeroed bytes, aligned. Returns NULL with errno ENOMEM when the
/// product overflows or memory fails.
#[unsafe(no_mangle)]
pub extern "C" fn ump_calloc(nelem: usize, elsize: usize) -> *mut c_void {
    guard("ump_calloc", || {
        out("ump_calloc", allocator::calloc(nelem, elsize))
    })
}

/// Resize the block at `ptr` to `new_size` bytes, keeping its contents (up to the smaller size)
/// and its alignment. `ptr == NULL` behaves as `ump_malloc`. On failure returns NULL and the
/// old block stays valid and unchanged. A pointer this library did not allocate is refused
/// (NULL, error counted) and left alone. The old block is freed like any other: where a
/// `fork()` child may still read it (pinned pages shared with children), it is never resized
/// in place but moves, and is held back while such a child lives.
#[unsafe(no_mangle)]
pub extern "C" fn ump_realloc(ptr: *mut c_void, new_size: usize) -> *mut c_void {
    guard("ump_realloc", || {
        match allocator::realloc_cached(ptr as usize, new_size) {
            Some(p) => p as *mut c_void,
            None => realloc_full(ptr as usize, new_size),
        }
    })
}

/// `ump_realloc` past its fast path (out of line, as `malloc_full`).
#[cold]
#[inline(never)]
fn realloc_full(ptr: usize, new_size: usize) -> *mut c_void {
    out("ump_realloc", allocator::realloc(ptr, new_size))
}

/// Free the block at `ptr`. `size` is the size NumPy allocated; it is not needed and not
/// trusted. `ptr == NULL` is a no-op. A foreign pointer, an interior pointer or a double free
/// is ignored, counted, and described by `ump_last_error()`; nothing is corrupted.
#[unsafe(no_mangle)]
pub extern "C" fn ump_free(ptr: *mut c_void, size: usize) {
    guard("ump_free", || {
        let _ = size;
        match allocator::free_cached(ptr as usize) {
            Some(Ok(())) => {}
            Some(Err(e)) => free_failed(e),
            None => free_full(ptr as usize),
        }
    })
}

/// `ump_free` past its fast path (kept out of line, as `malloc_full`).
#[cold]
#[inline(never)]
fn free_full(ptr: usize) {
    if let Err(e) = allocator::free(ptr) {
        free_failed(e);
    }
}

#[cold]
#[inline(never)]
fn free_failed(e: error::Error) {
    error::report(&e.context("ump_free"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malloc_family_roundtrip() {
        let p = ump_malloc(1000);
        assert!(!p.is_null());
        assert_eq!(
            p as usize % crate::allocator::instance().unwrap().alignment,
            0
        );
        let q = ump_realloc(p, 100_000);
        assert!(!q.is_null());
        ump_free(q, 100_000);
        let z = ump_calloc(10, 10);
        // SAFETY: 100 bytes just allocated.
        assert!(
            unsafe { std::slice::from_raw_parts(z as *const u8, 100) }
                .iter()
                .all(|&b| b == 0)
        );
        ump_free(z, 100);
        ump_free(null_mut(), 0);
    }

    #[test]
    fn calloc_overflow_sets_enomem() {
        crate::prim::os::set_errno(0);
        assert!(ump_calloc(usize::MAX / 2, 3).is_null());
        // SAFETY: errno slot of this thread.
        assert_eq!(unsafe { *libc::__errno_location() }, libc::ENOMEM);
        assert!(crate::error::last_message().unwrap().contains("overflows"));
    }
}
