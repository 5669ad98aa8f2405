//! The driver's own allocations: CUDA managed memory and plain device memory.

use super::resource::{Backing, Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::cuda;
use crate::registry::GRANULE;

/// Obtain `size` granule-aligned bytes from a driver allocator that aligns as it likes: ask for
/// exactly `size` first (large driver allocations come 2 MiB-aligned), and only when that is
/// not granule-aligned, ask again for `size + GRANULE` and align inside it.
fn aligned_driver_chunk(
    size: usize,
    alloc: impl Fn(usize) -> Result<usize>,
    free: impl Fn(usize),
) -> Result<Chunk> {
    let raw = alloc(size)?;
    if raw % GRANULE == 0 {
        return Ok(Chunk::mapped(raw, size, size));
    }
    free(raw);
    let raw_size = size + GRANULE;
    let raw = alloc(raw_size)?;
    Ok(Chunk {
        base: raw.next_multiple_of(GRANULE),
        size,
        raw,
        raw_size,
        advised: false,
    })
}

/// CUDA managed memory (mode `managed`). Device pools advise their chunks to prefer the
/// device and prefetch them there once, so kernels start at full speed; the host pool leaves
/// placement to the driver's fault-driven migration.
///
/// With a headroom (RMM's SamHeadroomMemoryResource), a device chunk prefers the device only
/// up to the device's free memory minus the headroom; the rest of it prefers host memory and
/// is mapped for the device, so kernels reach it over the bus and the headroom stays free.
///
/// Without a headroom, a device chunk larger than the device's free memory is refused as out
/// of memory unless `oversubscribe` (`UMP_ALLOC_OVERSUBSCRIBE`): the driver would page it,
/// and asking a GPU for far more managed memory than it has can thrash or hang it. A refusal
/// lets the pool give back what it caches and try again, and then PyTorch empty its cache and
/// raise `torch.OutOfMemoryError`, as with device memory.
pub struct ManagedBacking {
    device: i32,
    headroom: usize,
    oversubscribe: bool,
}

impl ManagedBacking {
    pub fn new(device: i32, headroom: usize, oversubscribe: bool) -> Self {
        ManagedBacking {
            device,
            headroom,
            oversubscribe,
        }
    }

    /// Bytes at the front of a new chunk of `size` bytes that may live on the device.
    fn device_portion(&self, size: usize) -> usize {
        if self.headroom == 0 {
            return size;
        }
        let free = cuda::mem_info(self.device).map_or(0, |(free, _)| free);
        let room = free.saturating_sub(self.headroom);
        if room >= size {
            size
        } else {
            room & !(HEADROOM_ALIGN - 1)
        }
    }
}

/// Refuse a managed chunk of `size` bytes for device `dev` that has `free` bytes free.
fn fits_device(size: usize, free: usize, dev: i32) -> Result<()> {
    if size <= free {
        return Ok(());
    }
    Err(Error::oom(format!(
        "device {dev} has {} MiB free, {} MiB of managed memory asked: more would oversubscribe \
         the GPU (UMP_ALLOC_OVERSUBSCRIBE=1 allows it; the driver then pages to the host)",
        free >> 20,
        size.div_ceil(1 << 20)
    )))
}

/// Granularity of the device/host split of a chunk under a headroom (a large page).
const HEADROOM_ALIGN: usize = 2 << 20;

impl Backing for ManagedBacking {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_MANAGED
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        let dev = self.device;
        if dev >= 0 && self.headroom == 0 && !self.oversubscribe {
            let (free, _) = cuda::mem_info(dev)?;
            fits_device(size, free, dev)?;
        }
        let chunk = aligned_driver_chunk(
            size,
            |n| cuda::alloc_managed(n, dev),
            |p| {
                // SAFETY: just allocated above and never handed out.
                let _ = unsafe { cuda::free(p, dev) };
            },
        )?;
        if dev >= 0 {
            // Placement is advice: failures leave correct (if slower) memory.
            let on_dev = self.device_portion(chunk.raw_size);
            let _ = cuda::advise_accessed_by(chunk.raw, chunk.raw_size, dev);
            if on_dev > 0 {
                let _ = cuda::advise_preferred(chunk.raw, on_dev, dev);
                let _ = cuda::prefetch(chunk.raw, on_dev, dev, 0, dev);
            }
            if on_dev < chunk.raw_size {
                let _ = cuda::advise_preferred(chunk.raw + on_dev, chunk.raw_size - on_dev, -1);
            }
        }
        Ok(chunk)
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        // SAFETY: forwarded from the caller's contract.
        let _ = unsafe { cuda::free(chunk.raw, self.device) };
    }
}

/// Plain device memory (mode `device`, GPU side): the "UMP off" baseline.
pub struct DeviceBacking {
    device: i32,
}

impl DeviceBacking {
    pub fn new(device: i32) -> Self {
        DeviceBacking { device }
    }
}

impl Backing for DeviceBacking {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_DEVICE
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        let dev = self.device;
        aligned_driver_chunk(
            size,
            |n| cuda::alloc_device(n, dev),
            |p| {
                // SAFETY: just allocated above and never handed out.
                let _ = unsafe { cuda::free(p, dev) };
            },
        )
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        // SAFETY: forwarded from the caller's contract.
        let _ = unsafe { cuda::free(chunk.raw, self.device) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_chunks_past_free_device_memory_are_out_of_memory() {
        assert!(fits_device(64 << 20, 64 << 20, 0).is_ok());
        let e = fits_device((64 << 20) + 1, 64 << 20, 1).unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_OOM);
        assert!(
            e.msg.contains("device 1")
                && e.msg.contains("64 MiB free")
                && e.msg.contains("UMP_ALLOC_OVERSUBSCRIBE=1"),
            "{}",
            e.msg
        );
    }
}
