//! The C contract, one file per consumer (NumPy's has two: the `ump_malloc` family in `numpy`,
//! its NEP 49 handler objects in `numpy_handler`). Every export:
//! - starts with `ump_` and carries a doc comment that cbindgen copies into the header;
//! - runs inside [`guard`], the one panic boundary: a panic becomes `UMP_ERR_INTERNAL` (or
//!   NULL), with its message in `ump_last_error()`, and never unwinds into C;
//! - checks NULL arguments and writes outputs only on success;
//! - writes a versioned struct (`size`, `version` first) through [`write_versioned`], which
//!   honours the caller's `size`.

pub mod access;
pub mod config;
pub mod cupy;
pub mod numpy;
pub mod numpy_handler;
pub mod query;
pub mod scope;
pub mod torch;

use crate::error::{self, Error, Status};
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The panic hook of this library (its own copy of std, so the hook is ours alone): a panic
/// is a bug that the boundary turns into `UMP_ERR_INTERNAL` with the message in
/// `ump_last_error()`, so nothing is printed on the host program's stderr. Installed on the
/// first call through the boundary; Rust unit tests of this crate keep the default hook.
static PANIC_HOOK: std::sync::Once = std::sync::Once::new();

fn install_panic_hook() {
    if cfg!(test) {
        return;
    }
    std::panic::set_hook(Box::new(|_| {}));
}

/// What an entry point returns when its body panicked, decided once per return type (as
/// rustls-ffi's `PanicOrDefault`): `UMP_ERR_INTERNAL` for a status, NULL for a pointer, 0 for
/// a count, `false` for a yes/no answer, `UMP_MODE_UNSET` for a mode, nothing for `()`, and
/// `Err(())` for a hook's internal result (which it turns into its caller's error code).
pub(crate) trait OnPanic {
    fn on_panic() -> Self;
}

impl OnPanic for std::ffi::c_int {
    fn on_panic() -> Self {
        Status::UMP_ERR_INTERNAL as std::ffi::c_int
    }
}

impl OnPanic for usize {
    fn on_panic() -> Self {
        0
    }
}

impl OnPanic for u64 {
    fn on_panic() -> Self {
        0
    }
}

impl OnPanic for bool {
    fn on_panic() -> Self {
        false
    }
}

impl OnPanic for () {
    fn on_panic() -> Self {}
}

impl<T> OnPanic for *mut T {
    fn on_panic() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> OnPanic for *const T {
    fn on_panic() -> Self {
        std::ptr::null()
    }
}

impl OnPanic for crate::mode::ump_mode {
    fn on_panic() -> Self {
        crate::mode::ump_mode::UMP_MODE_UNSET
    }
}

impl<T> OnPanic for std::result::Result<T, ()> {
    fn on_panic() -> Self {
        Err(())
    }
}

/// Run `f`; if it panics, record an internal error for `name` and return its type's
/// [`OnPanic`] value.
#[inline]
pub(crate) fn guard<T: OnPanic>(name: &str, f: impl FnOnce() -> T) -> T {
    if !PANIC_HOOK.is_completed() {
        first_call();
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            panicked(name, payload);
            T::on_panic()
        }
    }
}

/// The first call through the boundary: install the panic hook (out of the hot path).
#[cold]
#[inline(never)]
fn first_call() {
    PANIC_HOOK.call_once(install_panic_hook);
}

/// A panic reached the boundary of entry point `name`: record it as an internal error.
#[cold]
#[inline(never)]
fn panicked(name: &str, payload: Box<dyn std::any::Any + Send>) {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    // Rust's own panic messages may already start with "internal error: ".
    let what = what.strip_prefix("internal error: ").unwrap_or(&what);
    error::report(&Error::new(
        Status::UMP_ERR_INTERNAL,
        format!("{name}: internal error (a bug in ump-alloc, please report it): {what}"),
    ));
}

