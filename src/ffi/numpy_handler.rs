//! NumPy's contract without `numpy_allocator`: NumPy memory handlers (NEP 49) made by the
//! library itself, which Python wraps in a `mem_handler` capsule and hands to
//! `PyDataMem_SetHandler`.
//!
//! - [`ump_numpy_handler`]: the handler that allocates every block from ump-alloc (the
//!   `ump_malloc` family, behind the context argument NEP 49 passes).
//! - [`ump_numpy_dispatch_handler`]: a handler that takes the place of NumPy's *default*
//!   handler, which every thread uses until it sets one of its own (the handler is a context
//!   variable, and a thread starts from an empty context). While switched on
//!   ([`ump_numpy_dispatch_set`]) it allocates from ump-alloc, otherwise from NumPy's own
//!   functions; it frees and resizes each block with the allocator that made it (one registry
//!   lookup), so arrays made before, during and after stay valid. That is how threads that
//!   existed before ump-alloc was enabled (a thread pool, a server's workers) move over too.
//!
//! Both live as long as the library, which is never unloaded while NumPy may free through
//! them.

use super::guard;
use super::numpy::{ump_calloc, ump_free, ump_malloc, ump_realloc};
use crate::allocator;
use crate::error::{self, Error};
use crate::integrations::numpy as dispatch;
use crate::prim::numpy::ump_numpy_allocator;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::{null, null_mut};

/// NumPy's `PyDataMem_Handler` (NEP 49, version 1): a name (127 bytes, so that the allocator
/// starts at byte 128), a version and the allocator functions. Same layout as NumPy's struct, so that a pointer to it can go into a capsule named
/// `"mem_handler"` for `PyDataMem_SetHandler`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ump_numpy_handler {
    /// NUL-terminated name, as `numpy.core.multiarray.get_handler_name()` reports it.
    pub name: [c_char; 127],
    /// NEP 49 handler version: 1.
    pub version: u8,
    /// The functions NumPy calls.
    pub allocator: ump_numpy_allocator,
}

/// A handler in static memory: its pointers are to this library's functions only.
struct Static(ump_numpy_handler);
// SAFETY: read-only after construction; it holds a NULL context and function pointers.
unsafe impl Sync for Static {}

const fn name(s: &str) -> [c_char; 127] {
    let mut out = [0 as c_char; 127];
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && i < 126 {
        out[i] = b[i] as c_char;
        i += 1;
    }
    out
}

static HANDLER: Static = Static(ump_numpy_handler {
    name: name("ump_alloc"),
    version: 1,
    allocator: ump_numpy_allocator {
        ctx: null_mut(),
        malloc: Some(ump_numpy_malloc),
        calloc: Some(ump_numpy_calloc),
        realloc: Some(ump_numpy_realloc),
        free: Some(ump_numpy_free),
    },
});

/// It keeps the name of the handler it takes the place of: it is still NumPy's default handler
/// (the one capsule every context starts from), and NumPy's own suite, like code that checks
/// for the default, asks `get_handler_name()` for `"default_allocator"`. Whose a block is, the
/// identity query tells (`ump_identify`, `ump_alloc.handles`).
static DISPATCH_HANDLER: Static = Static(ump_numpy_handler {
    name: name("default_allocator"),
    version: 1,
    allocator: ump_numpy_allocator {
        ctx: null_mut(),
        malloc: Some(dispatch_malloc),
        calloc: Some(dispatch_calloc),
        realloc: Some(dispatch_realloc),
        free: Some(dispatch_free),
    },
});

/// `ump_malloc` with NEP 49's context argument (ignored). NumPy's handler function.
#[unsafe(no_mangle)]
pub extern "C" fn ump_numpy_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    let _ = ctx;
    ump_malloc(size)
}

/// `ump_calloc` with NEP 49's context argument (ignored). NumPy's handler function.
#[unsafe(no_mangle)]
pub extern "C" fn ump_numpy_calloc(ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    let _ = ctx;
    ump_calloc(nelem, elsize)
}

/// `ump_realloc` with NEP 49's context argument (ignored). NumPy's handler function.
#[unsafe(no_mangle)]
pub extern "C" fn ump_numpy_realloc(
    ctx: *mut c_void,
    ptr: *mut c_void,
    new_size: usize,
) -> *mut c_void {
    let _ = ctx;
    ump_realloc(ptr, new_size)
}

/// `ump_free` with NEP 49's context argument (ignored). NumPy's handler function.
#[unsafe(no_mangle)]
pub extern "C" fn ump_numpy_free(ctx: *mut c_void, ptr: *mut c_void, size: usize) {
    let _ = ctx;
    ump_free(ptr, size)
}

/// NumPy's memory handler over ump-alloc: name `"ump_alloc"`, version 1, NULL context and the
/// `ump_numpy_*` functions. Wrap it in a capsule named `"mem_handler"` and pass that to NumPy's
/// `PyDataMem_SetHandler`. Static: valid for the life of the library. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn ump_numpy_handler() -> *const ump_numpy_handler {
    &HANDLER.0
}

