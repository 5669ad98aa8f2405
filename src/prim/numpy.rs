//! NumPy's allocator ABI (NEP 49): the layout of a `PyDataMemAllocator`, and calls into another
//! handler's functions through pointers copied from it (NumPy's own default handler, which
//! ump-alloc's dispatch handler forwards to for blocks that are not its own).
//!
//! Nothing here links to NumPy: the pointers are handed over from Python once
//! (`ump_numpy_dispatch_handler`), and NumPy's `default_handler` lives as long as NumPy's
//! extension module, which is never unloaded.

use std::ffi::c_void;

/// NumPy's `PyDataMemAllocator` (NEP 49): the context NumPy passes back and the four functions
/// a NumPy memory handler consists of. Same layout as NumPy's struct.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ump_numpy_allocator {
    /// Passed as the first argument of every function (ump-alloc's own handlers ignore it).
    pub ctx: *mut c_void,
    /// Allocate `size` bytes (NumPy never asks for 0).
    pub malloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    /// Allocate `nelem * elsize` zeroed bytes (NumPy calls it as `(nbytes, 1)`).
    pub calloc: Option<unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void>,
    /// Resize a block, keeping its contents.
    pub realloc: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void>,
    /// Free a block; `size` is the size it was allocated with.
    pub free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize)>,
}

impl ump_numpy_allocator {
    /// Whether every function is present.
    pub fn complete(&self) -> bool {
        self.malloc.is_some()
            && self.calloc.is_some()
            && self.realloc.is_some()
            && self.free.is_some()
    }

    /// The context and the functions' addresses: two copies of one handler's allocator are
    /// equal, two handlers that share no function are not.
    pub fn addresses(&self) -> [usize; 5] {
        [
            self.ctx as usize,
            self.malloc.map_or(0, |f| f as usize),
            self.calloc.map_or(0, |f| f as usize),
            self.realloc.map_or(0, |f| f as usize),
            self.free.map_or(0, |f| f as usize),
        ]
    }

    /// Call its `malloc`.
    ///
    /// # Safety
    /// `self` was copied from a live NumPy handler and is [`complete`](Self::complete); the
    /// caller is where NumPy would call the handler (NumPy's default handler may release and
    /// take back the GIL).
    pub unsafe fn malloc(&self, size: usize) -> *mut c_void {
        // SAFETY: per this function's contract.
        self.malloc
            .map_or(std::ptr::null_mut(), |f| unsafe { f(self.ctx, size) })
    }

    /// Call its `calloc`.
    ///
    /// # Safety
    /// As [`malloc`](Self::malloc).
    pub unsafe fn calloc(&self, nelem: usize, elsize: usize) -> *mut c_void {
        // SAFETY: per this function's contract.
        self.calloc.map_or(std::ptr::null_mut(), |f| unsafe {
            f(self.ctx, nelem, elsize)
        })
    }

    /// Call its `realloc` on a block it allocated.
    ///
    /// # Safety
    /// As [`malloc`](Self::malloc); `ptr` is NULL or a live block of this allocator.
    pub unsafe fn realloc(&self, ptr: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: per this function's contract.
        self.realloc
            .map_or(std::ptr::null_mut(), |f| unsafe { f(self.ctx, ptr, size) })
    }

    /// Call its `free` on a block it allocated.
    ///
    /// # Safety
    /// As [`realloc`](Self::realloc); `size` is the size NumPy allocated.
    pub unsafe fn free(&self, ptr: *mut c_void, size: usize) {
        if let Some(f) = self.free {
            // SAFETY: per this function's contract.
            unsafe { f(self.ctx, ptr, size) }
        }
    }
}
