//! NumPy's dispatch handler, the state behind it: the handler it stands in for (NumPy's
//! default, copied once) and whether it allocates new blocks from ump-alloc now. The handler
//! structs and the C functions NumPy calls through them are `crate::ffi::numpy_handler`'s.

use crate::error::{Error, Result, Status};
use crate::prim::numpy::ump_numpy_allocator;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// The handler whose place the dispatch handler takes (NumPy's default), copied once.
struct Fallback(ump_numpy_allocator);
// SAFETY: NumPy's handler functions may be called from any thread (they are, by every thread
// that allocates an array); the context is NumPy's and only passed back to them.
unsafe impl Sync for Fallback {}
// SAFETY: as above.
unsafe impl Send for Fallback {}

static FALLBACK: OnceLock<Fallback> = OnceLock::new();
/// Whether the dispatch handler allocates new blocks from ump-alloc.
static DISPATCH_ON: AtomicBool = AtomicBool::new(false);

/// Let the dispatch handler stand in for `theirs`. `ours` are ump-alloc's own handlers, which
/// it must not stand in for. Refused: an incomplete handler or one of ours (`UMP_ERR_INVALID`),
/// another handler than the first one (`UMP_ERR_LOCKED`).
///
/// # Safety
/// `theirs` is a NumPy handler's allocator whose functions (and context) stay valid for the
/// life of the process and may be called from any thread, as NumPy's default handler's are:
/// the dispatch handler calls them for every block that is not ump-alloc's.
pub unsafe fn stand_in_for(
    theirs: ump_numpy_allocator,
    ours: &[&ump_numpy_allocator],
) -> Result<()> {
    if !theirs.complete() {
        return Err(Error::invalid("the fallback handler lacks a function"));
    }
    if ours
        .iter()
        .any(|h| h.addresses()[1..] == theirs.addresses()[1..])
    {
        return Err(Error::invalid(
            "the fallback handler is one of ump-alloc's own",
        ));
    }
    if FALLBACK.get_or_init(|| Fallback(theirs)).0.addresses() != theirs.addresses() {
        return Err(Error::new(
            Status::UMP_ERR_LOCKED,
            "the dispatch handler already stands in for another handler",
        ));
    }
    Ok(())
}

/// Switch the dispatch handler's new blocks to ump-alloc (`on`) or back to the handler it
/// stands in for; refused (`UMP_ERR_INVALID`) when switching on before [`stand_in_for`].
pub fn set_dispatch(on: bool) -> Result<()> {
    if on && FALLBACK.get().is_none() {
        return Err(Error::invalid(
            "the dispatch handler is not set up (call ump_numpy_dispatch_handler first)",
        ));
    }
    DISPATCH_ON.store(on, Ordering::Release);
    Ok(())
}

/// Whether the dispatch handler allocates new blocks from ump-alloc now (for people: an
/// acquire load, ordered after [`set_dispatch`]).
pub fn dispatching() -> bool {
    DISPATCH_ON.load(Ordering::Acquire)
}

/// [`dispatching`] on the allocation path (a relaxed load: a block made just before or after a
/// switch may come from either side, and is freed where it came from).
#[inline]
pub fn dispatching_now() -> bool {
    DISPATCH_ON.load(Ordering::Relaxed)
}

/// The handler the dispatch handler stands in for, once set.
#[inline]
pub fn fallback() -> Option<&'static ump_numpy_allocator> {
    FALLBACK.get().map(|f| &f.0)
}
