//! Errors: the status codes of the C ABI, the per-thread last-error message and the global
//! error counters.
//!
//! Every failure that reaches the C ABI goes through [`report`]: it counts the error by class,
//! keeps the message for `ump_last_error()` on the calling thread, and yields the status code.

use std::cell::RefCell;
use std::ffi::CString;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Status codes returned by the `int`-returning functions of the C ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ump_status {
    /// Success.
    UMP_OK = 0,
    /// A required pointer argument was NULL.
    UMP_ERR_NULL = 1,
    /// An argument is out of range or malformed (bad size, bad device, bad mode name).
    UMP_ERR_INVALID = 2,
    /// The pointer is not a live block of this library (foreign pointer, interior pointer,
    /// or a block that was already freed).
    UMP_ERR_NOT_OURS = 3,
    /// Out of memory: the backing, the driver or `UMP_ALLOC_LIMIT` refused the request.
    UMP_ERR_OOM = 4,
    /// The machine cannot do what was asked (a mode it does not support, no GPU).
    UMP_ERR_UNSUPPORTED = 5,
    /// A `UMP_ALLOC_*` environment variable or a configuration call has a bad value.
    UMP_ERR_CONFIG = 6,
    /// Mode or alignment were already fixed by the first allocation and cannot change.
    UMP_ERR_LOCKED = 7,
    /// A CUDA driver call failed.
    UMP_ERR_CUDA = 8,
    /// An internal error (a caught panic). The library stays usable.
    UMP_ERR_INTERNAL = 9,
}

pub use ump_status as Status;

/// An error with its status and a human-readable message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub class: ErrorClass,
    pub msg: String,
}

impl Error {
    pub fn new(status: Status, msg: impl Into<String>) -> Self {
        let class = match status {
            Status::UMP_ERR_OOM => ErrorClass::Oom,
            Status::UMP_ERR_NOT_OURS => ErrorClass::InvalidFree,
            _ => ErrorClass::Other,
        };
        Error {
            status,
            class,
            msg: msg.into(),
        }
    }
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.class = class;
        self
    }
    pub fn double_free(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_NOT_OURS, msg).with_class(ErrorClass::DoubleFree)
    }
    pub fn bad_size(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_INVALID, msg).with_class(ErrorClass::BadSize)
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_INVALID, msg)
    }
    pub fn not_ours(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_NOT_OURS, msg)
    }
    pub fn oom(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_OOM, msg)
    }
    /// Out of memory because `UMP_ALLOC_LIMIT` is reached (no other memory may be used).
    pub fn limit(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_OOM, msg).with_class(ErrorClass::Limit)
    }
    pub fn config(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_CONFIG, msg)
    }
    pub fn unsupported(msg: impl Into<String>) -> Self {
        Self::new(Status::UMP_ERR_UNSUPPORTED, msg)
    }
    /// `device` names no GPU of a machine with `count` of them.
    pub fn no_device(device: i32, count: usize) -> Self {
        Self::invalid(format!(
            "no CUDA device {device} (this machine has {count})"
        ))
    }
    /// Prefix the message with the name of the entry point that failed.
    pub fn context(mut self, what: &str) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

/// The entry of `device` in a table with one entry per device, or the error that says the
/// machine has no such device.
pub fn device_slot<T>(slots: &[T], device: i32) -> Result<&T> {
    usize::try_from(device)
        .ok()
        .and_then(|i| slots.get(i))
        .ok_or_else(|| Error::no_device(device, slots.len()))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Error counters, one per class, read by `ump_stats` and `ump_error_count`.
pub struct ErrorCounts {
    pub total: AtomicU64,
    pub invalid_free: AtomicU64,
    pub double_free: AtomicU64,
    pub bad_size: AtomicU64,
    pub oom: AtomicU64,
    pub other: AtomicU64,
}

pub static ERRORS: ErrorCounts = ErrorCounts {
    total: AtomicU64::new(0),
    invalid_free: AtomicU64::new(0),
    double_free: AtomicU64::new(0),
    bad_size: AtomicU64::new(0),
    oom: AtomicU64::new(0),
    other: AtomicU64::new(0),
};

/// Which counter an error goes to (beyond the total).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    InvalidFree,
    DoubleFree,
    BadSize,
    Oom,
    /// Out of memory at `UMP_ALLOC_LIMIT` (counted with `Oom`).
    Limit,
    Other,
}

thread_local! {
    static LAST: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Count `err`, keep its message as this thread's last error, and return its status.
pub fn report(err: &Error) -> Status {
    ERRORS.total.fetch_add(1, Ordering::Relaxed);
    let counter = match err.class {
        ErrorClass::InvalidFree => &ERRORS.invalid_free,
        ErrorClass::DoubleFree => &ERRORS.double_free,
        ErrorClass::BadSize => &ERRORS.bad_size,
        ErrorClass::Oom | ErrorClass::Limit => &ERRORS.oom,
        ErrorClass::Other => &ERRORS.other,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    set_last(&err.msg);
    if err.class == ErrorClass::Limit && !LIMIT_NOTED.swap(true, Ordering::Relaxed) {
        // NumPy turns any NULL into "Unable to allocate N bytes": say the real cause, once.
        crate::prim::os::write_stderr(&format!(
            "ump-alloc: {} (printed once per process; the library's own error, e.g. NumPy's \
             MemoryError, follows; ump_alloc.last_error() has the latest)\n",
            err.msg
        ));
    }
    err.status
}

/// Whether the note on the first allocation refused by a limit was printed.
static LIMIT_NOTED: AtomicBool = AtomicBool::new(false);

/// Keep `msg` as this thread's last error (interior NULs are replaced).
pub fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // try_with: during thread teardown the slot may be gone; the message is then dropped.
    let _ = LAST.try_with(|l| *l.borrow_mut() = Some(c));
}

/// Clear this thread's last error.
pub fn clear_last() {
    let _ = LAST.try_with(|l| *l.borrow_mut() = None);
}

/// Pointer to this thread's last message, or NULL. Valid until the next failing call on this
/// thread or `ump_clear_error()`.
pub fn last_ptr() -> *const std::ffi::c_char {
    LAST.try_with(|l| l.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
        .unwrap_or(std::ptr::null())
}

/// This thread's last message, if any (for Rust callers and tests).
pub fn last_message() -> Option<String> {
    LAST.try_with(|l| {
        l.borrow()
            .as_ref()
            .map(|c| c.to_string_lossy().into_owned())
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_counts_and_keeps_message() {
        let before = ERRORS.double_free.load(Ordering::Relaxed);
        let st = report(&Error::double_free("x: double free"));
        assert_eq!(st, Status::UMP_ERR_NOT_OURS);
        assert!(ERRORS.double_free.load(Ordering::Relaxed) > before);
        assert_eq!(last_message().as_deref(), Some("x: double free"));
        assert!(!last_ptr().is_null());
        clear_last();
        assert!(last_ptr().is_null());
    }

    #[test]
    fn interior_nul_does_not_lose_message() {
        set_last("a\0b");
        assert_eq!(last_message().as_deref(), Some("a\\0b"));
    }

    #[test]
    fn last_error_is_per_thread() {
        set_last("main thread");
        std::thread::spawn(|| assert!(last_message().is_none()))
            .join()
            .unwrap();
        assert_eq!(last_message().as_deref(), Some("main thread"));
    }
}
