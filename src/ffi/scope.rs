//! Scoped bulk free for C callers (GPUArrays.jl's `@cached`), and the keep-live variant that
//! Python's `ump_alloc.scope()` uses. The semantics live in `crate::scope`.

use super::{guard, status};
use crate::error::{Error, Status};
use crate::scope;
use std::ffi::{c_int, c_void};

/// `ump_scope_begin_ex` flag: at the end, report live blocks but leave them allocated (for
/// callers whose blocks are owned elsewhere, such as Python arrays).
pub const UMP_SCOPE_KEEP_LIVE: u32 = 1;

/// Version of `ump_scope_report`.
pub const UMP_SCOPE_REPORT_VERSION: u32 = 1;

/// What a scope saw, filled by `ump_scope_end_ex`. Versioned like `ump_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ump_scope_report {
    /// In: bytes the caller provides (0: the current size). Out: bytes written.
    pub size: u32,
    /// Out: `UMP_SCOPE_REPORT_VERSION`.
    pub version: u32,
    /// Blocks allocated in the scope, and their bytes.
    pub allocs: u64,
    pub alloc_bytes: u64,
    /// Blocks of the scope freed before its end.
    pub frees: u64,
    /// Most bytes of the scope live at once.
    pub peak_bytes: u64,
    /// Blocks still live at the end, and their bytes.
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// The live blocks were freed at the end (false for `UMP_SCOPE_KEEP_LIVE`).
    pub freed: bool,
}

/// Open a scope on the calling thread: every block this thread allocates from now on (with
/// any `ump_*` allocation function) belongs to it until it is freed, kept with
/// `ump_scope_keep`, or the scope ends. Scopes nest. Returns `UMP_OK`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_scope_begin() -> c_int {
    status("ump_scope_begin", || scope::begin(false).map(|_| ()))
}

/// `ump_scope_begin` with flags (0 or `UMP_SCOPE_KEEP_LIVE`). Returns `UMP_OK`, or
/// `UMP_ERR_INVALID` for an unknown flag.
#[unsafe(no_mangle)]
pub extern "C" fn ump_scope_begin_ex(flags: u32) -> c_int {
    status("ump_scope_begin_ex", || {
        if flags & !UMP_SCOPE_KEEP_LIVE != 0 {
            return Err(Error::invalid(format!("unknown scope flags {flags:#x}")));
        }
        scope::begin(flags & UMP_SCOPE_KEEP_LIVE != 0).map(|_| ())
    })
}

/// End the calling thread's innermost scope: every block of it still live goes back to the
/// cache (device blocks to their stream's pool, so reuse stays stream-ordered); their
/// pointers are then dangling and must not be freed again. Returns `UMP_OK`, or
/// `UMP_ERR_INVALID` when no scope is open on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn ump_scope_end() -> c_int {
    status("ump_scope_end", || scope::end().map(|_| ()))
}

/// `ump_scope_end`, filling `out` with what the scope saw. Returns `UMP_OK`; `UMP_ERR_NULL`
/// (the scope stays open); `UMP_ERR_INVALID`.
///
/// # Safety
/// `out` is NULL or points to a writable `ump_scope_report` whose `size` field is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_scope_end_ex(out: *mut ump_scope_report) -> c_int {
    status("ump_scope_end_ex", || {
        if out.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "out is NULL"));
        }
        // Check the size before ending the scope: a failure leaves the scope open.
        // SAFETY: non-NULL; the caller provides at least the first u32.
        unsafe { super::versioned_len(out) }?;
        let r = scope::end()?;
        let rep = ump_scope_report {
            size: 0,
            version: UMP_SCOPE_REPORT_VERSION,
            allocs: r.allocs,
            alloc_bytes: r.alloc_bytes,
            frees: r.frees,
            peak_bytes: r.peak_bytes,
            live_blocks: r.live_at_end,
            live_bytes: r.live_bytes_at_end,
            freed: r.freed_at_end,
        };
        // SAFETY: as above; the size was checked.
        unsafe { super::write_versioned(out, rep) }
    })
}

/// Take the live block at `ptr` out of its scope, so that the scope's end leaves it
/// allocated (GPUArrays.jl's `@uncached`). Returns `UMP_OK`; `UMP_ERR_NULL`;
/// `UMP_ERR_NOT_OURS` when no open scope holds `ptr`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_scope_keep(ptr: *const c_void) -> c_int {
    status("ump_scope_keep", || {
        if ptr.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "ptr is NULL"));
        }
        scope::keep(ptr as usize)
    })
}

/// Scopes open on the calling thread.
#[unsafe(no_mangle)]
pub extern "C" fn ump_scope_depth() -> c_int {
    c_int::try_from(guard("ump_scope_depth", scope::depth)).unwrap_or(c_int::MAX)
}
