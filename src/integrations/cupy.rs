//! CuPy's fast path, the state behind it: whether this thread's last allocation on the fast
//! path failed, which `ump_cupy_malloc` notes and CuPy's allocator callables read to raise
//! CuPy's out-of-memory error (the calls are `crate::ffi::cupy`'s).

use std::cell::Cell;

thread_local! {
    /// Set when `ump_cupy_malloc` failed on the fast path, for the allocator to raise.
    static FAILED: Cell<bool> = const { Cell::new(false) };
}

/// Note that this thread's allocation on the fast path failed.
pub fn note_failure() {
    FAILED.set(true);
}

/// Forget this thread's last failure, before an allocation.
pub fn clear_failure() {
    FAILED.set(false);
}

/// Whether this thread's allocation on the fast path failed since [`clear_failure`].
pub fn failed() -> bool {
    FAILED.get()
}