/// Report `e` for entry point `name` and return its status as a C int.
pub(crate) fn fail(name: &str, e: Error) -> std::ffi::c_int {
    error::report(&e.context(name)) as std::ffi::c_int
}

/// Run a status-returning body inside the boundary.
pub(crate) fn status(name: &str, f: impl FnOnce() -> crate::error::Result<()>) -> std::ffi::c_int {
    guard(name, || match f() {
        Ok(()) => Status::UMP_OK as std::ffi::c_int,
        Err(e) => fail(name, e),
    })
}

/// A path argument: NULL refused (`UMP_ERR_NULL`), not UTF-8 refused (`UMP_ERR_INVALID`),
/// each naming the argument `what`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives the returned one.
pub(crate) unsafe fn path_arg<'a>(p: *const c_char, what: &str) -> crate::error::Result<&'a str> {
    if p.is_null() {
        return Err(Error::new(Status::UMP_ERR_NULL, format!("{what} is NULL")));
    }
    // SAFETY: a NUL-terminated string, per the caller's contract.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Error::invalid(format!("{what} is not UTF-8")))
}

// ---- versioned structs (mimalloc's pattern: `size` and `version` first) -------------------

/// Copy `s` into `dst` as a NUL-terminated C string, cut to fit.
pub(crate) fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// The bytes to write into versioned struct `out`: its `size` field (0: the whole struct),
/// at most the whole struct, at least the size and version fields.
///
/// # Safety
/// `out` is non-NULL and readable for its first u32.
pub(crate) unsafe fn versioned_len<T>(out: *const T) -> crate::error::Result<usize> {
    // SAFETY: the caller guarantees `out` is readable for its first u32.
    let want = unsafe { out.cast::<u32>().read_unaligned() } as usize;
    let full = std::mem::size_of::<T>();
    let n = if want == 0 { full } else { want.min(full) };
    if n < 8 {
        return Err(Error::invalid(format!(
            "size {want} is too small for this struct"
        )));
    }
    Ok(n)
}

/// Write a versioned struct: honour the caller's `size` (first u32), write at most that many
/// bytes, set `size` to the bytes written.
///
/// # Safety
/// `out` points to at least `size` writable bytes (or `size_of::<T>()` when `size` is 0), and
/// `T` starts with `size: u32, version: u32`.
pub(crate) unsafe fn write_versioned<T: Copy>(out: *mut T, mut val: T) -> crate::error::Result<()> {
    // SAFETY: forwarded from the caller.
    let n = unsafe { versioned_len(out) }?;
    let full = std::mem::size_of::<T>();
    // SAFETY: T starts with a u32 size field.
    unsafe { (&mut val as *mut T).cast::<u32>().write(n as u32) };
    if n == full {
        // The common case: a fixed-size copy the compiler inlines.
        // SAFETY: the caller provides `size_of::<T>()` writable bytes.
        unsafe { out.write_unaligned(val) };
        return Ok(());
    }
    // SAFETY: `n` bytes of `val` are readable and the caller provides `n` writable bytes.
    unsafe { std::ptr::copy_nonoverlapping((&val as *const T).cast::<u8>(), out.cast::<u8>(), n) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_internal_errors() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = guard("ump_test", || -> std::ffi::c_int { panic!("boom") });
        std::panic::set_hook(prev);
        assert_eq!(r, Status::UMP_ERR_INTERNAL as std::ffi::c_int);
        let msg = crate::error::last_message().unwrap();
        assert!(msg.contains("ump_test") && msg.contains("boom"), "{msg}");
    }

    #[test]
    fn status_maps_errors() {
        assert_eq!(status("ump_x", || Ok(())), 0);
        assert_eq!(
            status("ump_x", || Err(Error::invalid("bad"))),
            Status::UMP_ERR_INVALID as i32
        );
        assert_eq!(crate::error::last_message().as_deref(), Some("ump_x: bad"));
    }
}
