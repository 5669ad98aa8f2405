//! Configuration and errors: initialising, the settings (mode, alignment, limit) and what
//! the configuration table says and checks, this thread's last error and the error counts,
//! the library's version, and giving cached memory back (`ump_trim`).

use super::{guard, status};
use crate::allocator;
use crate::error::{self, ERRORS, Error, Status};
use crate::mode::{ModeRequest, ump_mode};
use crate::prim::os;
use std::ffi::{CStr, c_char, c_int};
use std::sync::atomic::Ordering;

/// This thread's last error message, or NULL when there is none. The string stays valid until
/// the next failing call on this thread or `ump_clear_error()`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_last_error() -> *const c_char {
    guard("ump_last_error", error::last_ptr)
}

/// Forget this thread's last error message.
#[unsafe(no_mangle)]
pub extern "C" fn ump_clear_error() {
    guard("ump_clear_error", error::clear_last)
}

/// Errors counted since the process started, over all threads (bad frees, double frees, bad
/// sizes, out-of-memory, configuration errors).
#[unsafe(no_mangle)]
pub extern "C" fn ump_error_count() -> u64 {
    guard("ump_error_count", || ERRORS.total.load(Ordering::Relaxed))
}

/// Initialise now: read the `UMP_ALLOC_*` configuration, select the mode, fix mode and
/// alignment. Allocation does this implicitly; calling it first surfaces configuration errors
/// (`UMP_ERR_CONFIG`, `UMP_ERR_UNSUPPORTED`) before any allocation.
#[unsafe(no_mangle)]
pub extern "C" fn ump_init() -> c_int {
    status("ump_init", || allocator::init().map(|_| ()))
}

/// Check the `UMP_ALLOC_*` configuration without initialising, with the verdict `ump_init`
/// would give: `UMP_OK`; `UMP_ERR_CONFIG` for a malformed value (the variable, its value and
/// what it accepts in `ump_last_error`); `UMP_ERR_UNSUPPORTED` for a mode or side this machine
/// cannot do (what is missing and what to use instead). Settings made with `ump_set_mode` and
/// the like count as `ump_init` counts them. Nothing is fixed, so a tool can report a bad
/// setting and still show what would be chosen. After initialisation: `UMP_OK`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_config_check() -> c_int {
    status("ump_config_check", allocator::check)
}

/// Write what `value` means for configuration variable `name` (a row of `ump_config_var`),
/// parsed as the configuration parses it, NUL-terminated into `out` (`out_len` bytes): "8 GiB
/// (8589934592 bytes)" for `UMP_ALLOC_LIMIT` = "8GB"; a row with no parsed form (a path) gives
/// the value back. Returns `UMP_OK`; `UMP_ERR_CONFIG` when the value is invalid, with the
/// message the configuration would give in `ump_last_error()` (a query's answer, not counted
/// in `ump_stats`); `UMP_ERR_INVALID` for a name with no row or an `out_len` too small;
/// `UMP_ERR_NULL`. `out` is written only on success.
///
/// # Safety
/// `name` and `value` are NULL or NUL-terminated strings; `out` is NULL or writable for
/// `out_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_config_describe(
    name: *const c_char,
    value: *const c_char,
    out: *mut c_char,
    out_len: usize,
) -> c_int {
    const NAME: &str = "ump_config_describe";
    guard(NAME, || {
        let written = (|| {
            if name.is_null() || value.is_null() || out.is_null() {
                return Err(Error::new(Status::UMP_ERR_NULL, "an argument is NULL"));
            }
            // SAFETY: both non-NULL and NUL-terminated by the caller's contract.
            let (name, value) = unsafe {
                (
                    CStr::from_ptr(name).to_string_lossy(),
                    CStr::from_ptr(value).to_string_lossy(),
                )
            };
            let text = crate::config::describe(&name, &value, os::memory_available())?;
            // SAFETY: `out` is non-NULL and writable for `out_len` bytes (caller's contract).
            unsafe { write_text(out, out_len, &text) }
        })();
        answer(NAME, written)
    })
}