/// The dispatch handler, made to take the place of the handler `fallback` (NumPy's default one,
/// whose name `"default_allocator"` it keeps): put it into NumPy's default handler capsule
/// (`PyCapsule_SetPointer`) and every thread that has not set a handler of its own allocates
/// through it. While `ump_numpy_dispatch_set(true)` is in force its blocks come from ump-alloc,
/// otherwise from `fallback`'s functions; every block is resized and freed by the allocator that
/// made it. `fallback`'s allocator is copied at the first call; later calls must pass the same
/// handler (or the dispatch handler itself). Returns NULL (`UMP_ERR_NULL`, `UMP_ERR_INVALID`
/// for an incomplete handler or one of ours, `UMP_ERR_LOCKED` for another fallback), with the
/// message in `ump_last_error()`.
///
/// # Safety
/// `fallback` is NULL or points to a live NumPy handler whose functions stay valid for the life
/// of the process (NumPy's default handler does).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_numpy_dispatch_handler(
    fallback: *const ump_numpy_handler,
) -> *const ump_numpy_handler {
    const NAME: &str = "ump_numpy_dispatch_handler";
    guard(NAME, || {
        let ours = &DISPATCH_HANDLER.0;
        if fallback.is_null() {
            error::report(
                &Error::new(crate::Status::UMP_ERR_NULL, "fallback is NULL").context(NAME),
            );
            return null();
        }
        if std::ptr::eq(fallback, ours) {
            return ours;
        }
        // SAFETY: non-NULL, and per this function's contract a live handler.
        let theirs = unsafe { (*fallback).allocator };
        // SAFETY: per this function's contract, the handler's functions stay valid for the
        // life of the process (NumPy's default handler's do).
        let refuse =
            unsafe { dispatch::stand_in_for(theirs, &[&HANDLER.0.allocator, &ours.allocator]) }
                .err();
        match refuse {
            Some(e) => {
                error::report(&e.context(NAME));
                null()
            }
            None => ours,
        }
    })
}

/// Switch the dispatch handler's new blocks to ump-alloc (`on`) or back to the handler it
/// stands in for. Blocks already made stay where they are and are freed where they came from.
/// Returns `UMP_OK`, or `UMP_ERR_INVALID` when switching on before
/// `ump_numpy_dispatch_handler` has set it up.
#[unsafe(no_mangle)]
pub extern "C" fn ump_numpy_dispatch_set(on: bool) -> c_int {
    super::status("ump_numpy_dispatch_set", || dispatch::set_dispatch(on))
}

/// Whether the dispatch handler allocates new blocks from ump-alloc now.
#[unsafe(no_mangle)]
pub extern "C" fn ump_numpy_dispatching() -> bool {
    dispatch::dispatching()
}

extern "C" fn dispatch_malloc(_ctx: *mut c_void, size: usize) -> *mut c_void {
    if dispatch::dispatching_now() {
        return ump_malloc(size);
    }
    guard("numpy dispatch malloc", || {
        match dispatch::fallback() {
            // SAFETY: copied from NumPy's live default handler, complete; called where NumPy calls it.
            Some(f) => unsafe { f.malloc(size) },
            None => null_mut(),
        }
    })
}

extern "C" fn dispatch_calloc(_ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    if dispatch::dispatching_now() {
        return ump_calloc(nelem, elsize);
    }
    guard("numpy dispatch calloc", || {
        match dispatch::fallback() {
            // SAFETY: as in dispatch_malloc.
            Some(f) => unsafe { f.calloc(nelem, elsize) },
            None => null_mut(),
        }
    })
}

extern "C" fn dispatch_realloc(_ctx: *mut c_void, ptr: *mut c_void, size: usize) -> *mut c_void {
    if ptr.is_null() {
        return dispatch_malloc(null_mut(), size);
    }
    if allocator::owns(ptr as usize) {
        return ump_realloc(ptr, size);
    }
    guard("numpy dispatch realloc", || {
        match dispatch::fallback() {
            // SAFETY: as in dispatch_malloc; a block that is not ours came from the fallback.
            Some(f) => unsafe { f.realloc(ptr, size) },
            None => null_mut(),
        }
    })
}

