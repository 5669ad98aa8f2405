//! Stream-synchronised access: what makes a view of GPU-written memory safe to read on the
//! host (and host writes visible to the next kernel) without a copy. Policy only; the driver
//! calls are in `prim::cuda`.

use crate::allocator;
use crate::backing::Kind;
use crate::error::{Error, Result};
use crate::pointer::region;
use crate::pool;
use crate::prim::cuda;
use crate::transfer::{self, Direction, Move};

/// Make `[ptr, ptr+size)` safe for the host to read and write: wait for the work queued on
/// `stream` (0: the legacy default stream). What happens to managed pages is the transfer
/// plan's [`transfer::Plan::view_move`] for a reader that touches `touch` of the range (1: all
/// of it): nothing below `UMP_ALLOC_PREFETCH_MIN` or for a sparse reader (the pages it touches
/// fault over); from [`transfer::BACKGROUND_MIN`] on, a migration in the background after the
/// wait, while the caller reads (pages not moved yet fault in); in between, a prefetch in
/// `stream`'s order before the wait. Managed blocks of ours from `UMP_ALLOC_PREFETCH_MIN` are
/// then known to be away from their device (see `pool::mark_away`).
pub fn host_access(ptr: usize, size: usize, stream: usize, touch: f64) -> Result<()> {
    transfer::check_touch(touch)?;
    if ptr == 0 && size > 0 {
        return Err(Error::new(
            crate::error::Status::UMP_ERR_NULL,
            "ptr is NULL",
        ));
    }
    let r = if size == 0 {
        None
    } else {
        Some(region(ptr, size)?)
    };
    if let Some(r) = r
        && !r.kind.host_accessible()
    {
        return Err(Error::invalid(format!(
            "{ptr:#x} is device memory that the host cannot read; copy it instead"
        )));
    }
    if !cuda::available() {
        return Ok(());
    }
    // A transfer call: the process uses a GPU (NumPy's memory is pinned from now on).
    allocator::use_gpu(cuda::current_device());
    let dev = r.map_or(0, |r| r.device.max(0));
    let prefetch_min = transfer::prefetch_min();
    let facts = transfer::facts_of(r.as_ref(), size, Direction::ToHost, dev, touch);
    let mv = transfer::decide(&facts, prefetch_min).view_move;
    if r.is_some_and(|r| r.managed) && size >= prefetch_min {
        pool::mark_away(ptr, size);
    }
    match mv {
        Move::None => cuda::stream_synchronize(stream, dev),
        Move::Background => {
            cuda::stream_synchronize(stream, dev)?;
            if crate::migrate::start(dev, ptr, size) {
                return Ok(());
            }
            prefetch_to_host(ptr, size, stream, dev)
        }
        Move::Prefetch => prefetch_to_host(ptr, size, stream, dev),
    }
}

/// Prefetch to the host in `stream`'s order, then wait for the stream. Advice: if the driver
/// lacks prefetch, faults still migrate the pages.
fn prefetch_to_host(ptr: usize, size: usize, stream: usize, dev: i32) -> Result<()> {
    cuda::prefetch(ptr, size, -1, stream, dev)?;
    cuda::stream_synchronize(stream, dev)
}

/// Make `[ptr, ptr+size)` ready for kernels on `device` queued on `stream`, in stream order
/// and without waiting on the host: managed memory is prefetched to the device, unless the
/// kernels touch little of it (`touch`, as the transfer plan's
/// [`transfer::Plan::view_move`] says: the pages they touch then fault over).
pub fn device_access(
    ptr: usize,
    size: usize,
    device: i32,
    stream: usize,
    touch: f64,
) -> Result<()> {
    transfer::check_touch(touch)?;
    if ptr == 0 && size > 0 {
        return Err(Error::new(
            crate::error::Status::UMP_ERR_NULL,
            "ptr is NULL",
        ));
    }
    if !cuda::available() {
        return Err(Error::unsupported("no GPU: device access is not possible"));
    }
    allocator::check_device(device)?;
    // A transfer call: the process uses a GPU, and NumPy's memory is pinned (so that this
    // range, if it is NumPy's, is reachable) before the range is classified.
    allocator::use_gpu(Some(device));
    if size == 0 {
        return Ok(());
    }
    let r = region(ptr, size)?;
    let reachable = match r.kind {
        Kind::UMP_KIND_HOST | Kind::UMP_KIND_SYSTEM | Kind::UMP_KIND_FOREIGN_HOST => {
            let caps = allocator::caps();
            caps.devices
                .iter()
                .any(|d| d.ordinal == device && d.pageable_memory_access)
        }
        _ => true,
    };
    if !reachable {
        return Err(Error::invalid(format!(
            "{ptr:#x} is {} memory that device {device} cannot reach on this machine (no HMM/ATS); copy it instead",
            r.kind.name()
        )));
    }
    if r.managed {
        // A background migration to the host over the range would undo the prefetch (and
        // moves pages the device now uses).
        crate::migrate::quiesce(ptr, ptr + size);
        let facts = transfer::facts_of(Some(&r), size, Direction::ToDevice, device, touch);
        if transfer::decide(&facts, transfer::prefetch_min()).view_move == Move::Prefetch {
            cuda::prefetch(ptr, size, device, stream, device)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    #[test]
    fn host_access_validates_ranges() {
        let p = crate::allocator::malloc(10_000).unwrap();
        assert!(host_access(p, 10_000, 0, 1.0).is_ok());
        assert!(host_access(p + 100, 500, 0, 0.01).is_ok());
        let e = host_access(p, 1 << 30, 0, 1.0).unwrap_err();
        assert!(e.msg.contains("past the end"), "{}", e.msg);
        assert_eq!(
            host_access(0, 8, 0, 1.0).unwrap_err().status,
            Status::UMP_ERR_NULL
        );
        assert!(host_access(0, 0, 0, 1.0).is_ok());
        assert!(host_access(usize::MAX - 4, 100, 0, 1.0).is_err());
        crate::allocator::free(p).unwrap();
    }

    #[test]
    fn foreign_host_memory_is_host_accessible() {
        let v = vec![1u8; 4096];
        assert!(host_access(v.as_ptr() as usize, v.len(), 0, 1.0).is_ok());
    }

    #[test]
    fn device_access_needs_a_gpu() {
        if cuda::available() {
            return;
        }
        let p = crate::allocator::malloc(100).unwrap();
        let e = device_access(p, 100, 0, 0, 1.0).unwrap_err();
        assert_eq!(e.status, Status::UMP_ERR_UNSUPPORTED);
        crate::allocator::free(p).unwrap();
    }
}