/// Read variable `name` of the process environment now, through its row of the configuration
/// table (the reading `ump_config_check` and the first allocation make): writes the value as
/// typed (trimmed), or the row's default where it is unset or empty, NUL-terminated into `out`.
/// Returns `UMP_OK`; `UMP_ERR_CONFIG` for a value the row refuses (`ump_last_error()` says
/// `NAME="value": expected ...`, not counted as an error in `ump_stats`); `UMP_ERR_INVALID` for
/// a name with no row or an `out_len` too small for the value and its NUL; `UMP_ERR_NULL`.
/// `out` is written only on success. The Python package reads every `UMP_ALLOC_*` variable it
/// acts on through this, so that the table is the one reading of the environment. A row whose
/// default is not a value (`UMP_ALLOC_LIBRARY`'s `(packaged)`) gives that text when unset.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or writable for `out_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_config_setting(
    name: *const c_char,
    out: *mut c_char,
    out_len: usize,
) -> c_int {
    const NAME: &str = "ump_config_setting";
    guard(NAME, || {
        let written = (|| {
            if name.is_null() || out.is_null() {
                return Err(Error::new(Status::UMP_ERR_NULL, "an argument is NULL"));
            }
            // SAFETY: non-NULL and NUL-terminated by the caller's contract.
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            let value = crate::config::setting_in_env(&name)?;
            // SAFETY: `out` is non-NULL and writable for `out_len` bytes (caller's contract).
            unsafe { write_text(out, out_len, &value) }
        })();
        answer(NAME, written)
    })
}

/// Write `text` and its NUL into `out`, or refuse (writing nothing) where `out_len` is too
/// small.
///
/// # Safety
/// `out` is non-NULL and writable for `out_len` bytes.
unsafe fn write_text(out: *mut c_char, out_len: usize, text: &str) -> error::Result<()> {
    let bytes = text.as_bytes();
    if bytes.len() >= out_len {
        return Err(Error::invalid(format!(
            "out_len {out_len} is too small for {} bytes and the NUL",
            bytes.len()
        )));
    }
    // SAFETY: `out` is writable for `out_len > bytes.len()` bytes (the caller's contract).
    let dst = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), bytes.len() + 1) };
    dst[..bytes.len()].copy_from_slice(bytes);
    dst[bytes.len()] = 0;
    Ok(())
}

/// The status of a configuration question: an invalid value is its answer, reported in
/// `ump_last_error()` but not counted as an error; other failures are.
fn answer(name: &str, r: error::Result<()>) -> c_int {
    match r {
        Ok(()) => Status::UMP_OK as c_int,
        Err(e) if e.status == Status::UMP_ERR_CONFIG => {
            error::set_last(&format!("{name}: {}", e.msg));
            e.status as c_int
        }
        Err(e) => super::fail(name, e),
    }
}

/// Request a mode by name ("auto", "system", "managed", "registered", "device", "host") before
/// the first allocation. A mode this machine cannot do gives `UMP_ERR_UNSUPPORTED` with the
/// missing capability; a different mode after the first allocation gives `UMP_ERR_LOCKED`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_set_mode(name: *const c_char) -> c_int {
    status("ump_set_mode", || {
        if name.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "name is NULL"));
        }
        // SAFETY: non-NULL and NUL-terminated by the caller's contract.
        let s = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let req = ModeRequest::parse(&s).map_err(|e| Error::invalid(format!("{s:?}: {e}")))?;
        allocator::set_mode(req)
    })
}

/// Request an alignment (a power of two, 16 ..= 65536) before the first allocation; after it,
/// a different value gives `UMP_ERR_LOCKED`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_set_alignment(alignment: usize) -> c_int {
    status("ump_set_alignment", || allocator::set_alignment(alignment))
}

/// Request a limit on the bytes mapped by the host pool and by each device, before the first
/// allocation, in `UMP_ALLOC_LIMIT`'s syntax ("8G", "512M", "1073741824", or "none"); it
/// overrides the environment. 0 and malformed values give `UMP_ERR_CONFIG`; a different limit
/// after the first allocation gives `UMP_ERR_LOCKED`.
///
/// # Safety
/// `value` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_set_limit(value: *const c_char) -> c_int {
    status("ump_set_limit", || {
        if value.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "value is NULL"));
        }
        // SAFETY: non-NULL and NUL-terminated by the caller's contract.
        let s = unsafe { CStr::from_ptr(value) }.to_string_lossy();
        let limit = crate::config::parse_limit(&s)
            .map_err(|e| Error::config(format!("limit {s:?}: {e}")))?;
        allocator::set_limit(limit)
    })
}

