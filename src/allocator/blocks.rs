//! Blocks of either side: whether memory is this library's, the live block at an address,
//! the errors of a free that finds none, and trimming every pool; with the process's first use
//! of a GPU by a way no allocation shows, and the check of a device number.

use super::init::{caps, get};
use crate::error::{Error, Result};
use crate::pool::{self, BlockInfo};

/// The process uses GPU `device` (where known) through ump-alloc, by a way no device-side
/// allocation shows (a transfer call, a view it hands a GPU): the machine is asked (once) and
/// NumPy's memory pinned where it waits for that (`UMP_ALLOC_PIN=lazy`).
pub fn use_gpu(device: Option<i32>) {
    if let Some(a) = get() {
        a.gpu();
    }
    crate::backing::pin_host_side(device);
}

/// Refuse `device` unless it names a GPU of this machine (on a machine without one, device 0
/// stands for the GPU a plan is made for).
pub fn check_device(device: i32) -> Result<()> {
    let count = caps().devices.len();
    if usize::try_from(device).is_ok_and(|d| d < count.max(1)) {
        return Ok(());
    }
    Err(Error::no_device(device, count))
}

/// Whether `ptr` lies in memory this library's pools hold (a live block or not). Memory from
/// any other allocator never does: the registry covers only chunks this library mapped, and
/// forgets a chunk before it goes back to the OS.
#[inline]
pub fn owns(ptr: usize) -> bool {
    pool::entry_at(ptr).is_some()
}

/// The live block starting exactly at `ptr`, or the error that explains why not.
pub fn block_at(ptr: usize) -> Result<BlockInfo> {
    block_of(pool::entry_at(ptr), ptr).map(|(_, info)| info)
}

/// [`block_at`] given the registry's entry for `ptr` (so that a caller that goes on to free
/// the block looks it up once).
pub(super) fn block_of(entry: Option<pool::Entry>, ptr: usize) -> Result<(pool::Entry, BlockInfo)> {
    let Some(entry) = entry else {
        return Err(Error::not_ours(format!(
            "{ptr:#x} was not allocated by ump-alloc"
        )));
    };
    match entry.lookup(ptr) {
        Some(info) if info.base == ptr => Ok((entry, info)),
        Some(info) => Err(Error::not_ours(format!(
            "{ptr:#x} points inside the block at {:#x}, not at its start",
            info.base
        ))),
        None => Err(Error::double_free(format!(
            "{ptr:#x} is not a live block (already freed?)"
        ))),
    }
}

/// The error for a second free of a block whose first free waits for other streams.
#[cold]
pub(super) fn deferred_twice(ptr: usize) -> Error {
    Error::double_free(format!(
        "double free of {ptr:#x} (freed already, waiting for the streams it was recorded on)"
    ))
}

/// Give cached memory of every pool back to the OS and the driver, whichever thread cached
/// it. Returns the bytes given back.
pub fn trim() -> usize {
    get().map_or(0, |a| {
        a.host.trim() + a.device_groups().iter().map(|g| g.trim()).sum::<usize>()
    })
}