extern "C" fn dispatch_free(_ctx: *mut c_void, ptr: *mut c_void, size: usize) {
    if ptr.is_null() {
        return;
    }
    if allocator::owns(ptr as usize) {
        return ump_free(ptr, size);
    }
    guard("numpy dispatch free", || {
        if let Some(f) = dispatch::fallback() {
            // SAFETY: as in dispatch_realloc.
            unsafe { f.free(ptr, size) }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // A stand-in for NumPy's default handler: libc's allocator, counting its calls.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn c_malloc(_: *mut c_void, n: usize) -> *mut c_void {
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: libc's allocator.
        unsafe { libc::malloc(n) }
    }
    extern "C" fn c_calloc(_: *mut c_void, n: usize, e: usize) -> *mut c_void {
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: libc's allocator.
        unsafe { libc::calloc(n, e) }
    }
    extern "C" fn c_realloc(_: *mut c_void, p: *mut c_void, n: usize) -> *mut c_void {
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: p came from c_malloc/c_calloc.
        unsafe { libc::realloc(p, n) }
    }
    extern "C" fn c_free(_: *mut c_void, p: *mut c_void, _: usize) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: p came from c_malloc/c_calloc/c_realloc.
        unsafe { libc::free(p) }
    }
    static LIBC: Static = Static(ump_numpy_handler {
        name: name("libc"),
        version: 1,
        allocator: ump_numpy_allocator {
            ctx: null_mut(),
            malloc: Some(c_malloc),
            calloc: Some(c_calloc),
            realloc: Some(c_realloc),
            free: Some(c_free),
        },
    });

    fn call_malloc(h: *const ump_numpy_handler, n: usize) -> *mut c_void {
        // SAFETY: a static handler of this test.
        unsafe { (*h).allocator.malloc(n) }
    }

    #[test]
    fn handler_layout_is_numpys() {
        // numpy/ndarraytypes.h: char name[127]; uint8_t version; PyDataMemAllocator allocator
        // (so the allocator starts at 128; python_tests checks a real NumPy reads it).
        assert_eq!(std::mem::offset_of!(ump_numpy_handler, version), 127);
        assert_eq!(std::mem::offset_of!(ump_numpy_handler, allocator), 128);
        assert_eq!(std::mem::size_of::<ump_numpy_handler>(), 128 + 5 * 8);
        // SAFETY: a static NUL-terminated name.
        let n = unsafe { std::ffi::CStr::from_ptr((*ump_numpy_handler()).name.as_ptr()) };
        assert_eq!(n.to_str(), Ok("ump_alloc"));
    }

    #[test]
    fn handler_functions_are_the_malloc_family() {
        let h = ump_numpy_handler();
        let p = call_malloc(h, 1000);
        assert!(!p.is_null() && allocator::owns(p as usize));
        // SAFETY: static handler; p is its block.
        unsafe {
            let a = (*h).allocator;
            let q = a.realloc(p, 100_000);
            assert!(!q.is_null() && allocator::owns(q as usize));
            a.free(q, 100_000);
            let z = a.calloc(4096, 1);
            assert!(
                std::slice::from_raw_parts(z as *const u8, 4096)
                    .iter()
                    .all(|&b| b == 0)
            );
            a.free(z, 4096);
        }
    }

    /// One test: the dispatch state is process-wide.
    #[test]
    fn dispatch_routes_new_blocks_and_frees_each_where_it_came_from() {
        // Refused before set-up, and for bad fallbacks.
        assert_ne!(ump_numpy_dispatch_set(true), 0);
        // SAFETY: NULL and static handlers.
        unsafe {
            assert!(ump_numpy_dispatch_handler(null()).is_null());
            assert!(ump_numpy_dispatch_handler(ump_numpy_handler()).is_null());
            assert!(
                error::last_message()
                    .unwrap()
                    .contains("one of ump-alloc's own")
            );
        }
        // SAFETY: a static handler.
        let d = unsafe { ump_numpy_dispatch_handler(&LIBC.0) };
        assert!(!d.is_null());
        // SAFETY: the same fallback again, the dispatch handler itself, then another one.
        unsafe {
            assert_eq!(ump_numpy_dispatch_handler(&LIBC.0), d);
            assert_eq!(ump_numpy_dispatch_handler(d), d);
            let other = Static(ump_numpy_handler {
                name: name("other"),
                version: 1,
                allocator: ump_numpy_allocator {
                    malloc: Some(dispatch_malloc),
                    ..LIBC.0.allocator
                },
            });
            assert!(ump_numpy_dispatch_handler(&other.0).is_null());
        }
        // SAFETY: d is the static dispatch handler.
        let a = unsafe { (*d).allocator };
        // Off: blocks come from the fallback (libc) and go back there.
        assert!(!ump_numpy_dispatching());
        let before = CALLS.load(Ordering::Relaxed);
        // SAFETY: the dispatch handler's functions on its own blocks.
        let foreign = unsafe { a.malloc(64 << 10) };
        assert!(!foreign.is_null() && !allocator::owns(foreign as usize));
        assert_eq!(ump_numpy_dispatch_set(true), 0);
        assert!(ump_numpy_dispatching());
        // On: new blocks are ours; the foreign one still resizes and frees through libc.
        // SAFETY: as above.
        unsafe {
            let mine = a.calloc(100, 8);
            assert!(allocator::owns(mine as usize));
            let foreign = a.realloc(foreign, 1 << 20);
            assert!(!foreign.is_null() && !allocator::owns(foreign as usize));
            let mine2 = a.realloc(mine, 1 << 20);
            assert!(allocator::owns(mine2 as usize));
            assert_eq!(ump_numpy_dispatch_set(false), 0);
            // Off again: our block is still freed by us (libc's free would abort on it), the
            // foreign one by libc.
            a.free(mine2, 1 << 20);
            a.free(foreign, 1 << 20);
            a.free(null_mut(), 0);
        }
        // malloc, realloc, free of the foreign block (libc), nothing for ours.
        assert_eq!(CALLS.load(Ordering::Relaxed) - before, 3);
    }
}
