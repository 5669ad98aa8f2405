//! Stream-synchronised access: what makes a view of GPU-written memory safe to read on the
//! host (and host writes visible to the next kernel) without a copy. Policy only; the driver
//! calls are in `prim::cuda`.

use crate::allocator;
use crate::backing::Kind;
use crate::error::{Error, Result};
use crate::pool;
use crate::prim::cuda;

/// What the access rules need to know about a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub kind: Kind,
    /// Device the memory belongs to (-1: host).
    pub device: i32,
    /// Managed memory (ours or foreign): it migrates, so prefetching pays.
    pub managed: bool,
}

/// Classify `[ptr, ptr+size)`. Our blocks must contain the whole range.
pub fn region(ptr: usize, size: usize) -> Result<Region> {
    let end = ptr
        .checked_add(size)
        .ok_or_else(|| Error::invalid(format!("range {ptr:#x} + {size} overflows")))?;
    if let Some(b) = pool::lookup(ptr) {
        if end > b.base + b.capacity {
            return Err(Error::invalid(format!(
                "range {ptr:#x} + {size} runs past the end of its block ({:#x} + {})",
                b.base, b.capacity
            )));
        }
        let kind = b.pool.kind();
        return Ok(Region {
            kind,
            device: b.pool.device(),
            managed: kind == Kind::UMP_KIND_MANAGED,
        });
    }
    if let Some(pi) = cuda::pointer_info(ptr) {
        let host = pi.is_managed || pi.memory_type == cuda::CU_MEMORYTYPE_HOST;
        let kind = if host {
            Kind::UMP_KIND_FOREIGN_CUDA
        } else {
            Kind::UMP_KIND_DEVICE
        };
        return Ok(Region {
            kind,
            device: pi.device,
            managed: pi.is_managed,
        });
    }
    Ok(Region {
        kind: Kind::UMP_KIND_FOREIGN_HOST,
        device: -1,
        managed: false,
    })
}

fn prefetch_min() -> usize {
    allocator::env_config().map_or(crate::config::DEFAULT_PREFETCH_MIN, |c| c.prefetch_min)
}

/// Managed ranges from this size migrate to the host in the background (`migrate`); smaller
/// ones are prefetched before `host_access` returns.
const BACKGROUND_MIN: usize = 8 << 20;

/// Make `[ptr, ptr+size)` safe for the host to read and write: wait for the work queued on
/// `stream` (0: the legacy default stream). Managed ranges from `UMP_ALLOC_PREFETCH_MIN` are
/// moved to the host (fault-driven host reads run at a fraction of the prefetch bandwidth):
/// from [`BACKGROUND_MIN`] on, after the wait, in the background while the caller reads (pages
/// not moved yet fault in); below it, by a prefetch in `stream`'s order before the wait. Our
/// blocks are then known to be away from their device (see `pool::mark_away`).
pub fn host_access(ptr: usize, size: usize, stream: usize) -> Result<()> {
    if ptr == 0 && size > 0 {
        return Err(Error::new(
            crate::error::Status::UMP_ERR_NULL,
            "ptr is NULL",
        ));
    }
    let r = if size == 0 {
        Region {
            kind: Kind::UMP_KIND_FOREIGN_HOST,
            device: -1,
            managed: false,
        }
    } else {
        region(ptr, size)?
    };
    if !r.kind.host_accessible() {
        return Err(Error::invalid(format!(
            "{ptr:#x} is device memory that the host cannot read; copy it instead"
        )));
    }
    if !cuda::available() {
        return Ok(());
    }
    let dev = if r.device >= 0 { r.device } else { 0 };
    if !r.managed || size < prefetch_min() {
        return cuda::stream_synchronize(stream, dev);
    }
    pool::mark_away(ptr, size);
    if size >= BACKGROUND_MIN {
        cuda::stream_synchronize(stream, dev)?;
        if crate::migrate::start(dev, ptr, size) {
            return Ok(());
        }
    }
    // Advice: if the driver lacks prefetch, faults still migrate the pages.
    cuda::prefetch(ptr, size, -1, stream, dev)?;
    cuda::stream_synchronize(stream, dev)
}

/// Make `[ptr, ptr+size)` ready for kernels on `device` queued on `stream`, in stream order
/// and without waiting on the host: managed memory is prefetched to the device.
pub fn device_access(ptr: usize, size: usize, device: i32, stream: usize) -> Result<()> {
    if ptr == 0 && size > 0 {
        return Err(Error::new(
            crate::error::Status::UMP_ERR_NULL,
            "ptr is NULL",
        ));
    }
    if !cuda::available() {
        return Err(Error::unsupported("no GPU: device access is not possible"));
    }
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
        // A background migration to the host over the range would undo the prefetch.
        crate::migrate::quiesce(ptr, ptr + size);
        cuda::prefetch(ptr, size, device, stream, device)?;
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
        assert!(host_access(p, 10_000, 0).is_ok());
        assert!(host_access(p + 100, 500, 0).is_ok());
        let e = host_access(p, 1 << 30, 0).unwrap_err();
        assert!(e.msg.contains("past the end"), "{}", e.msg);
        assert_eq!(
            host_access(0, 8, 0).unwrap_err().status,
            Status::UMP_ERR_NULL
        );
        assert!(host_access(0, 0, 0).is_ok());
        assert!(host_access(usize::MAX - 4, 100, 0).is_err());
        crate::allocator::free(p).unwrap();
    }

    #[test]
    fn foreign_host_memory_is_host_accessible() {
        let v = vec![1u8; 4096];
        assert!(host_access(v.as_ptr() as usize, v.len(), 0).is_ok());
    }

    #[test]
    fn device_access_needs_a_gpu() {
        if cuda::available() {
            return;
        }
        let p = crate::allocator::malloc(100).unwrap();
        let e = device_access(p, 100, 0, 0).unwrap_err();
        assert_eq!(e.status, Status::UMP_ERR_UNSUPPORTED);
        crate::allocator::free(p).unwrap();
    }
}