/// The alignment in force (after initialisation), else the configured one; 0 when the
/// configuration is invalid (see `ump_init`).
#[unsafe(no_mangle)]
pub extern "C" fn ump_alignment() -> usize {
    guard("ump_alignment", || match allocator::get() {
        Some(a) => a.alignment,
        None => allocator::env_config().map_or(0, |c| c.alignment),
    })
}

/// The alignment `ump_malloc(size)` (and calloc, realloc) guarantees for a block of `size`
/// bytes: `ump_alignment()` for blocks of at least that size; a smaller block gets the
/// natural alignment of its size class instead (the largest power of two dividing the class
/// size, at least 16: 64 for 64 bytes, 16 for 40 bytes), so that small arrays do not pay for
/// a GPU-sized alignment. Device-side blocks (`ump_cupy_malloc`, `ump_torch_malloc`) always get
/// `ump_alignment()`. Initialises the allocator; returns 0 when the configuration is invalid
/// (see `ump_init`).
#[unsafe(no_mangle)]
pub extern "C" fn ump_block_alignment(size: usize) -> usize {
    guard("ump_block_alignment", || {
        match allocator::block_alignment(size) {
            Ok(a) => a,
            Err(e) => {
                error::report(&e.context("ump_block_alignment"));
                0
            }
        }
    })
}

/// The mode in force, or `UMP_MODE_UNSET` before initialisation. Where the sides chosen at
/// initialisation tell it (`ump_mode_known`), the driver is not started: a pinned host side made
/// before the GPU was asked answers `UMP_MODE_PINNED`, and no CUDA context is made. Otherwise the
/// machine is asked (the CUDA driver is loaded and initialised, about 0.5 s).
#[unsafe(no_mangle)]
pub extern "C" fn ump_current_mode() -> ump_mode {
    guard("ump_current_mode", || {
        allocator::get().map_or(ump_mode::UMP_MODE_UNSET, |a| a.mode().to_c())
    })
}

/// The mode in force as far as it is known without asking the machine (a question loads the
/// CUDA driver, about 0.5 s): the one in force once the machine was asked, or the one the sides
/// chosen at initialisation make (`UMP_MODE_HOST`, or `UMP_MODE_PINNED` for a pinned host side
/// made before the GPU was asked); `UMP_MODE_UNSET` before initialisation or where only the
/// machine can tell (then `ump_current_mode` asks it).
#[unsafe(no_mangle)]
pub extern "C" fn ump_mode_known() -> ump_mode {
    guard("ump_mode_known", || {
        allocator::get()
            .and_then(|a| a.mode_known())
            .map_or(ump_mode::UMP_MODE_UNSET, |m| m.to_c())
    })
}

/// Library version, e.g. "0.1.0".
#[unsafe(no_mangle)]
pub extern "C" fn ump_version() -> *const c_char {
    const V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    V.as_ptr()
}

/// Describe row `index` of the configuration table (every `UMP_ALLOC_*` variable): its name,
/// default and meaning, as static NUL-terminated strings. Returns `UMP_OK`, `UMP_ERR_INVALID`
/// past the last row (the end of the list: a message in `ump_last_error()`, not counted as an
/// error in `ump_stats`), or `UMP_ERR_NULL`. Outputs are written only on success.
///
/// # Safety
/// Each out-pointer is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_config_var(
    index: usize,
    name: *mut *const c_char,
    default_value: *mut *const c_char,
    help: *mut *const c_char,
) -> c_int {
    const NAME: &str = "ump_config_var";
    if index >= crate::config::VARS.len() {
        // Walking the table ends here: a caller's loop condition, not a failure to count.
        error::set_last(&format!(
            "{NAME}: no configuration row {index} ({} rows)",
            crate::config::VARS.len()
        ));
        return Status::UMP_ERR_INVALID as c_int;
    }
    status(NAME, || {
        if name.is_null() || default_value.is_null() || help.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "an out-pointer is NULL"));
        }
        let v = &crate::config::VARS[index];
        // SAFETY: all three checked non-NULL; the caller guarantees they are writable.
        unsafe {
            *name = v.name.as_ptr();
            *default_value = v.default.as_ptr();
            *help = v.help.as_ptr();
        }
        Ok(())
    })
}

/// Give cached memory back to the OS and the CUDA driver (like CuPy's `free_all_blocks` and
/// torch's `empty_cache`). Returns the bytes given back.
#[unsafe(no_mangle)]
pub extern "C" fn ump_trim() -> usize {
    guard("ump_trim", allocator::trim)
}
